"""``python -m rollout_ray``: the ``rollout-ray`` command."""

import sys

from ._cli.main import main

sys.exit(main())
