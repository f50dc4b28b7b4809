#!/usr/bin/env python
"""What does a task's image cost: its unpacking (once per node), its size, and a sandbox over it?

Images are built from Debian's packages as the tests build them (``tests/runtimes/image_rig``,
kept in ``~/.cache/rollout-ray-test-images``): ``busybox`` (busybox-static) and ``python``
(busybox plus Debian's minimal Python and its standard library). Each is given as a gzipped
rootfs tarball; ``python`` also as an OCI layout of two gzipped layers (the system, then
Python) and as a ``docker save`` archive (uncompressed layers), the formats a task may give.

* unpack: ``--unpacks`` times into an empty cache: ``ImageCache.lease`` cold (identify the
  image, read and check every layer, apply it, measure the tree), then warm (a cache hit);
* size: the archive's bytes, and the unpacked tree's on disk (what the cache's bound counts);
* start / exec ``true`` / stop: ``--cycles`` sandboxes, one at a time, each started, running
  ``true`` and stopped, over the host's system and over each image (its cache warm).

    python benchmarks/bench_images.py                     # 5 unpacks per image, 100 cycles per kind
    python benchmarks/bench_images.py --unpacks 2 --cycles 20
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "runtimes")]

import image_rig  # noqa: E402

from rollout_ray import SandboxRuntime  # noqa: E402
from rollout_ray._runtimes.image_cache import ImageCache  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def two_layers(root: Path) -> list[bytes]:
    """``root`` as two layers, as a build would make them: the system, then Python's library."""
    layers = []
    for wanted in (False, True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(root.rglob("*")):
                name = str(path.relative_to(root))
                if name.startswith("usr/lib/python3") == wanted:
                    tar.add(path, arcname=name, recursive=False)
        layers.append(buf.getvalue())
    return layers


def images(work: Path) -> dict[str, str]:
    """name -> path of each image the benchmark measures, packed now from the cached rootfs."""
    busybox, python = image_rig.busybox_rootfs(), image_rig.python_rootfs()
    (work / "oci").mkdir()
    made = {
        "busybox rootfs.tar.gz": image_rig.rootfs_tarball(busybox, work / "busybox.tar.gz"),
        "python rootfs.tar.gz": image_rig.rootfs_tarball(python, work / "python.tar.gz"),
        "python oci (2 layers, gz)": image_rig.oci_layout(two_layers(python), work / "oci"),
        "python docker save": image_rig.docker_archive(two_layers(python), work / "docker.tar"),
    }
    return {name: str(path) for name, path in made.items()}


def archive_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return os.path.getsize(path)


def bench_unpack(name: str, spec: str, work: Path, n: int) -> tuple[str, ...]:
    cold, warm = [], []
    size = 0
    for i in range(n):
        cache = ImageCache(str(work / f"cache-{name.split()[0]}-{i}"))
        t0 = time.perf_counter()
        lease = cache.lease(spec)
        cold.append(time.perf_counter() - t0)
        size = lease.bytes
        lease.release()
        t0 = time.perf_counter()
        cache.lease(spec).release()
        warm.append(time.perf_counter() - t0)
        subprocess.run(["rm", "-rf", cache.root], check=True)
    return (
        name,
        f"{archive_bytes(spec) / 2**20:.1f}",
        f"{size / 2**20:.1f}",
        f"{statistics.median(cold) * 1e3:.0f}",
        f"{max(cold) * 1e3:.0f}",
        f"{statistics.median(warm) * 1e3:.2f}",
    )


async def bench_cycles(name: str, spec: str | None, cache: ImageCache, root: str, n: int) -> tuple[str, ...]:
    starts, execs, stops = [], [], []
    for i in range(n + 3):  # 3 warm-up cycles: the first one unpacks
        rt = SandboxRuntime(root=root, image=spec, image_cache=cache)
        t0 = time.perf_counter()
        await rt.start()
        t1 = time.perf_counter()
        result = await rt.exec(["true"])
        assert result.exit_code == 0, result.stderr
        t2 = time.perf_counter()
        await rt.stop()
        t3 = time.perf_counter()
        if i >= 3:
            starts.append(t1 - t0)
            execs.append(t2 - t1)
            stops.append(t3 - t2)
    cells = [name]
    for values in (starts, execs, stops):
        cells += [f"{statistics.median(values) * 1e3:.2f}", f"{percentile(values, 0.99) * 1e3:.2f}"]
    return tuple(cells)


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    cells = [head, *rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cell, widths))) for cell in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def source_version() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + (" + working tree" if git("status", "--porcelain", "--untracked-files=no") else "")


async def main(args: argparse.Namespace) -> None:
    if (reason := image_rig.image_unavailable()) is not None:
        sys.exit(f"no image sandbox on this machine: {reason}")
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        work = Path(tmp)
        specs = images(work)
        unpacks = [bench_unpack(name, spec, work, args.unpacks) for name, spec in specs.items()]
        cache = ImageCache(str(work / "cache"))
        (work / "rt").mkdir()
        kinds: list[tuple[str, str | None]] = [
            ("host system", None),
            ("busybox image", specs["busybox rootfs.tar.gz"]),
            ("python image", specs["python rootfs.tar.gz"]),
        ]
        cycles = [await bench_cycles(name, spec, cache, str(work / "rt"), args.cycles) for name, spec in kinds]
    print(
        f"Images: {args.unpacks} unpacks per image, {args.cycles} sandbox cycles per kind, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, source {source_version()}"
    )
    print(table(("image", "archive MiB", "unpacked MiB", "unpack p50 ms", "unpack max ms", "cached lease ms"), unpacks))
    print()
    print(
        table(
            ("sandbox over", "start p50", "start p99", "exec true p50", "exec true p99", "stop p50", "stop p99"), cycles
        )
    )
    print("(milliseconds)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unpacks", type=int, default=5, help="cold unpacks per image, each into an empty cache")
    parser.add_argument("--cycles", type=int, default=100, help="sandboxes started, exec'd and stopped per kind")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
