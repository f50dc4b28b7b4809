"""Public fakes for testing tasks, harnesses and rollouts in-process, in milliseconds.

* ``ScriptedModel`` — a model that answers from a script: fixed replies, tool calls, usage,
  injected provider errors and delays.
* ``ScriptedHarness`` — an in-process agent loop that drives the rollout's session: it sends
  the conversation, runs requested tools, and repeats until the model answers without one.
* ``MemoryRuntime`` — a runtime with no processes and no files on disk, counting its starts
  and stops.
* ``run_virtual`` — runs a coroutine on an event loop whose clock jumps to the next timer, so
  timeouts and delays are exact and instant.

Example::

    model = ScriptedModel(["4"])
    trace = run_virtual(Rollout(task, ScriptedHarness(), model=model,
                                runtime_factory=MemoryRuntime).run())
"""

from ._harness import ScriptedHarness as ScriptedHarness
from ._model import Reply as Reply
from ._model import ScriptedModel as ScriptedModel
from ._runtime import MemoryRuntime as MemoryRuntime
from ._virtual_time import VirtualTimeLoop as VirtualTimeLoop
from ._virtual_time import run_virtual as run_virtual

__all__ = [
    "MemoryRuntime",
    "Reply",
    "ScriptedHarness",
    "ScriptedModel",
    "VirtualTimeLoop",
    "run_virtual",
]
