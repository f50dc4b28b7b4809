"""Issue 32 §2: runtime kinds are providers, and the registry is the only place that tells
them apart by name: a ``== "sandbox"`` (or ``in (...)``, ``case "podman":``, a dict keyed
by a kind) anywhere else in the package fails here, so a new provider is one module."""

from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import subprocess
import sys

import pytest

import rollout_ray
from rollout_ray._runtimes import providers
from rollout_ray._runtimes.host import RuntimeHost
from rollout_ray._runtimes.local import LocalRuntime

PACKAGE = pathlib.Path(rollout_ray.__file__).parent
REGISTRY = PACKAGE / "_runtimes" / "providers.py"

NOT_A_RUNTIME_KIND = {
    ("_cli/drive.py", 'kind == "local"'): "the executor's kind (this process, no Ray), not a runtime's",
    ("_runtimes/engine.py", 'os.path.basename(engine) == "podman"'): "the image engine whose store a sandbox "
    "reads an image from, not a runtime's kind",
}
"""Comparisons with a provider's name that are about something else, and what."""


def kind_branches(source: str, kinds: set[str]) -> list[str]:
    """The source of every comparison, ``case`` or dict key in ``source`` naming one of ``kinds``."""
    tree = ast.parse(source)
    found = []

    def names_kind(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in kinds
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_kind(e) for e in node.elts)
        return False

    for node in ast.walk(tree):
        if (
            (isinstance(node, ast.Compare) and any(names_kind(o) for o in (node.left, *node.comparators)))
            or (isinstance(node, ast.MatchValue) and names_kind(node.value))
            or (isinstance(node, ast.Dict) and any(k is not None and names_kind(k) for k in node.keys))
        ):
            found.append(node)
    return [ast.get_source_segment(source, n) or ast.dump(n) for n in found]


def test_no_module_but_the_registry_branches_on_a_runtime_kinds_name() -> None:
    kinds = set(providers.names()) - {providers.AUTO}  # "auto" is also a token-capture mode
    assert {"local", "sandbox"} <= kinds
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY:
            continue
        relative = str(path.relative_to(PACKAGE))
        problems += [
            f"{relative}: {segment}"
            for segment in kind_branches(path.read_text(), kinds)
            if (relative, segment) not in NOT_A_RUNTIME_KIND
        ]
    assert problems == [], (
        "ask the provider (rollout_ray._runtimes.providers: its capabilities, enforces, "
        f"host_url, make) instead of comparing a runtime kind's name: {problems}"
    )


def test_the_check_catches_each_form_of_kind_branch() -> None:
    source = (
        'if self.kind == "sandbox": pass\n'
        'ok = t in ("local", "x")\n'
        'match k:\n    case "sandbox": pass\n'
        'make = {"sandbox": 1}[k]\n'
        'other = mode == "vllm"\n'
    )
    assert kind_branches(source, {"local", "sandbox"}) == [
        'self.kind == "sandbox"',
        't in ("local", "x")',
        '"sandbox"',
        '{"sandbox": 1}',
    ]


class _TaggedRuntime(LocalRuntime):
    """A real local runtime under another kind's name: what a one-module provider adds."""

    type = "tagged"


def test_a_registered_provider_is_a_kind_every_caller_can_use(tmp_path: pathlib.Path) -> None:
    made: list[str] = []

    def make(name: str, image: str | None, r: providers.HostResources) -> _TaggedRuntime:
        made.append(name)
        return _TaggedRuntime(name, root=r.root, env=r.env, cgroup_parents=r.cgroup_parents, image=image)

    providers.register(providers.Provider("tagged", make, providers.Capabilities(), label="TaggedRuntime"))
    try:
        assert "tagged" in providers.names()
        assert providers.resolve("tagged") == ("tagged", None)

        async def main() -> str:
            host = RuntimeHost(str(tmp_path), kind="tagged")
            try:
                info = await host.create_started("one", owner="r1")
                assert info.type == "tagged"
                return (await host.exec("one", ["sh", "-c", "echo $((6 * 7))"])).stdout
            finally:
                await host.shutdown()

        assert asyncio.run(main()) == "42\n"
        assert made == ["one"]
    finally:
        providers._registry.pop("tagged")


def test_an_unknown_kind_names_the_kinds_there_are() -> None:
    with pytest.raises(ValueError, match=r"runtime must be one of \('auto', 'local', 'sandbox'.*got 'modal'"):
        providers.resolve("modal")
    with pytest.raises(ValueError, match="reserved"):
        providers.register(providers.Provider("auto", lambda *a: None, providers.Capabilities()))  # type: ignore[arg-type,return-value]


PLUGIN = """
from rollout_ray._runtimes.local import LocalRuntime
from rollout_ray._runtimes.provider import Capabilities, Provider

class ModalLike(LocalRuntime):
    type = "modal-like"

PROVIDER = Provider("modal-like", lambda name, image, r: ModalLike(name, root=r.root, env=r.env),
                    Capabilities(), unavailable=lambda: "set MODAL_LIKE_TOKEN")
"""


def test_an_installed_package_adds_a_provider_by_entry_point(tmp_path: pathlib.Path) -> None:
    """A provider outside this package is one module and an entry point: the CLI offers it
    and refuses it, with its own reason, where it cannot run."""
    (tmp_path / "modal_like.py").write_text(PLUGIN)
    info = tmp_path / "modal_like-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: modal-like\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{providers.ENTRY_POINT_GROUP}]\nmodal-like = modal_like:PROVIDER\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout_ray",
            "eval",
            "examples/arith.py",
            "--executor",
            "local",
            "--runtime",
            "modal-like",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=PACKAGE.parent,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--runtime modal-like: this machine cannot run the modal-like (set MODAL_LIKE_TOKEN)" in done.stderr, (
        done.stderr
    )
