#!/usr/bin/env python
"""Build the two images ``examples/images.py`` runs over, from Debian's packages.

Nothing is pulled from a registry: ``apt-get download`` fetches the packages (as the machine's
package sources allow), ``dpkg-deb -x`` unpacks them into a root filesystem, and busybox gives
the shell and coreutils. Both images hold Debian's minimal Python (the agent program runs on
it); one also holds ``jq``, a tool the other lacks:

* ``python.tar``: a rootfs tarball (busybox, Python);
* ``python-jq/``: an OCI image layout of two layers, that rootfs then ``jq`` and its libraries,
  with a config (``Env``, ``WorkingDir``) as a ``docker build`` would write.

    python examples/build_images.py                # into ~/.cache/rollout-ray/example-images
    python examples/build_images.py --out /images  # then: ROLLOUT_RAY_EXAMPLE_IMAGES=/images

Needs a Debian-based machine (``apt-get``, ``apt-cache``, ``dpkg-deb``). Kept as built: run it
again to rebuild (``--force``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

DEFAULT_OUT = Path(
    os.environ.get("ROLLOUT_RAY_EXAMPLE_IMAGES") or Path.home() / ".cache" / "rollout-ray" / "example-images"
)
JQ = ["jq", "libjq1", "libonig5"]


def run(command: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def python_packages() -> list[str]:
    depends = run(["apt-cache", "depends", "python3-minimal"])
    found = re.search(r"Depends: python(3\.\d+)-minimal", depends)
    if found is None:
        sys.exit(f"cannot tell which Python python3-minimal depends on: {depends[:200]}")
    v = found.group(1)
    return [
        "busybox-static",
        "libc6",
        "zlib1g",
        "libexpat1",
        "python3-minimal",
        f"python{v}-minimal",
        f"libpython{v}-minimal",
        f"libpython{v}-stdlib",
    ]


def extract(packages: list[str], rootfs: Path, work: Path) -> None:
    """``packages`` unpacked into ``rootfs``."""
    debs = work / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir()
    run(["apt-get", "download", *packages], cwd=debs)
    for deb in sorted(debs.iterdir()):
        run(["dpkg-deb", "-x", str(deb), str(rootfs)])


def link_applets(rootfs: Path) -> None:
    """busybox's applets in ``/bin`` where the packages put no program of that name."""
    busybox = rootfs / "bin" / "busybox"
    for applet in run([str(busybox), "--list"]).split():
        if not any(os.path.lexists(rootfs / d / applet) for d in ("bin", "usr/bin", "sbin", "usr/sbin")):
            (rootfs / "bin" / applet).symlink_to("busybox")


def tar_of(root: Path, skip: Path | None = None) -> bytes:
    """A tar of ``root``'s tree; with ``skip``, only what ``skip`` (an earlier tree) lacks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            name = path.relative_to(root)
            if skip is not None and os.path.lexists(skip / name):
                continue
            tar.add(path, arcname=str(name), recursive=False)
    return buf.getvalue()


def oci_layout(layers: list[bytes], dest: Path, config: dict[str, object]) -> None:
    """An OCI image layout of gzipped ``layers``, every blob named by its digest."""

    def add(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (dest / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (dest / "blobs" / "sha256" / digest).write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    zipped = [gzip.compress(layer, compresslevel=6, mtime=0) for layer in layers]
    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    image_config = json.dumps(
        {"architecture": "amd64", "os": "linux", "config": config, "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **add(image_config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **add(z)} for z in zipped],
        }
    ).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **add(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    (dest / "index.json").write_text(json.dumps(index))
    (dest / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="example-images-", dir=out) as tmp:
        work = Path(tmp)
        base, full = work / "base", work / "full"
        base.mkdir(mode=0o755)
        extract(python_packages(), base, work)
        link_applets(base)
        shutil.copytree(base, full, symlinks=True)
        extract(JQ, full, work)
        python = work / "python.tar"
        python.write_bytes(tar_of(base))
        oci = work / "python-jq"
        oci_layout(
            [tar_of(base), tar_of(full, skip=base)],
            oci,
            {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/work"},
        )
        for made in (python, oci):
            final = out / made.name
            if final.is_dir():
                shutil.rmtree(final)
            elif final.exists():
                final.unlink()
            made.rename(final)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where the images go (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="rebuild images already there")
    args = parser.parse_args()
    missing = [tool for tool in ("apt-get", "apt-cache", "dpkg-deb") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"building the images needs {', '.join(missing)} (a Debian-based machine)")
    if args.force or not (args.out / "python.tar").exists() or not (args.out / "python-jq" / "index.json").exists():
        build(args.out)
    print(f"images in {args.out}: python.tar (busybox, Python), python-jq/ (and jq)")


if __name__ == "__main__":
    main()
