"""A judge plugin as users write one (loader id ``v1-sum-judge``): it asks its own model the
row's sum again and rewards a reply that agrees with it. Its endpoint comes from
``SUM_JUDGE_URL``, where the test serves a simulated model."""

from __future__ import annotations

import os

import verifiers.v1 as vf
from pydantic import Field


class SumJudgeConfig(vf.JudgeConfig):
    base_url: str = Field(default_factory=lambda: os.environ["SUM_JUDGE_URL"])
    api_key_var: str = "SIMULATED_API_KEY"
    model: str = "simulated"


class SumJudge(vf.Judge[str, SumJudgeConfig]):
    prompt = "{question}"

    def parse(self, response: vf.JudgeResponse[str]) -> str:
        return response.text.strip()

    async def score(self, task: vf.TaskData, trace: vf.Trace) -> float:
        result = await self.evaluate(trace=trace, question=task.prompt)
        return float(result.parsed == trace.last_reply)


__all__ = ["SumJudge"]
