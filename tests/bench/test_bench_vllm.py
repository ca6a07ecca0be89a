"""`specroute bench vllm`'s arithmetic: the paired ratio and its interval, and the report's
met / missed verdicts, on known rows (the run itself needs the vLLM stack)."""

from __future__ import annotations

import random

import pytest

from bench.vllm import TASKS, paired_ratio, report


def test_paired_ratio_and_its_interval() -> None:
    ratio, low, high = paired_ratio([20.0, 22.0, 18.0, 20.0], [10.0, 11.0, 9.0, 10.0],
                                    random.Random(0))
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) \
        and high == pytest.approx(2.0)  # the same ratio on every prompt: no spread
    ratio, low, high = paired_ratio([30.0, 10.0, 20.0], [10.0, 10.0, 10.0], random.Random(0))
    assert ratio == pytest.approx(2.0) and low < 2.0 < high


def test_report_says_met_or_missed(capsys: pytest.CaptureFixture[str]) -> None:
    def row(tps: float, accept: float) -> dict:
        return {"tokens_per_s": tps, "accept_length": accept}

    rows = {(task, pool): [row(tps, accept)] * 2 for task in TASKS
            for pool, tps, accept in (("vllm-plain", 10.0, 1.0), ("vllm-ngram", 19.0, 3.0))}
    learned = {"edit/vllm-ngram": {"predicted": 3.3, "observed": 3.0, "requests": 50,
                                   "chosen": "vllm-ngram"},
               "chat/vllm-ngram": {"predicted": 3.1, "observed": 1.3, "requests": 50,
                                   "chosen": "vllm-plain"},
               "chat/vllm-plain": {"predicted": 1.0, "observed": None, "requests": 0,
                                   "chosen": "vllm-plain"}}
    result = report(rows, learned, random.Random(0))
    out = capsys.readouterr().out
    assert result["pinned"]["edit"]["vllm-ngram"]["over_plain"] == pytest.approx(1.9)
    assert "vllm-ngram / plain on edit at c = 1: 1.90 (target >= 1.8: met)" in out
    assert [learned[k]["within_20pct"] for k in learned] == [True, False, None]
