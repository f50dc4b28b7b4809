"""The schedule ahead: a driver tells its executor which tasks come next (``Executor.prepare``),
so the nodes can start sandboxes over their images before those rollouts ask for one, and keep
a group's setup snapshot while its samples are still to come.

``lookahead`` wraps the driver's plan: it reads ``window`` rollouts ahead, and every quarter
window of admitted rollouts (and when the plan ends) calls ``prepare`` with the tasks of the
next ``window`` rollouts and of the last ``window`` admitted (which may still be starting). What the
executor does with it is its own business (``wanted``: the sandboxes per image and the
shareable setups it implies).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from .._core.task import Task

T = TypeVar("T")

Prepare = Callable[[Sequence[Task], Sequence[Task]], Awaitable[None]]
"""``prepare(upcoming, admitted)``: ``Executor.prepare``."""


async def lookahead(
    plan: Iterator[T], window: int, prepare: Prepare, tasks_of: Callable[[T], Sequence[Task]]
) -> AsyncGenerator[T, None]:
    """``plan``'s items (each with its rollouts' tasks, ``tasks_of``: a group's samples), with
    ``prepare`` told what comes next (see the module docstring); ``window`` counts rollouts.
    A ``window`` of 0: the items as they come, nothing read ahead, ``prepare`` never called."""
    if window <= 0:
        for item in plan:
            yield item
        return
    ahead: deque[tuple[T, Sequence[Task]]] = deque()
    admitted: deque[Task] = deque(maxlen=window)
    every = max(1, window // 4)
    since, done, coming = every, False, 0
    while True:
        while not done and coming < window:
            try:
                item = next(plan)
            except StopIteration:
                done = True
            else:
                ahead.append((item, tasks_of(item)))
                coming += len(ahead[-1][1])
        if since >= every or not ahead:
            await prepare([t for _, tasks in ahead for t in tasks][:window], list(admitted))
            since = 0
        if not ahead:
            return
        item, tasks = ahead.popleft()
        coming -= len(tasks)
        admitted.extend(tasks)
        since += len(tasks)
        yield item


def wanted(upcoming: Iterable[Task], admitted: Iterable[Task] = ()) -> tuple[dict[str, int], set[tuple[str, str]]]:
    """What a schedule asks of the nodes: how many of the upcoming rollouts run over each image
    (sandboxes to start ahead), and the shareable setups ``(image, setup key)`` of upcoming or
    admitted ones (snapshots to keep). A task naming its own runtime kind or resources never
    takes a warm sandbox (made of the host's kind, with its defaults): none is started for it."""
    upcoming = list(upcoming)
    images = Counter(
        t.data.image
        for t in upcoming
        if t.data.image is not None and t.data.runtime is None and t.data.resources is None
    )
    setups = {
        (t.data.image, key)
        for t in (*upcoming, *admitted)
        if t.data.image is not None and (key := t.setup_key) is not None
    }
    return dict(images), setups
