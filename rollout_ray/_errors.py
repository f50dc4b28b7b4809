"""The error model: three families, never mixed (docs/errors.md's table names each class).

* **Failures of a rollout**, recorded on its trace, never raised into the driver and never
  cancelling a sibling. ``RolloutError`` and its subclasses are named after the boundary
  that failed (task code, harness, tool servers, model provider, runtime); ``boundary()``
  converts foreign exceptions at each boundary, so the recorded type says *where* it broke.
  ``InfrastructureLost`` is the other kind: the rollout's host or services went away, so its
  outcome says nothing of the task and the driver runs it again. Inside a rollout a failure is
  recorded exactly once (``Trace.record_error``) and the trace ends with ``ok=False``; an
  ``ErrorRecord`` keeps the exception's class lineage, so ``record.is_a(cls)`` answers in any
  process.
* **Answers of the model boundary** to a harness: ``Refusal`` and its subclasses (the rollout
  stopped: 400, the session is concluded: 409, the caller is unknown: 401) are control flow
  for the harness, not failures; ``UpstreamError`` is a model client that broke (502).
* **Errors raised to the caller**, outside any rollout: Ray cannot be reached
  (``RayUnreachable``), a body is not the wire format (``WireError``), a table is not a
  trace table (``SchemaMismatch``), a run directory cannot be trusted (``CorruptRun``), is
  in use (``RunInUse``) or was made with other settings (``ResumeMismatch``), a command line,
  taskset or grid file is wrong (``UsageError``).

A lifecycle bug of the caller (a borrowed runtime its owner already stopped) raises a plain
``ValueError`` to the caller and is not recorded on any trace (B8, B20).
"""

from __future__ import annotations

import builtins
import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class RolloutError(Exception):
    """Base of every failure recorded on a trace.

    ``status_code`` is the HTTP status the interception answers with when this error is
    raised at the model boundary; ``None`` means 502.
    """

    status_code: int | None = None


class TaskError(RolloutError):
    """Task code failed: setup, a hook, finalize or scoring."""


class HarnessError(RolloutError):
    """The harness failed: setup, a segment (non-zero exit, agent timeout) or a metric."""


class ToolsetError(RolloutError):
    """Building, launching or calling a tool server failed."""


class SandboxError(RolloutError):
    """The runtime failed: it could not start, died under the harness, or an exec broke."""


