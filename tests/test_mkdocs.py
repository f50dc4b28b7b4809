"""The documentation site builds: ``mkdocs build --strict`` over mkdocs.yml, so a broken link,
a missing anchor, a page left out of the nav or an API reference that does not resolve fails
the suite (CI installs the ``docs`` extra with ``test``). docs/api.md names every public name
under its tier, where it lives."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

import rollout_ray

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mkdocs.yml"


def _build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor, on every build
    return subprocess.run(argv, cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.timeout(300)  # about 20 s on a loaded 2-core machine: griffe reads the whole package
def test_the_site_builds_strict_and_links_nothing_outside(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra (part of test) is not installed")
    result = _build(CONFIG, tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("Trace", "Driver", "RolloutActor", "read_run", "TRACE_SCHEMA"):
        assert f'id="{_anchor(name)}"' in api, f"the API reference has no entry for {name}"
    outside = {
        link
        for page in (tmp_path / "site").rglob("*.html")
        for link in re.findall(r'(?:href|src)="((?:https?:)?//[^"]*)"', page.read_text())
    }
    assert outside == set(), "the site's pages link outside the project"


def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _anchor(name: str) -> str:
    """mkdocstrings' heading id of a public name: the path it is read from (scripts/mkdocs_hooks.py)."""
    return str(_hooks().where(name))


def test_a_broken_link_fails_the_strict_build(tmp_path: pathlib.Path) -> None:
    """The build the test above runs is one that fails on what it should: here, a missing page."""
    pytest.importorskip("mkdocs", reason="the docs extra (part of test) is not installed")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    config = CONFIG.read_text().split("\nnav:")[0]
    config = re.sub(r"  - mkdocstrings:.*?(?=\n\S|\n# )", "", config, flags=re.S)  # no package to read here
    config = re.sub(r"\nhooks:\n(  - .*\n)+", "\n", config)  # nor its hooks
    (tmp_path / "mkdocs.yml").write_text(config + "\nnav:\n  - Home: index.md\n")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0 and "guide.md" in result.stderr, result.stderr[-2000:]


def test_the_config_names_nothing_outside_the_project() -> None:
    assert "http" not in CONFIG.read_text()  # no repo_url, theme links or remote assets


def test_the_nav_lists_every_docs_page() -> None:
    nav = CONFIG.read_text().split("\nnav:", 1)[1]
    listed = re.findall(r"([\w-]+\.md)\s*$", nav, re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(set(pages) - set(listed)) == [], "add these docs/ pages to mkdocs.yml's nav"
    assert sorted(set(listed) - set(pages)) == [], "mkdocs.yml's nav names pages docs/ does not have"
    assert len(listed) == len(set(listed))


def test_the_api_page_names_every_public_name_once_under_its_tier() -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    api, advanced = page.split("\n## Advanced use\n")
    tiers = {
        tier: re.findall(r"^::: rollout_ray\.(\w+)$", text, re.M)
        for tier, text in (("api", api), ("advanced", advanced))
    }
    listed = tiers["api"] + tiers["advanced"]
    missing = [name for name in rollout_ray.__all__ if name not in listed]
    extra = [name for name in listed if name not in rollout_ray.__all__]
    assert (missing, extra) == ([], []), (
        f"docs/api.md: add `::: rollout_ray.NAME` for {missing} under its tier and concept; remove {extra}"
    )
    assert tiers == {"api": list(rollout_ray._API), "advanced": list(rollout_ray._ADVANCED)}, (
        "docs/api.md lists rollout_ray._API and _ADVANCED in their order, each name under its tier"
    )
    assert len(re.findall(r"^:::", page, re.M)) == len(rollout_ray.__all__)


def test_the_hook_reads_a_lazy_name_from_its_module_and_leaves_the_others() -> None:
    hooks = _hooks()
    page = type("Page", (), {"file": type("File", (), {"src_uri": "api.md"})()})()
    done = hooks.on_page_markdown("::: rollout_ray.RayExecutor\n\n::: rollout_ray.Trace\n", page=page)
    module = rollout_ray._LAZY["RayExecutor"]
    assert done == f"::: rollout_ray{module}.RayExecutor\n\n::: rollout_ray.Trace\n"
    assert importlib.import_module(f"rollout_ray{module}").RayExecutor is rollout_ray.RayExecutor
