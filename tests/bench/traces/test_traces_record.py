"""The trace recorder on the bundled tiny model: one row per request and method in the
documented format, accept lengths that add up to the output, greedy output equal to plain
decoding's, and a rerun that skips the ids already recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.traces.record import TRACES, first_mismatch, load_prompts, main, record
from workers.embedded.engine import Engine

FIELDS = {"id", "source", "category", "method", "k", "model", "prompt_tokens",
          "output_tokens", "steps", "accept_lengths", "drafted", "step_ms", "prefill_ms",
          "wall_s", "finish_reason", "greedy_match", "first_mismatch"}
PROMPTS = [
    {"id": "a:1", "source": "a", "category": "code_edit", "messages": [
        {"role": "user", "content": "Fix this.\n\ndef add(a, b):\n    return a - b\n"}]},
    {"id": "b:1", "source": "b", "category": "chat", "messages": [
        {"role": "user", "content": "Say something about the sea."}]},
    {"id": "a:2", "source": "a", "category": "code_edit", "messages": [
        {"role": "user", "content": "Rename x to y.\n\nx = 1\nprint(x)\n"}]},
]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()  # the bundled tiny model, with its drafters


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / TRACES).read_text().splitlines()]


def test_rows_have_the_format_and_accept_lengths_add_up(engine: Engine, tmp_path: Path) -> None:
    assert record(engine, PROMPTS, tmp_path, ["ngram", "eagle"], 4, 24, "tiny", False) == 3
    written = rows(tmp_path)
    assert [(r["id"], r["method"]) for r in written] == [
        (p["id"], m) for p in PROMPTS for m in ("plain", "ngram", "eagle")]
    for row in written:
        assert FIELDS <= set(row) and row["k"] == (0 if row["method"] == "plain" else 4)
        accepts = row["accept_lengths"]
        # The first token comes from the prefill forward, in no verify step.
        assert sum(accepts) + 1 == row["output_tokens"] and row["steps"] == len(accepts)
        assert len(row["drafted"]) == len(row["step_ms"]) == len(accepts)
        assert all(1 <= a <= row["k"] + 1 for a in accepts)
        assert all(a <= d + 1 for a, d in zip(accepts, row["drafted"], strict=True))
        assert row["greedy_match"] and row["first_mismatch"] is None
        assert row["output_tokens"] <= 24 and row["wall_s"] > 0
    plain = [r for r in written if r["method"] == "plain"]
    assert all(set(r["accept_lengths"]) <= {1} and "output_ids" in r for r in plain)
    assert any(a > 1 for r in written if r["method"] != "plain" for a in r["accept_lengths"])


def test_a_rerun_skips_recorded_ids_and_redoes_a_partial_one(engine: Engine,
                                                            tmp_path: Path) -> None:
    record(engine, PROMPTS[:2], tmp_path, ["ngram"], 4, 12, "tiny", False)
    path = tmp_path / TRACES
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")  # b:1 lost its ngram row (interrupted)
    assert record(engine, PROMPTS, tmp_path, ["ngram"], 4, 12, "tiny", False) == 2
    ids = [(r["id"], r["method"]) for r in rows(tmp_path)]
    assert ids[:3] == [("a:1", "plain"), ("a:1", "ngram"), ("b:1", "plain")]
    assert sorted(ids[3:]) == sorted([("b:1", "plain"), ("b:1", "ngram"), ("a:2", "plain"),
                                      ("a:2", "ngram")])
    assert record(engine, PROMPTS, tmp_path, ["ngram"], 4, 12, "tiny", False) == 0


def test_the_command_runs_on_the_tiny_model(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    out = tmp_path / "out"
    assert main(["--out", str(out), "--model", "tiny", "--methods", "ngram", "--k", "3",
                 "--max-tokens", "8", "--limit", "2", "--prompts", str(prompts)]) == 0
    assert {r["id"] for r in rows(out)} == {"a:1", "b:1"}  # categories in turn
    assert "recorded 2 prompts" in capsys.readouterr().out


def test_prompts_take_categories_in_turn(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    assert [p["id"] for p in load_prompts(path)] == ["a:1", "b:1", "a:2"]


def test_first_mismatch() -> None:
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 5, 3], [1, 2, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2
