"""MkDocs hooks (mkdocs.yml ``hooks:``): docs/api.md names each public name as users import it,
``::: rollout_ray.RayExecutor``; the names the package loads lazily (the Ray layer, the driver,
the Arrow record: ``rollout_ray._LAZY``) are not in its namespace until first used, so the
reference reads them where ``_LAZY`` says they live. A module moved or renamed is followed here
without an edit to the page."""

from __future__ import annotations

import re
from typing import Any

import rollout_ray

DIRECTIVE = re.compile(r"^::: rollout_ray\.(\w+)$", re.M)


def where(name: str) -> str:
    """The dotted path mkdocstrings reads a public name from."""
    module = rollout_ray._LAZY.get(name)
    return f"rollout_ray{module}.{name}" if module else f"rollout_ray.{name}"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != "api.md":
        return markdown
    return DIRECTIVE.sub(lambda m: f"::: {where(m.group(1))}", markdown)
