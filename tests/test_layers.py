"""The package's folders are its layers: imports point down only, and only ``_ray`` imports ray.

Every import of every module is read from its AST (function-level imports included), so a
lazy import cannot hide an upward dependency. ``LAYERS`` is the table of the README's
"Layout" section.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import rollout_ray

PACKAGE = pathlib.Path(rollout_ray.__file__).parent
README = (PACKAGE.parent / "README.md").read_text()

LAYERS: dict[str, set[str]] = {
    "_errors": set(),
    "_record": set(),
    "_core": {"_record"},
    "_serving": {"_core", "_record"},
    "_runtimes": {"_core", "_record"},
    "_harnesses": {"_core", "_record"},
    "_hosting": {"_serving", "_runtimes", "_harnesses", "_core", "_record"},
    "_ray": {"_hosting", "_serving", "_runtimes", "_core", "_record"},
    "_driver": {"_hosting", "_serving", "_runtimes", "_core", "_record"},
    "_simulated": set(),
    "_cli": {"_viewer", "_ray", "_driver", "_hosting", "_simulated", "_harnesses", "_serving", "_runtimes", "_core", "_record"},
    "_viewer": {"_driver", "_record"},
    "testing": {"_core", "_record"},
}
"""Each layer, and the layers it may import besides itself and ``_errors``."""

FACE = {"__init__", "__main__"}
"""The public face: it re-exports every layer."""


def layer_of(module: str) -> str:
    """``rollout_ray._core.session`` → ``_core``; ``rollout_ray`` → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: pathlib.Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[str]:
    """Every module ``source`` imports, absolute, wherever in the file the import stands."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            # `from . import x` / `from .pkg import mod` may name a submodule
            found += [f"{target}.{alias.name}" for alias in node.names
                      if (PACKAGE.parent / f"{target}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()]
    return found


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that break the layering, as ``module -> target`` lines."""
    own = layer_of(module)
    allowed = LAYERS.get(own)
    problems = []
    for target in imports_of(source, module, is_package):
        top = target.split(".")[0]
        if top == "ray" and own != "_ray":
            problems.append(f"{module} -> {target} (only _ray imports ray)")
        if top != "rollout_ray" or own in FACE:
            continue
        other = layer_of(target)
        if other in (own, "_errors") or other == "__init__" and own == "testing":
            continue
        if allowed is None or other not in allowed:
            problems.append(f"{module} -> {target} ({own} may not import {other})")
    return problems


def package_modules() -> list[tuple[pathlib.Path, str]]:
    return [(p, module_name(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_module_sits_in_a_known_layer() -> None:
    unknown = sorted({layer_of(m) for _, m in package_modules()} - set(LAYERS) - FACE)
    assert unknown == [], f"add these folders to LAYERS and to the README's Layout table: {unknown}"


def test_imports_point_down_only_and_only_the_ray_layer_imports_ray() -> None:
    problems = [v for path, module in package_modules()
                for v in violations(path.read_text(), module, path.name == "__init__.py")]
    assert problems == []


def test_the_check_reads_real_imports_and_catches_an_upward_one() -> None:
    session = PACKAGE / "_core" / "session.py"
    assert "rollout_ray._record.trace" in imports_of(session.read_text(), "rollout_ray._core.session", False)
    lazy_upward = "def f():\n    from .._driver.driver import Driver\n    import ray\n"
    assert violations(lazy_upward, "rollout_ray._core.rollout") == [
        "rollout_ray._core.rollout -> rollout_ray._driver.driver (_core may not import _driver)",
        "rollout_ray._core.rollout -> ray (only _ray imports ray)",
    ]


@pytest.mark.parametrize("layer", sorted(set(LAYERS) - {"_errors"}))
def test_the_readme_layout_table_names_every_layer_and_what_it_may_import(layer: str) -> None:
    section = README.split("## Layout", 1)[1]
    row = re.search(rf"^\| `rollout_ray/{layer}/` \|(.*)\|(.*)\|$", section, re.M)
    assert row is not None, f"README's Layout table has no row for rollout_ray/{layer}/"
    named = set(re.findall(r"`(_\w+|testing)`", row.group(2)))
    assert named == LAYERS[layer], f"README says {layer} may import {named}, the test says {LAYERS[layer]}"
