"""`specroute bench batching --write-costs`: seconds per decode step by (method, k,
batch), merged into a measured.json that the policy reads as its step-cost prior."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.engine.batching import CostTally, cost_rows, format_costs, time_decode_steps
from policies.prior import Measured, measured_step_curve
from specroute.cli import main
from workers.models import BUNDLED_MODEL_DIR


def test_costs_merge_into_measured_json_and_give_a_step_curve(tmp_path: Path, capsys) -> None:
    path = tmp_path / "measured.json"
    shutil.copy(BUNDLED_MODEL_DIR / "measured.json", path)
    before = json.loads(path.read_text())
    assert main(["bench", "batching", "--model", "tiny", "--methods", "eagle,ngram",
                 "--quick", "--write-costs", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "step costs: specroute-tiny" in printed and "| eagle | 5 |" in printed
    after = json.loads(path.read_text())
    for key, value in before.items():
        if key not in ("costs", "costs_source"):
            assert after[key] == value, key  # entries and the rest kept as they were
    assert after["costs_source"].startswith("specroute bench batching --model specroute-tiny")
    costs = after["costs"]
    # --quick: batch 1 and 2, the fleet's default k only
    assert {(c["method"], c["k"], c["batch"]) for c in costs} == {
        (m, k, b) for m, k in (("plain", 0), ("eagle", 5), ("ngram", 6)) for b in (1, 2)}
    assert all(c["steps"] == 4 and c["step_s"] > 0 for c in costs)
    eagle = [c for c in costs if c["method"] == "eagle"]
    assert all(c["draft_tokens"] == 5.0 for c in eagle)  # a tree drafter always fills k
    measured = Measured.from_dict(after)
    assert measured.entries and len(measured.costs) == len(costs)
    curve = measured_step_curve(measured, "eagle")
    assert [p.batch for p in curve] == [1.0, 2.0]
    assert curve[0].base == 1.0 and all(p.base > 0 for p in curve)


def test_prefill_is_not_timed_and_drafts_are_counted_per_sequence() -> None:
    from workers.embedded.engine import Engine

    engine = Engine()
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": "Tell me about heapq."}])
    engine.prefill_chunk = 4  # a prompt over several prefill steps: none of them timed
    seconds, draft = time_decode_steps(engine, [prompt, prompt[:-1]], "eagle", 3, 5)
    assert seconds > 0 and draft == 5 * 3  # 5 timed steps x k drafted by each sequence


def test_the_table_is_relative_to_plain_at_the_same_batch() -> None:
    tallies = {("plain", 0, 1): CostTally([0.010, 0.012], 48, 0.0),
               ("plain", 0, 2): CostTally([0.015], 24, 0.0),
               ("eagle", 4, 1): CostTally([0.020, 0.030, 0.022], 72, 288.0),
               ("eagle", 4, 2): CostTally([0.045], 24, 96.0)}
    table = format_costs(tallies)
    assert "| plain | 0 | 0.0 | 11.0 | 1.00x | 15.0 | 1.00x |" in table
    assert "| eagle | 4 | 4.0 | 22.0 | 2.00x | 45.0 | 3.00x |" in table
    rows = cost_rows(tallies)
    assert rows[2] == {"method": "eagle", "k": 4, "batch": 1, "step_s": 0.022, "steps": 72,
                       "draft_tokens": 4.0}


NO_STEP_COSTS_YET = {"smollm2-135m-instruct": {"hybrid"}}


@pytest.mark.parametrize("model", ["specroute-tiny", "smollm2-135m-instruct"])
def test_shipped_measured_json_has_step_costs(model: str) -> None:
    """Both shipped measured.json files carry the step costs of every method they measured
    (`specroute bench batching --write-costs`), at batch 1, 2 and 4, and they parse."""
    from workers.models import weights_dir

    document = json.loads((weights_dir(model) / "measured.json").read_text())
    measured = Measured.from_dict(document)
    assert measured.entries and measured.costs
    assert document["costs_source"].startswith(f"specroute bench batching --model {model}")
    methods = {c.method for c in measured.costs}
    # the hybrid's rows (2026-12-06) came without step costs: two runs on the loaded machine
    # disagreed 1.79x / 1.32x plain at batch 1 (docs/results/2026-12-06-hybrid-fleet.md);
    # its pools learn their step cost live until a quiet run writes them
    assert {e.method for e in measured.entries} - methods <= NO_STEP_COSTS_YET.get(model, set())
    assert {c.batch for c in measured.costs if c.method == "plain"} == {1, 2, 4}
    for method in methods - {"plain"}:
        curve = measured_step_curve(measured, method)
        assert [p.batch for p in curve] == [1.0, 2.0, 4.0], method
        assert curve[0].base == 1.0 and all(p.base > 0 for p in curve), method


def test_throughput_serves_the_same_prompts_at_every_concurrency(monkeypatch) -> None:
    """One request's tokens/s is the same four prompts served one after another, so a
    long prompt's prefill counts at 1 as at 4 (it once ran the first prompt alone)."""
    import bench.engine.batching as batching

    served: dict[int, list[list[int]]] = {}

    def fake_run(engine, requests, method, max_tokens, seed):
        served.setdefault(len(requests) if method == "plain" else -1, []).extend(requests)
        return 10 * len(requests), 1.0, 10

    monkeypatch.setattr(batching, "run_together", fake_run)
    monkeypatch.setattr(batching, "_prompt_ids", lambda engine, n, seed: [[i] * (i + 1) for i in range(n)])
    rates = batching.measure(None, ["plain"], 1, 10, 0)
    assert served[1] == served[2] == served[4] == [[0], [1, 1], [2, 2, 2], [3, 3, 3, 3]]
    assert rates[("plain", 1)] == [10.0] and rates[("plain", 4)] == [40.0]
