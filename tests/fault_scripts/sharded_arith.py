"""``examples/arith.py`` writing a shard every 4 rows, 2 rollouts at a time (so a run killed
midway has shards on disk and rollouts still to do). A taskset file for ``rollout-ray eval``."""

from __future__ import annotations

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "taskset_arith_base", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "arith.py")
)
assert _spec is not None and _spec.loader is not None
_arith = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_arith)

tasks, harness = _arith.tasks, _arith.harness
config = _arith.config.model_copy(update={"rows_per_shard": 4, "max_in_flight": 2})
