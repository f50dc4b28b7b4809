#!/usr/bin/env bash
# A three-node Ray cluster on this machine (head + two workers, token auth on).
#   cluster/local_cluster.sh start|stop|status|env|address [--dir DIR] [options]
# See cluster/local_cluster.py (this is a thin wrapper) and cluster/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/local_cluster.py" "$@"
