"""Run by Python at the start of each process whose ``PYTHONPATH`` holds this folder:
``test_walk`` puts it on the rollout actor's (Ray's ``env_vars``), so that the walk's
profiler (``walk_tracer``) runs there from its first call. A no-op elsewhere."""

import os
import sys

if os.environ.get("ROLLOUT_RAY_WALK_OUT"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import walk_tracer

    walk_tracer.install_in_worker()
