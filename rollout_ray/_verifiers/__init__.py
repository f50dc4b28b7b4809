"""verifiers v1 environments on rollout_ray: an adapter from their ``Taskset`` / ``Task`` onto
ours, imported only when ``verifiers`` is installed (the ``verifiers`` extra).

``v1_taskset(ref)`` gives what ``rollout-ray eval`` runs (``tasks()`` and ``harness()``) from a
v1 taskset named by module path, file or installed id; ``verifiers_tasks(taskset)`` gives a
``Taskset`` object's tasks as ours, for ``Driver``. What cannot be mapped yet is refused
before anything runs, in one line naming it (``mapping.refusal``).
"""

from __future__ import annotations

from .v1_taskset import v1_taskset as v1_taskset
from .v1_taskset import verifiers_tasks as verifiers_tasks

__all__ = ["v1_taskset", "verifiers_tasks"]
