"""eval's claim on its ``--out``, from the end of its checks until the driver locks the run.

Without it, the run's lock was first taken by the driver, after Ray's start (about 10 s): a
second eval on the same directory went through its own Ray start before being refused, and
``ctl`` meanwhile said "no live run". The claim is the run's own lock (``RunLock``), taken
before Ray; it is handed over just before the driver opens the run (a process cannot hold two
``flock``s on one file, and the driver takes its own), so another eval can only slip into
that hand-over, in which case the driver's lock still refuses it. A directory the claim made
for a run that never started (Ray failed, Ctrl-C during warm-up) is removed again.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .._errors import CorruptRun, RunInUse, UsageError
from .._record.manifest import RunLock
from .._record.run_layout import LOCK, RunLayout


class Claim:
    """``out`` claimed for one eval: ``take`` before Ray, ``hand_over`` to the driver, ``close`` at exit."""

    def __init__(self, out: str) -> None:
        self.out = Path(os.path.normpath(out))
        top = self.out
        while not os.path.lexists(top.parent) and top.parent != top:
            top = top.parent
        self._made = top if not os.path.lexists(self.out) else None  # the highest directory made here
        self._lock = RunLock(self.out)

    def take(self) -> None:
        """Raises ``UsageError``: another process writes or starts a run there."""
        try:
            RunLayout.of(self.out).open(create=True).close()
            self._lock.acquire()
        except (RunInUse, CorruptRun) as e:
            self.close()
            raise UsageError(str(e)) from None

    def hand_over(self) -> None:
        """Release the lock for the driver, which takes it at once."""
        self._lock.release()

    def close(self) -> None:
        """Release the lock; remove what ``take`` made if no run was written in it."""
        self._lock.release()
        if self._made is None or RunLayout.of(self.out).holds_run():
            return
        probe = RunLock(self.out)  # another eval may hold it by now: its lock file stays
        try:
            probe.acquire()
        except (RunInUse, CorruptRun, OSError):
            return
        try:
            with contextlib.suppress(OSError):
                if os.listdir(self.out) == [LOCK]:
                    os.unlink(self.out / LOCK)
        finally:
            probe.release()
        here = self.out
        while True:
            try:
                os.rmdir(here)  # only an empty directory: whatever else is there stays
            except OSError:
                return
            if here == self._made:
                return
            here = here.parent
