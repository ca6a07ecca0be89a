"""The self-distillation prompt set and its generator: a few thousand prompts over the three
tasks, none of them a benchmark prompt; shards hold what the drafters train on, and a
restart resumes instead of redoing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench.training.drafters.distill_data import build_prompts, run
from bench.workload import TASKS, prompts
from workers.embedded.fetch_model import ensure_smollm2


@pytest.fixture(scope="module")
def items():
    return build_prompts()


def test_a_few_thousand_prompts_over_the_three_tasks(items) -> None:
    counts = Counter(item.task for item in items)
    assert 2000 <= len(items) <= 5000 and set(counts) == {"code", "structured", "chat"}
    assert min(counts.values()) >= 300
    assert len({item.text for item in items}) == len(items)


def test_no_benchmark_prompt_is_trained_on(items) -> None:
    texts = {item.text for item in items}
    for task in TASKS:
        for seed in (0, 1, 7, 123):  # seeds beyond those excluded at build time
            bench = {m["content"] for p in prompts(task, 500, seed) for m in p.messages}
            assert not texts & bench


def test_shards_hold_the_targets_answers_and_a_restart_resumes(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=3, limit=1)
    shard = tmp_path / "shard-00000.jsonl"
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    assert 1 <= len(rows) <= 2
    for row in rows:
        assert row["prompt_ids"][0] == 1  # <|im_start|>system ... ending <|im_start|>assistant\n
        assert row["prompt_ids"][-4:] == [1, 520, 9531, 198]
        assert 1 <= len(row["response_ids"]) <= 3 and row["task"] in TASKS
        assert row["finish"] in ("stop", "length") and row["temperature"] in (0.0, 0.8)
    before = shard.stat().st_mtime_ns
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=3, limit=1)
    assert shard.stat().st_mtime_ns == before and sorted(p.name for p in tmp_path.iterdir()) == [shard.name]
