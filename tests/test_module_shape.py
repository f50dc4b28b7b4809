"""The package's modules keep the shape docs/architecture.md promises: one name, one meaning
(no two modules share a basename, so "``host.py``" in a review, a traceback or a doc points at
one file), and one concept per module (none over 400 lines, CONVENTIONS §8.2)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "rollout_ray"
MAX_LINES = 400

# Modules over the limit whose split is under way on another branch ("split in progress
# (issue 34)"): none now, and the test fails when one listed here is no longer over.
SPLIT_IN_PROGRESS: dict[str, str] = {}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_two_modules_share_a_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        if path.name != "__init__.py":
            by_name[path.name].append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, (
        f"module names used twice: {shared}; rename one of each so the name says what it holds "
        "(e.g. _ray/ray_executor.py beside _hosting/executor.py)"
    )


def test_no_module_is_over_400_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in _modules()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    unexpected = {name: n for name, n in over.items() if name not in SPLIT_IN_PROGRESS}
    assert not unexpected, (
        f"modules over {MAX_LINES} lines: {unexpected}; split each along a seam (one concept per module)"
    )
    done = sorted(set(SPLIT_IN_PROGRESS) - set(over))
    assert not done, f"{done} are {MAX_LINES} lines or fewer now: remove them from SPLIT_IN_PROGRESS"