class ToolInputError(ToolsetError):
    """A call named an unknown tool (``status_code`` 404) or passed bad arguments (400)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class ToolServerError(ToolsetError):
    """A tool server outside the process (an MCP server) failed: unreachable, died, hung past
    its bound, or answered something that is not MCP. ``server`` names it. The rollout fails
    with it (the task's tools are gone), unlike a tool's own error, which the model sees."""

    def __init__(self, server: str, message: str) -> None:
        super().__init__(f"tool server {server!r}: {message}")
        self.server, self.reason = server, message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # it crosses to the rollout's process
        return type(self), (self.server, self.reason)


class UserSimulatorError(RolloutError):
    """The task's simulated user failed (raised, hung past its bound, or its model failed): the
    simulator's fault, not the policy's, so a report can tell the two apart."""


class RuntimeStopped(SandboxError):
    """The named runtime was stopped (by its owner) or never existed on its host."""


class ProviderError(RolloutError):
    """The model provider answered with an error (relayed with its status) or not at all."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class OverlongPromptError(ProviderError):
    """The provider rejected the prompt as too long: a clean ``context_length`` stop."""


class UpstreamError(Exception):
    """The model client raised something other than a ``ProviderError`` (a client bug).

    Recorded on the model call but not stashed as the rollout's failure, and answered 502,
    as upstream does (Q12): the harness's own exit is what the trace records.
    """


class Refusal(Exception):
    """The model boundary declined a request; the harness should stop asking.

    Attributes:
        status_code: the HTTP status the proxy answers with.
        body: the exact response text (wire-visible; tests match on it).
    """

    status_code: int = 400

    def __init__(self, body: str) -> None:
        super().__init__(body)
        self.body = body


class TurnRefused(Refusal):
    """The rollout stopped; ``reason`` is its stop condition (``rollout stopped: <reason>``)."""

    status_code = 400

    def __init__(self, reason: str) -> None:
        super().__init__(f"rollout stopped: {reason}")
        self.reason = reason


class SessionConcluded(Refusal):
    """The session was released (the rollout closed); no late turn is ever committed."""

    status_code = 409

    def __init__(self) -> None:
        super().__init__("rollout concluded")


class Unauthorized(Refusal):
    """No session is registered under the presented secret."""

    status_code = 401

    def __init__(self) -> None:
        super().__init__("unknown or missing rollout secret")


class RolloutCancelled(RolloutError):
    """An operator cancelled the rollout (``rollout-ray ctl cancel``): a failure, retried as
    failures are (``retry_failed``)."""


class InfrastructureLost(Exception):
    """The rollout's host died (actor, worker or node): the rollout's outcome is unknown."""


class RayUnreachable(ConnectionError):
    """Nothing answers at a Ray cluster's address; ``address`` and ``reason`` say where and why."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"cannot reach Ray at {address} ({reason})")
        self.address, self.reason = address, reason


class WireError(ValueError):
    """A body that is not the OpenAI wire format (a request, or a model's answer), or a request
    body that could not be read. ``param`` names the bad field, ``status`` is the HTTP answer
    to a request (413 over the size limit, 408 too slow, else 400)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class SchemaMismatch(ValueError):
    """A table is not a trace table this code can read.

    ``column`` names the missing or mistyped column (``None`` for a version mismatch);
    ``expected`` and ``found`` describe what was wanted and what is there.
    """

    def __init__(self, message: str, *, column: str | None = None, expected: str = "", found: str = "") -> None:
        super().__init__(message)
        self.column = column
        self.expected = expected
        self.found = found


class CorruptRun(ValueError):
    """A file of a run directory cannot be trusted: a shard or the manifest is unreadable, or a
    shard holds rows of another run. ``path`` names the file; the message says what to do."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(message)
        self.path = path

    @classmethod
    def shard(cls, path: Path, reason: str) -> CorruptRun:
        """A final shard that cannot be read: the run needs repair."""
        return cls(
            path,
            f"shard {path} is truncated or corrupt ({reason}); the run needs repair: move the "
            "file aside and resume the run to redo its rollouts",
        )

    @classmethod
    def foreign(cls, path: Path, found: str, expected: str) -> CorruptRun:
        """A shard that holds rows of run ``found``, in the directory of run ``expected``."""
        return cls(
            path,
            f"shard {path} holds rows of run {found}, not of this run ({expected}); move it to the run it belongs to",
        )

    @classmethod
    def manifest(cls, path: Path, reason: str) -> CorruptRun:
        """A manifest that cannot be read."""
        return cls(path, f"{path} is not a readable run manifest ({reason}); restore it or start a new run")

    @classmethod
    def link(cls, path: Path) -> CorruptRun:
        """A symbolic link in a run directory, or one given as a run directory: never followed."""
        return cls(
            path,
            f"{path} is a symbolic link; a run directory and what it holds are never reached through "
            "one: remove the link, or pass the directory itself",
        )


CorruptShard = ForeignShard = CorruptManifest = CorruptRun
"""Former names of ``CorruptRun`` (no caller told them apart), kept importable."""


class RunInUse(RuntimeError):
    """Another process is writing the run directory (it holds its lock)."""

    def __init__(self, run_dir: str, holder: str) -> None:
        super().__init__(f"{run_dir} is in use by another process ({holder}); wait for it, or use another --out")
        self.run_dir = run_dir


class ResumeMismatch(ValueError):
    """A resume asked for other settings than the run was made with; ``settings`` names them,
    ``values`` holds each one's ``(stored, given)`` where the caller knows them (the message
    shows them)."""

    def __init__(
        self,
        run_dir: str,
        settings: list[str],
        message: str | None = None,
        *,
        values: dict[str, tuple[Any, Any]] | None = None,
    ) -> None:
        values = values or {}
        named = "; ".join(
            f"{s}: stored {_shown(values[s][0])}, given {_shown(values[s][1])}" if s in values else s for s in settings
        )
        super().__init__(
            message
            or f"{run_dir} was run with other settings ({named}); resume "
            "with the settings it was run with, or start a new run in another directory"
        )
        self.run_dir, self.settings, self.values = run_dir, settings, values

    @classmethod
    def taskset(cls, run_dir: str, position: int, stored: str, planned: str) -> ResumeMismatch:
        """The task at ``position`` is not the one the run stored there (group ids differ)."""
        return cls(
            run_dir,
            ["taskset"],
            f"{run_dir} was run with another taskset: task {position} is not the task stored at that "
            f"position (group {stored}, now {planned}); resume with the tasks it was run with, in "
            "the same order, or start a new run in another directory",
        )


def _shown(value: Any, limit: int = 60) -> str:
    """A setting's value in one short line: JSON, ``none`` for a missing one, cut at ``limit``."""
    text = "none" if value is None else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class UsageError(ValueError):
    """A command line, taskset or grid file that cannot be run (the CLI exits 2 with it).

    ``problems`` are ``(where, what)`` pairs when a file has several (``in_file``).
    """

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []

    @classmethod
    def in_file(cls, path: str, problems: list[tuple[str, str]]) -> UsageError:
        """The problems of file ``path`` (a grid), each ``(key path, message)``, one line each."""
        return cls(
            "\n".join(f"{path}: {where}: {what}" if where else f"{path}: {what}" for where, what in problems), problems
        )


def error_class(type_name: str) -> type[BaseException] | None:
    """The class behind an error recorded under ``type_name``, if this process knows it: one of
    this module's errors or a subclass of one (a taskset's own included, once imported), or a
    built-in exception. ``ErrorRecord.is_a`` asks it for a record that has no lineage."""
    found = _rollout_errors().get(type_name)
    if found is None:
        builtin = getattr(builtins, type_name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return builtin
        _rollout_errors.cache_clear()  # a subclass defined since the last look
        found = _rollout_errors().get(type_name)
    return found


@functools.cache
def _rollout_errors() -> dict[str, type[BaseException]]:
    ours = {
        name: v
        for name, v in globals().items()
        if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == __name__
    }
    found: dict[str, type[BaseException]] = dict(ours)  # a former name too (``CorruptShard``)
    pending: list[type[BaseException]] = list(ours.values())
    while pending:
        cls = pending.pop()
        found.setdefault(cls.__name__, cls)
        pending.extend(cls.__subclasses__())
    return found


@contextmanager
def boundary(error_cls: type[RolloutError], what: str) -> Iterator[None]:
    """Convert foreign exceptions raised inside the block into ``error_cls``.

    A ``RolloutError`` passes through unchanged (it already names its boundary), and so does
    ``InfrastructureLost`` (the rollout's services were lost under it: no boundary of the
    task or harness failed). A ``TimeoutError`` becomes ``error_cls("<what> timed out")``; any other ``Exception``
    becomes ``error_cls("<what> failed: <Type>: <message>")``, chained to the original.
    Cancellation (a ``BaseException``) is never converted.

    Args:
        error_cls: the boundary's error type.
        what: the phase, e.g. ``"task setup"`` or ``"harness 'chat'"``.
    """
    try:
        yield
    except (RolloutError, InfrastructureLost):
        raise
    except TimeoutError as e:
        raise error_cls(f"{what} timed out") from e
    except Exception as e:
        raise error_cls(f"{what} failed: {type(e).__name__}: {e}") from e


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def _reduce_without_init(self: BaseException) -> tuple[Any, ...]:
    return _rebuild, (type(self), self.args, self.__dict__)


# Errors cross processes (Ray pickles what an actor raises). The default pickling calls
# ``cls(*args)``, which breaks for every error whose ``__init__`` takes other arguments than
# it passes on (``Unauthorized()`` arrives as "Failed to deserialize exception"). Rebuild
# from ``args`` and attributes instead; subclasses (a taskset's own) inherit it.
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, BaseException) and _cls.__module__ == __name__:
        _cls.__reduce__ = _reduce_without_init  # type: ignore[method-assign,assignment]
del _cls
