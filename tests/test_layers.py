"""The package's folders are its layers: imports point down only, only ``_ray`` imports ray,
and no module imports itself back through others.

Every import of every module is read from its AST (function-level imports and
``importlib.import_module`` included), so a lazy import cannot hide an upward dependency or a
cycle. ``LAYERS`` is the table of docs/layout.md.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import rollout_ray

PACKAGE = pathlib.Path(rollout_ray.__file__).parent
LAYOUT = (PACKAGE.parent / "docs" / "layout.md").read_text()

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
    "_cli": {
        "_verifiers",
        "_viewer",
        "_ray",
        "_driver",
        "_hosting",
        "_simulated",
        "_harnesses",
        "_serving",
        "_runtimes",
        "_core",
        "_record",
    },
    "_viewer": {"_driver", "_record"},
    "_verifiers": {"_harnesses", "_core", "_record"},
    "testing": {"_core", "_record"},
}
"""Each layer, and the layers it may import besides itself and ``_errors``."""

FACE = {"__init__", "__main__"}
"""The public face: it re-exports every layer. No layer imports it (``testing`` neither)."""

USER_CODE_LOADERS = {"rollout_ray._cli.taskset_loader", "rollout_ray._cli.grid"}
"""The modules that import the user's code by a name given at run time (a taskset, a harness
factory): the only places an ``import_module`` whose name is not a literal may stand."""

DYNAMIC = "<a name computed at run time>"
"""What ``imports_of`` reports for an ``import_module`` whose name the AST cannot read."""


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
    """Every module ``source`` imports, absolute, wherever in the file the import stands:
    ``import``, ``from ... import`` and calls of ``importlib.import_module`` or ``__import__``
    (``DYNAMIC`` when the name is not a literal)."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    loaders = _import_functions(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` / `from .pkg import mod` may name submodules: those are imported,
            # the package itself only when a name is taken from it (its re-exports)
            submodules = [f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}")]
            found += submodules if len(submodules) == len(node.names) else [target, *submodules]
        elif isinstance(node, ast.Call) and _calls_one_of(node.func, loaders) and node.args:
            found.append(_loaded_name(node, module, package))
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _import_functions(tree: ast.Module) -> set[str]:
    """The names that call ``importlib.import_module`` in this file (``from importlib import
    import_module as load`` included), and ``__import__``."""
    names = {"importlib.import_module", "__import__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib":
            names |= {alias.asname or alias.name for alias in node.names if alias.name == "import_module"}
        elif isinstance(node, ast.Import):
            names |= {
                f"{alias.asname}.import_module" for alias in node.names if alias.name == "importlib" and alias.asname
            }
    return names


def _calls_one_of(func: ast.expr, names: set[str]) -> bool:
    return ast.unparse(func) in names


def _loaded_name(call: ast.Call, module: str, package: str) -> str:
    """The absolute module ``import_module(name, anchor)`` loads, or ``DYNAMIC``."""
    name = call.args[0]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return DYNAMIC
    level = len(name.value) - len(name.value.lstrip("."))
    if not level:
        return name.value
    anchor = call.args[1] if len(call.args) > 1 else None
    known = {"__name__": module, "__package__": package}
    if isinstance(anchor, ast.Name) and anchor.id in known:
        base = known[anchor.id]
    elif isinstance(anchor, ast.Constant) and isinstance(anchor.value, str):
        base = anchor.value
    else:
        return DYNAMIC
    # as importlib resolves it: the anchor is a package, each dot past the first goes up one
    return ".".join([base.rsplit(".", level - 1)[0], name.value[level:]]).rstrip(".")


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that break the layering, as ``module -> target`` lines."""
    own = layer_of(module)
    allowed = LAYERS.get(own)
    problems = []
    for target in imports_of(source, module, is_package):
        if target == DYNAMIC:
            if own not in FACE and module not in USER_CODE_LOADERS:
                problems.append(f"{module} -> {target} (name the module literally, so this test can read it)")
            continue
        top = target.split(".")[0]
        if top == "ray" and own != "_ray":
            problems.append(f"{module} -> {target} (only _ray imports ray)")
        if top != "rollout_ray" or own in FACE:
            continue
        other = layer_of(target)
        if other in (own, "_errors"):
            continue
        if allowed is None or other not in allowed:
            what = "the package root, which re-exports every layer" if other == "__init__" else other
            problems.append(f"{module} -> {target} ({own} may not import {what})")
    return problems


def import_graph(sources: list[tuple[str, str, bool]]) -> dict[str, set[str]]:
    """``module -> the modules of sources it imports``, for ``(module, source, is_package)``
    triples; imports of anything outside them are left out."""
    modules = {module for module, _, _ in sources}
    return {
        module: set(imports_of(source, module, is_package)) & modules - {module}
        for module, source, is_package in sources
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one
    module, sorted (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def package_modules() -> list[tuple[pathlib.Path, str]]:
    return [(p, module_name(p)) for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_module_sits_in_a_known_layer() -> None:
    unknown = sorted({layer_of(m) for _, m in package_modules()} - set(LAYERS) - FACE)
    assert unknown == [], f"add these folders to LAYERS and to docs/layout.md's table: {unknown}"


def test_imports_point_down_only_and_only_the_ray_layer_imports_ray() -> None:
    problems = [
        v
        for path, module in package_modules()
        for v in violations(path.read_text(), module, path.name == "__init__.py")
    ]
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
def test_the_layout_table_names_every_layer_and_what_it_may_import(layer: str) -> None:
    section = LAYOUT
    row = re.search(rf"^\| `rollout_ray/{layer}/` \|(.*)\|(.*)\|$", section, re.M)
    assert row is not None, f"docs/layout.md's table has no row for rollout_ray/{layer}/"
    named = set(re.findall(r"`(_\w+|testing)`", row.group(2)))
    assert named == LAYERS[layer], f"docs/layout.md says {layer} may import {named}, the test says {LAYERS[layer]}"


def package_sources() -> list[tuple[str, str, bool]]:
    return [(module, path.read_text(), path.name == "__init__.py") for path, module in package_modules()]


def test_no_import_cycle_anywhere_in_the_package() -> None:
    assert cycles(import_graph(package_sources())) == []


def test_the_cycle_check_finds_a_cycle_closed_by_a_lazy_import() -> None:
    sources = {
        "rollout_ray._x.a": "from .b import f\n",
        "rollout_ray._x.b": "def g():\n    from .c import h\n",
        "rollout_ray._x.c": "import importlib\n\nA = importlib.import_module('rollout_ray._x.a')\n",
        "rollout_ray._x.d": "from .a import f\n",  # imports into the cycle, is not part of it
    }
    graph = import_graph([(module, source, False) for module, source in sources.items()])
    assert cycles(graph) == [["rollout_ray._x.a", "rollout_ray._x.b", "rollout_ray._x.c"]]
    assert cycles({**graph, "rollout_ray._x.c": set()}) == []


def test_testing_may_not_import_the_package_root() -> None:
    assert violations("from .. import ScriptedModel\n", "rollout_ray.testing._model") == [
        "rollout_ray.testing._model -> rollout_ray "
        "(testing may not import the package root, which re-exports every layer)",
    ]
    assert violations("def f():\n    import rollout_ray\n", "rollout_ray.testing._model") == [
        "rollout_ray.testing._model -> rollout_ray "
        "(testing may not import the package root, which re-exports every layer)",
    ]
    assert violations("from .. import _errors\nfrom .._core import model\n", "rollout_ray.testing._model") == []


def test_import_module_is_read_as_an_import() -> None:
    source = (
        "import importlib\n"
        "from importlib import import_module as load\n"
        "def f(name):\n"
        "    importlib.import_module('rollout_ray._driver.driver')\n"
        "    load('.._ray.head', __package__)\n"
        "    __import__('ray')\n"
        "    importlib.import_module(name)\n"
    )
    assert violations(source, "rollout_ray._core.rollout") == [
        "rollout_ray._core.rollout -> rollout_ray._driver.driver (_core may not import _driver)",
        "rollout_ray._core.rollout -> rollout_ray._ray.head (_core may not import _ray)",
        "rollout_ray._core.rollout -> ray (only _ray imports ray)",
        f"rollout_ray._core.rollout -> {DYNAMIC} (name the module literally, so this test can read it)",
    ]
    assert violations("import importlib\nM = importlib.import_module(ref)\n", "rollout_ray._cli.taskset_loader") == []
