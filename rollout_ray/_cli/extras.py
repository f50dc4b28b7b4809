"""The command line's optional dependencies, the ``[cli]`` extra: matplotlib draws the plots of
``report``, ``sweep`` and ``view``, tqdm ``eval``'s live bar. Without them every command still
runs: no plot (one line says how to get it), progress as plain lines."""

from __future__ import annotations

import importlib.util

INSTALL = "pip install -e '.[cli]'"
NO_PLOT = f"none, matplotlib is not installed ({INSTALL} adds it)"
"""What a command prints where the path of its plot would be."""


def installed(name: str) -> bool:
    """Whether ``name`` can be imported; found, not imported (matplotlib takes ~0.3 s)."""
    return importlib.util.find_spec(name) is not None
