"""Small structured-concurrency helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The first leaf exception of a (possibly nested) exception group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


@contextmanager
def unwrapped(kind: type[Exception]) -> Iterator[None]:
    """Raise a ``kind`` that task groups wrapped, when it is all they raise, as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if leaves and all(isinstance(e, kind) for e in leaves):
            raise leaves[0] from None
        raise


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def gather_all(awaitables: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run concurrently; on the first failure cancel the rest and raise that failure.

    Unlike ``asyncio.gather``, nothing keeps running after this returns or raises, and the
    error is the original exception rather than an ``ExceptionGroup``.
    """
    if not isinstance(awaitables, list):
        awaitables = list(awaitables)
    if len(awaitables) <= 1:  # nothing to run beside it: no task group (a task per call)
        return [await aw for aw in awaitables]

    async def run(aw: Awaitable[Any]) -> Any:
        return await aw

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(run(aw)) for aw in awaitables]
    except BaseExceptionGroup as group:
        error = first_error(group)
        if isinstance(error, asyncio.CancelledError):
            raise
        raise error from None
    return [t.result() for t in tasks]
