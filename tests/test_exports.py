"""The public surface: every exported name resolves, and importing it never imports ray."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import rollout_ray
import rollout_ray.testing

PACKAGE = pathlib.Path(rollout_ray.__file__).parent


def test_every_name_in_all_is_importable() -> None:
    for module in (rollout_ray, rollout_ray.testing):
        assert len(module.__all__) == len(set(module.__all__))
        for name in module.__all__:
            assert getattr(module, name) is not None, name


def test_importing_the_package_does_not_import_ray() -> None:
    code = "import sys, rollout_ray, rollout_ray.testing; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_example_runs_one_complete_rollout() -> None:
    example = PACKAGE.parent / "examples" / "single_rollout.py"
    result = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, check=True)
    assert "ok=True stop=agent_completed reward=1.000" in result.stdout
    assert "rollout done: id=" in result.stdout


def test_the_namespace_holds_the_public_names_and_nothing_else_public() -> None:
    """``dir(rollout_ray)`` lists what the package offers (its lazy names too), never the
    helpers its ``__init__`` uses (``Any``, ``annotations``, ``importlib``, ``logging``)."""
    code = "import rollout_ray; print(' '.join(n for n in dir(rollout_ray) if not n.startswith('_')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    public = set(result.stdout.split())
    assert not {"Any", "annotations", "importlib", "logging"} & public
    assert public == set(rollout_ray.__all__)


def test_every_public_name_is_api_or_advanced_and_the_docs_table_says_which() -> None:
    """``_API`` (stable, documented) and ``_ADVANCED`` (building blocks that follow the
    internals) split ``__all__`` exactly, and docs/public-names.md lists each name under its tier."""
    api, advanced = set(rollout_ray._API), set(rollout_ray._ADVANCED)
    assert not api & advanced, f"in both tiers: {sorted(api & advanced)}"
    assert api | advanced == set(rollout_ray.__all__), (
        f"exported but in no tier (add it to _API or _ADVANCED): {sorted(set(rollout_ray.__all__) - api - advanced)}"
    )
    documented: dict[str, set[str]] = {"API": set(), "Advanced": set()}
    for line in (PACKAGE.parent / "docs" / "public-names.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in documented:
            documented[cells[0]] |= set(re.findall(r"`([^`]+)`", cells[2]))
    assert documented == {"API": api, "Advanced": advanced}, (
        "docs/public-names.md's table differs from the tiers in rollout_ray/__init__.py: "
        f"API {sorted(documented['API'] ^ api)}, Advanced {sorted(documented['Advanced'] ^ advanced)}"
    )
