"""The images of the ``podman`` provider: a name in the node's store, or an archive loaded under
a tag of ours, and those tags removed when the hosts that used them shut down.

An image is a name in the node's Podman store (never pulled), or an absolute path to a
``docker save`` / ``podman save`` archive, an OCI archive or layout (``podman load``), or a
rootfs tarball (``podman import``), loaded once per node under a tag derived from the path and
its size and mtime (``localhost/rollout-ray/KEY``). A host that used a tag releases it at its
shutdown (``release``): when no other host of this process holds it, the tag goes, and with it
the image when the load made it (an image the store had before, under another name, keeps that
name). Podman refuses to remove an image a container uses — another process's runtimes keep
theirs (the lease), and a start that finds its tag gone since loads it again (``forget``).
A host killed before its shutdown leaves its tags (listed by ``podman images localhost/rollout-ray/*``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os

from .._errors import SandboxError
from .podman_cli import LOAD_TIMEOUT, podman

TAG_PREFIX = "localhost/rollout-ray/"
log = logging.getLogger("rollout_ray")

_loads: dict[str, asyncio.Future[tuple[str, bool]]] = {}
"""Tag -> its load: ``(tag, whether the load made the image)``; one per tag per process."""
_holders: dict[str, set[str]] = {}
"""Tag -> the hosts (tokens) of this process whose runtimes used it."""


async def image_ref(image: str, holder: str = "") -> str:
    """The Podman image ``image`` names (see the module doc), held for host ``holder``.

    Raises:
        SandboxError: no such name in the store, no such path, or nothing podman can load.
    """
    if not os.path.isabs(image):
        code, _, _err = await podman("image", "exists", image)
        if code != 0:
            raise SandboxError(
                f"image {image!r} is not in this node's podman store (it is never pulled): "
                f"podman pull or podman load it first, or give an absolute path to an archive"
            )
        return image
    tag = tag_of(image)
    _holders.setdefault(tag, set()).add(holder)
    if tag not in _loads:
        _loads[tag] = asyncio.ensure_future(_load(image, tag))
    try:
        return (await asyncio.shield(_loads[tag]))[0]
    except BaseException:
        if _loads[tag].done():
            _loads.pop(tag, None)  # a failed load is tried again by the next runtime
        raise


def tag_of(path: str) -> str:
    """The tag the archive at ``path`` is loaded under: a new one when it changes.

    Raises:
        SandboxError: no such path.
    """
    try:
        st = os.stat(path)
    except OSError as e:
        raise SandboxError(f"image {path!r}: {e.strerror}; give an existing archive or OCI layout path") from None
    key = hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:24]
    return f"{TAG_PREFIX}{key}"


def forget(tag: str) -> None:
    """Load ``tag`` again at its next use: it was removed from the store since (by another
    process's ``release``)."""
    _loads.pop(tag, None)


async def _load(path: str, tag: str) -> tuple[str, bool]:
    if (await podman("image", "exists", tag))[0] == 0:
        return tag, True  # loaded by another process of ours: the tag names an image we made
    code, out, _ = await podman("images", "-q", "--no-trunc")
    before = set(out.decode().split()) if code == 0 else set()
    is_layout = os.path.isdir(path)  # noqa: ASYNC240 - one stat of a local path
    if is_layout:
        code, out, err = await podman("pull", "-q", f"oci:{path}", timeout=LOAD_TIMEOUT)
    else:
        code, out, err = await podman("load", "-q", "-i", path, timeout=LOAD_TIMEOUT)
    loaded = out.decode().strip().rpartition(" ")[2] if code == 0 else ""
    if code != 0:  # not an image archive: a rootfs tarball
        code, out, err = await podman("import", "-q", path, timeout=LOAD_TIMEOUT)
        loaded = out.decode().strip()
    if code != 0 or not loaded:
        raise SandboxError(
            f"image {path!r}: podman can neither load nor import it ({err}); give a docker or "
            "OCI archive, an OCI layout, or a rootfs tarball"
        )
    code, out, _ = await podman("image", "inspect", "--format", "{{.Id}}", loaded)
    made = code != 0 or not ({out.decode().strip(), f"sha256:{out.decode().strip()}"} & before)
    code, _, err = await podman("tag", loaded, tag)
    if code != 0:
        raise SandboxError(f"image {path!r}: podman tag failed: {err}")
    return tag, made


async def release(holder: str) -> list[str]:
    """Remove the tags only ``holder`` of this process held (and the images their loads made),
    each unless a container uses it; returns the tags removed."""
    removed = []
    for tag in [t for t, holders in _holders.items() if holder in holders]:
        holders = _holders[tag]
        holders.discard(holder)
        if holders:
            continue
        del _holders[tag]
        load = _loads.pop(tag, None)
        if load is None or not load.done() or load.cancelled() or load.exception() is not None:
            continue
        if load.result()[1]:  # the load made the image: its other names are the archive's
            code, out, _ = await podman("image", "inspect", "--format", "{{json .RepoTags}}", tag)
            names = json.loads(out) if code == 0 else []
            for name in [n for n in names if not n.startswith(TAG_PREFIX)]:
                await podman("untag", tag, name)
            code, _, err = await podman("rmi", tag)  # the image goes with its last name
        else:  # the store had it before: only our name goes
            code, _, err = await podman("untag", tag, tag)
        if code == 0:
            removed.append(tag)
        else:  # in use by another process's container: its host removes it at its own shutdown
            log.debug("podman image %s kept: %s", tag, err)
    return removed
