"""A run whose traces are large, for the test that the end of a run reads none of them back.

Drives N rollouts whose tasks put ~64 KB of incompressible text on each trace, through a
run directory, and prints one JSON line: rows, MiB of the stored ``trace`` column, and the
peak of Arrow's memory pool over the whole run (where a read-back of every trace would show).

    python big_run.py RUN_DIR N
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_ray import ChatHarness, LocalExecutor, Task, Trace, reward
from rollout_ray._driver.driver import Driver, EvalConfig
from rollout_ray.testing import ScriptedModel


class Bulky(Task):
    async def setup(self, trace: Trace) -> None:
        trace.info["blob"] = os.urandom(32 * 1024).hex()

    @reward
    def one(self) -> float:
        return 1.0


async def main(run_dir: str, n: int) -> None:
    async with LocalExecutor() as executor:
        tasks = [Bulky({"idx": i, "prompt": "q"}) for i in range(n)]
        driver = Driver(
            tasks,
            ChatHarness(),
            ScriptedModel(default="4"),
            executor=executor,
            config=EvalConfig(max_in_flight=64, rows_per_shard=64),
            run_dir=run_dir,
        )
        result = await driver.arun()
    stored = sum(
        pq.ParquetFile(os.path.join(run_dir, "shards", f)).metadata.num_rows
        for f in os.listdir(os.path.join(run_dir, "shards"))
    )
    trace_bytes = sum(
        pq.read_table(os.path.join(run_dir, "shards", f), columns=["trace"])["trace"].nbytes
        for f in os.listdir(os.path.join(run_dir, "shards"))
    )
    print(
        json.dumps(
            {
                "rows": result.samples.num_rows,
                "stored": stored,
                "stored_trace_mib": trace_bytes / 2**20,
                "arrow_peak_mib": pa.default_memory_pool().max_memory() / 2**20,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
