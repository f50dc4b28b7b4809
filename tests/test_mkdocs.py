"""The documentation site builds: ``mkdocs build --strict`` over mkdocs.yml, so a broken link,
a missing anchor, a page left out of the nav or an API reference that does not resolve fails
the suite (CI installs the ``docs`` extra with ``test``). docs/api.md names every public name
under its tier, where it lives."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

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


def _anchor(name: str) -> str:
    """mkdocstrings' heading id of a public name: its path as docs/api.md names it."""
    return _targets()[name]


def _targets() -> dict[str, str]:
    page = (ROOT / "docs" / "api.md").read_text()
    return {t.rsplit(".", 1)[1]: t for t in re.findall(r"^::: ([\w.]+)$", page, re.M)}


def test_a_broken_link_fails_the_strict_build(tmp_path: pathlib.Path) -> None:
    """The build the test above runs is one that fails on what it should: here, a missing page."""
    pytest.importorskip("mkdocs", reason="the docs extra (part of test) is not installed")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    config = CONFIG.read_text().split("\nnav:")[0]
    config = re.sub(r"  - mkdocstrings:.*?(?=\n\S|\n# )", "", config, flags=re.S)  # no package to read here
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
        tier: [t.rsplit(".", 1)[1] for t in re.findall(r"^::: ([\w.]+)$", text, re.M)]
        for tier, text in (("api", api), ("advanced", advanced))
    }
    assert tiers == {"api": list(rollout_ray._API), "advanced": list(rollout_ray._ADVANCED)}
    lazy = {name: f"rollout_ray{module}.{name}" for name, module in rollout_ray._LAZY.items()}
    wrong = {name: t for name, t in _targets().items() if t != lazy.get(name, f"rollout_ray.{name}")}
    assert wrong == {}, (
        "docs/api.md: a lazy name is read from its module (rollout_ray._LAZY), the others from the package"
    )
