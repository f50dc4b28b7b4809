"""A container engine's local store, where one is installed: look an image up, export it.

``podman`` first, then ``docker``: ``image inspect`` gives the image's ID (its cache key, so
an image unpacked before is not exported again) and ``save`` writes it as a ``docker save``
archive. An engine that is installed but cannot answer (docker's client without a daemon)
is named in the error with its own message.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from .._errors import SandboxError

ENGINES = ("podman", "docker")
LOOKUP_TIMEOUT = 60.0
EXPORT_TIMEOUT = 1800.0
_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def lookup(name: str) -> tuple[str, str]:
    """``(engine, image ID)`` of image ``name`` in the first local store that has it.

    Raises:
        SandboxError: no engine is installed, or none has the image (each one's reason).
    """
    failures = []
    for engine_name in ENGINES:
        engine = shutil.which(engine_name)
        if engine is None:
            continue
        try:
            done = subprocess.run(  # noqa: S603 - argv of the configured engine binary and an image name, no shell
                [engine, "image", "inspect", "--format", "{{.Id}}", name],
                capture_output=True,
                text=True,
                timeout=LOOKUP_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            failures.append(f"{engine_name}: no answer within {LOOKUP_TIMEOUT:g}s")
            continue
        found = done.stdout.strip()
        key = found if found.startswith("sha256:") else f"sha256:{found}"
        if done.returncode == 0 and _ID.match(key):
            return engine, key
        failures.append(f"{engine_name}: {_last_line(done.stderr or done.stdout)}")
    if not failures:
        raise SandboxError(
            f"image {name!r} is no file or directory, and no container engine (podman, docker) is "
            f"installed to look it up by name; give the path of an exported image (docker save)"
        )
    raise SandboxError(
        f"image {name!r} is no file or directory, and no container engine could look it up by "
        f"name: {'; '.join(failures)}"
    )


def export(engine: str, name: str, archive: str) -> None:
    """Write image ``name`` to ``archive`` as a ``docker save`` archive. Raises ``SandboxError``."""
    command = [engine, "save", "-o", archive, name]
    if os.path.basename(engine) == "podman":
        command[2:2] = ["--format", "docker-archive"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT)  # noqa: S603 - argv built above from the engine and image, no shell
    except subprocess.TimeoutExpired:
        raise SandboxError(f"image {name!r}: {engine} save took over {EXPORT_TIMEOUT:g}s") from None
    if done.returncode != 0:
        raise SandboxError(f"image {name!r}: {os.path.basename(engine)} save failed: {_last_line(done.stderr)}")
