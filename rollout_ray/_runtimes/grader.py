"""The grader's files: what a task scores with and the agent must never see (tests, reference
solutions), put in a runtime only once the agent is gone (``Task.grader_files``).

In a sandbox they appear under ``GRADER_DIR`` (``/.grader``), a directory that is, in every
exec, a read-only bind of the runtime's own ``grader`` directory on the host (over the host
system: bwrap's fresh root; over an image: a mount point pinned before any program ran,
``image_layout.PINNED``). While the agent runs it is empty and read-only: the agent can list
it (nothing), read nothing, write nothing, and plant no link there or in its place. When the
agent's turn is over, the runtime kills every process it has left, then writes the files on
the host side into its ``grader`` directory (``write_grader_files``): the next exec, a fresh
one, sees them; nothing the agent wrote is among them or can replace them.

Once they are in, every exec is the grader's, and starts where the agent left nothing
(``grading_env``): in the grader's directory, with ``HOME`` there, Python told to put neither
the current directory nor the user's site-packages on its module path (``PYTHONSAFEPATH``,
``PYTHONNOUSERSITE``). So ``python3 -m pytest /.grader/tests`` imports no ``pytest.py``,
``sitecustomize.py`` or ``.pth`` file the agent left in its work directory or ``~/.local``,
and tools find no dotfile of the agent's (``~/.gitconfig``). The work directory is the
agent's output: data to check, read by absolute path, not code to import.

What the grader runs them with is otherwise the box's: over the host's system, its programs
and the virtual environment are read-only, the agent changed none; over a writable image, a
program or library the agent could write (a file of the image its user owns, a world-writable
directory) stays as the agent left it. A grader that must not trust the box's tools ships its
checker among its files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .files import components, make_dir_beneath, remove_tree, write_beneath


def grading_env(directory: str) -> dict[str, str]:
    """The environment of the grader's execs, whose files are in ``directory`` (as programs
    see it): nothing the agent wrote on Python's module path, no dotfile of its own."""
    return {"HOME": directory, "PYTHONSAFEPATH": "1", "PYTHONNOUSERSITE": "1"}


def grader_parts(name: str) -> list[str]:
    """The components of a grader file's name, relative to ``GRADER_DIR``.

    Raises:
        ValueError: the name is absolute, empty or climbs out with ``..``.
    """
    parts = components(name) if not os.path.isabs(name) else None
    if not parts:
        raise ValueError(
            f"grader file {name!r} must be a relative path under the grader directory (e.g. 'tests/test_fix.py')"
        )
    return parts


def write_grader_files(directory: str, files: Mapping[str, bytes | str], what: str) -> None:
    """Replace the contents of host directory ``directory`` with ``files`` (name -> content),
    directories 0755 and files 0644, never following a link."""
    checked = {name: grader_parts(name) for name in files}
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            remove_tree(path)
        else:
            os.unlink(path)
    for name, parts in checked.items():
        data = files[name]
        if len(parts) > 1:
            make_dir_beneath(directory, parts[:-1], 0o755, what)
        write_beneath(directory, parts, data.encode() if isinstance(data, str) else bytes(data), what)
        os.chmod(os.path.join(directory, *parts), 0o644)
