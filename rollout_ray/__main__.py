"""``python -m rollout_ray``: the ``rollout-ray`` command."""

import sys

from ._cli.main import main

if __name__ == "__main__":  # not when a spawned worker process imports it (rescore's pool)
    sys.exit(main())
