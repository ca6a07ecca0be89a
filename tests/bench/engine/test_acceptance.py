"""The acceptance bench: the held-out magpie shards only, per task; accept length counts
every verified token per step, so plain decoding reads exactly 1 and a drafter ≥ 1, and
a candidate folder's drafters are measured on the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine.acceptance import accept_length, held_out, prompt_sets
from workers.embedded.engine import BUNDLED_MODEL_DIR, Engine
from workers.embedded.speculative.methods import load_methods


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()  # the bundled tiny model, with every drafter


def test_only_the_held_out_shards_are_read(engine: Engine, tmp_path: Path) -> None:
    folder = tmp_path / "magpie"
    folder.mkdir()
    for i, task in enumerate(("chat", "code", "structured", "chat")):
        row = {"id": i, "task": task, "temperature": 0.0, "prompt_ids": [1, 2, 3 + i],
               "response_ids": [5, 2], "finish": "stop"}
        (folder / f"magpie-{i:05d}.jsonl").write_text(json.dumps(row) + "\n")
    assert held_out(f"{folder}:2") == (folder, 2) and held_out(str(folder)) == (folder, 1)
    sets = prompt_sets(engine.tokenizer, 2, [held_out(f"{folder}:2")])
    assert {k: len(v) for k, v in sets.items()} == {
        "workload/code": 2, "workload/structured": 2, "workload/chat": 2,
        "magpie/chat": 1, "magpie/code": 1}
    assert sets["magpie/code"] == [[1, 2, 4]]


def test_plain_reads_one_token_a_step_and_a_drafter_at_least_one(engine: Engine) -> None:
    prompts = prompt_sets(engine.tokenizer, 2)["workload/code"]
    plain, tokens = accept_length(engine, prompts, "plain", 0, 12)
    assert plain == 1.0 and tokens > 0
    eagle, eagle_tokens = accept_length(engine, prompts, "eagle", 3, 12)
    assert 1.0 <= eagle <= 4.0 and eagle_tokens == tokens  # greedy: the same answers
    candidate = Engine.from_model(engine.model, engine.tokenizer,
                                  methods=load_methods(BUNDLED_MODEL_DIR, engine.model))
    assert accept_length(candidate, prompts, "eagle", 3, 12) == (eagle, eagle_tokens)
