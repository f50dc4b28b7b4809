"""What the benchmarks read from /proc: page size, clock ticks, one process's stat fields."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[bytes] | None:
    """Fields 3.. of /proc/PID/stat (after the command name), or None if it vanished."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()
