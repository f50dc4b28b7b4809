"""Issue 23, done when: ``examples/images.py`` run as a user runs it — its images built from
Debian's packages by ``examples/build_images.py``, then ``rollout-ray eval`` on Ray (the test
session's, joined with ``--address``). Two images (one with ``jq``, the other without), the
agent program on the image's Python, one setup per group, scored against the grader's file."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from image_rig import FORMAT, IMAGE_REASON, ROOT, needs_image

from rollout_ray import decode_trace
from rollout_ray._record.store import read_run

REPO = Path(__file__).parents[2]
CLI = [sys.executable, "-m", "rollout_ray"]


def example_images() -> Path:
    """The example's images, built once per machine (as a user would, with its script)."""
    out = ROOT / f"example-images-v{FORMAT}"
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "build_images.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot build the example's images: {done.stderr.strip()[-300:]}")
    return out


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(600)
@needs_image
def test_the_images_example_runs_with_rollout_ray_eval_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    assert IMAGE_REASON is None
    images = example_images()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ROLLOUT_RAY_EXAMPLE_IMAGES"] = str(images)
    out = tmp_path / "run"
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        [*CLI, "eval", "examples/images.py", "--address", address, "--sim-ttft", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rollouts 16  ok 16  failed 0  groups 4" in done.stdout, done.stdout

    table = read_run(out, ["task_type", "group_id", "reward", "metrics", "trace"])
    assert table.column("reward").to_pylist() == [1.0] * 16  # graded by the file the agent never saw
    snapshots: dict[str, list[str | None]] = collections.defaultdict(list)
    images_of: dict[str, set[str | None]] = collections.defaultdict(set)
    for row in table.to_pylist():
        metrics = dict(row["metrics"])
        runtime = decode_trace(row["trace"]).agent.runtime
        assert runtime is not None and runtime.type == "sandbox"
        images_of[row["task_type"]].add(runtime.image)
        assert metrics["setup_shared"] == float(runtime.snapshot is not None)  # scoring sees it too
        assert metrics["has_jq"] == (1.0 if row["task_type"] == "Ledger" else 0.0)
        if row["task_type"] == "Ledger":
            assert metrics["ledger_total"] > 0  # the setup's file, read by the grader's exec
            snapshots[row["group_id"]].append(runtime.snapshot)
        else:
            assert runtime.snapshot is None  # nothing shareable: each sample ran its own
    # each image is one digest, the two differ
    assert all(len(digests) == 1 and None not in digests for digests in images_of.values())
    assert images_of["Sum"] != images_of["Ledger"]
    assert len(snapshots) == 2
    for group in snapshots.values():  # one node: the first sample ran the setup, three started from it
        started_from = [s for s in group if s is not None]
        assert len(group) == 4 and len(started_from) == 3 and len(set(started_from)) == 1, group
