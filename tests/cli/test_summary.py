"""The summary's text: the first message of each error type, the judge's failures, the failure
rule and the time figures, on synthetic tables (the CLI runs are in test_one_count.py)."""

from __future__ import annotations

import pyarrow as pa

from rollout_ray._cli.summary import MESSAGE_CHARS, format_summary, summarize


def _samples(rows: list[tuple[bool, float, str | None, str | None]]) -> pa.Table:
    ok, reward, kind, message = (list(c) for c in zip(*rows))
    return pa.table(
        {
            "ok": ok,
            "reward": reward,
            "stop_condition": ["error"] * len(rows),
            "error_type": pa.array(kind, pa.string()),
            "error_message": pa.array(message, pa.string()),
        }
    )


def test_each_error_type_shows_its_first_message_on_one_line_cut_to_length() -> None:
    long = "x" * 500
    samples = _samples(
        [
            (False, 0.0, "ProviderError", "503 upstream\nTraceback ..."),
            (False, 0.0, "TaskError", long),
            (False, 0.0, "ProviderError", "a later one"),
            (True, 1.0, None, None),
        ]
    )
    text = format_summary(summarize(samples, pa.table({}))).splitlines()
    at = text.index("error types  ProviderError=2  TaskError=1")
    assert text[at + 1] == "  ProviderError  first: 503 upstream …"
    assert text[at + 2] == "  TaskError      first: " + "x" * (MESSAGE_CHARS - 1) + "…"


def test_a_failed_rollout_counts_as_zero_even_when_it_was_scored() -> None:
    summary = summarize(_samples([(True, 1.0, None, None), (False, 1.0, "TaskError", "late")]), pa.table({}))
    assert summary["mean_reward"] == 0.5
    assert "mean reward 0.5000  (failed rollouts count as reward 0 and not passing" in format_summary(summary)


def test_the_judges_failures_are_counted_with_the_first_message() -> None:
    groups = pa.table(
        {"group_id": ["0-a", "1-b", "2-c"], "judge_error": [None, "ValueError: bad\nmore", "TypeError: worse"]}
    )
    text = format_summary(summarize(_samples([(True, 1.0, None, None)]), groups))
    assert "judge failed on 2 of 3 groups  first: ValueError: bad …" in text.splitlines()


def test_the_time_line_names_what_each_figure_counts() -> None:
    samples = _samples([(True, 1.0, None, None)])
    eval_time = {"wall": 8.7, "start": 3.1, "rollouts": 5.6, "rate": 289.0}
    assert format_summary(summarize(samples, pa.table({}), timing=eval_time)).splitlines()[-1] == (
        "wall 8.7s (start 3.1s, rollouts 5.6s)  289.0 rollouts/s over the rollouts' 5.6s"
    )
    stored = samples.append_column("started_at", pa.array([100.0])).append_column("agent_s", pa.array([2.0]))
    assert format_summary(summarize(stored, pa.table({}))).splitlines()[-1] == (
        "rollouts' span 2.0s (first start to last end, from the stored spans)  0.5 rollouts/s over it"
    )
