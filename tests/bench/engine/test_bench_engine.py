"""`specroute bench engine`: ratios per round, median and range, verdicts that call a
difference real only when the ranges are apart, and the measured.json the policy reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine.methods import Tally, format_table, summarize, variant, verdicts
from bench.workload import TASKS
from specroute.cli import main


def _tally(rates: list[float], steps: int) -> Tally:
    tally = Tally()
    for r, rate in enumerate(rates):
        tally.add(r, int(rate * 10), 10.0, steps)
    return tally


def test_speedups_are_per_round_ratios_with_their_range() -> None:
    tallies = {("code", 0.0): {"plain": _tally([10, 20, 10], 3),
                               "ngram": _tally([20, 30, 12], 1),
                               "medusa": _tally([11, 19, 11], 2)}}
    rows = summarize(tallies, ["plain", "ngram", "medusa"], {"plain": ("plain", 0), "ngram": ("ngram", 6),
                                                            "medusa": ("medusa", 4)})
    ngram = next(r for r in rows if r["method"] == "ngram")
    assert (ngram["speedup"], ngram["speedup_min"], ngram["speedup_max"]) == (1.5, 1.2, 2.0)
    assert ngram["k"] == 6 and ngram["requests"] == 3 and ngram["tokens_per_s"] == 20.0
    assert ngram["accept_length"] == round(620 / 3, 2)  # tokens over verify steps, all rounds
    text = verdicts(rows)[0]
    assert "best ngram 1.50x (real vs plain)" in text  # 1.2..2.0 excludes 1.0
    assert "ahead of medusa 1.10x (real)" in text  # medusa 0.95..1.1 is below 1.2
    assert "**1.50x** [1.20–2.00] (206.7)" in format_table(rows)


def test_overlapping_ranges_are_a_tie() -> None:
    tallies = {("chat", 0.8): {"plain": _tally([10, 10], 1), "eagle": _tally([12, 9], 1),
                               "draft": _tally([11, 9.5], 1)}}
    rows = summarize(tallies, ["plain", "eagle", "draft"], {"plain": ("plain", 0), "eagle": ("eagle", 5),
                                                           "draft": ("draft", 4)})
    text = verdicts(rows)[0]
    assert "not distinguishable from plain" in text and "a tie" in text


def test_the_bench_writes_the_policys_prior(tmp_path: Path, capsys) -> None:
    out = tmp_path / "measured.json"
    assert main(["bench", "engine", "--model", "tiny", "--methods", "plain,ngram", "--rounds",
                 "2", "--prompts", "1", "--max-tokens", "4", "--write-measured", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "engine benchmark: specroute-tiny" in printed and "| ngram |" in printed
    document = json.loads(out.read_text())
    assert document["model"] == "specroute-tiny"
    assert document["source"].startswith("specroute bench engine --model specroute-tiny --rounds 2")
    assert document["device"].startswith("cpu: ") and len(document["measured_at"]) == 10
    entries = document["entries"]
    assert len(entries) == 2 * len(TASKS) * 2  # methods x classes x temperatures
    assert "schema" not in {e["task"] for e in entries}  # printed, not a policy class
    assert "schema T0" in printed
    assert set(entries[0]) == {"method", "k", "task", "temperature", "accept_length",
                               "tokens_per_s", "speedup", "requests"}
    plain = [e for e in entries if e["method"] == "plain"]
    assert all(e["speedup"] == 1.0 and e["k"] == 0 and e["requests"] == 2 for e in plain)


def test_one_method_at_several_k_is_several_rows(tmp_path: Path, capsys) -> None:
    assert variant("eagle:3", 16) == ("eagle", 3) and variant("plain", 16) == ("plain", 0)
    assert variant("ngram:40", 16) == ("ngram", 16)  # within the engine's max k
    out = tmp_path / "measured.json"
    assert main(["bench", "engine", "--model", "tiny", "--methods", "ngram:1,ngram:3",
                 "--rounds", "1", "--prompts", "1", "--max-tokens", "4",
                 "--write-measured", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| ngram:1 |" in printed and "| ngram:3 |" in printed
    entries = json.loads(out.read_text())["entries"]
    assert {(e["method"], e["k"]) for e in entries} == {("plain", 0), ("ngram", 1), ("ngram", 3)}


def test_a_prompt_file_runs_one_cell_per_category_timed_from_the_first_token(
        tmp_path: Path, capsys) -> None:
    """`--prompt-file`: the categories of a prompts JSONL are the cells (no schema cell),
    `n` prompts of each drawn the same way for the same seed; timed from the first token,
    so a cell's accept length counts decode steps only; never written as a prior."""
    from bench.engine.prompt_file import file_prompts

    lines = [{"category": c, "messages": [{"role": "user", "content": f"{c} {i}: say a b c"}]}
             for c in ("code_edit", "rag") for i in range(5)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    drawn = file_prompts(path, 2, seed=3)
    assert set(drawn) == {"code_edit", "rag"} and all(len(p) == 2 for p in drawn.values())
    assert drawn == file_prompts(path, 2, seed=3)
    assert file_prompts(path, 9, 3, ["rag"]).keys() == {"rag"}  # at most what there is
    assert len(file_prompts(path, 9, 3, ["rag"])["rag"]) == 5
    assert main(["bench", "engine", "--model", "tiny", "--methods", "plain,ngram:2",
                 "--rounds", "1", "--prompts", "1", "--max-tokens", "6", "--prompt-file",
                 str(path), "--temperatures", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert {(r["task"], r["temperature"]) for r in rows} == {("code_edit", 0.0), ("rag", 0.0)}
    plain = next(r for r in rows if r["label"] == "plain")
    assert plain["accept_length"] == 1.0  # 5 tokens after the first, 5 decode steps
    assert plain["draft_histogram"] == [5]  # five decode steps, none drafting
    for row in rows:  # every decode step counted once, by the draft tokens it verified
        histogram = row["draft_histogram"]
        assert sum(histogram) == 5 and len(histogram) <= 3
        assert sum(d * n for d, n in enumerate(histogram)) == pytest.approx(
            row["draft_tokens"] * 5, abs=0.05)
    assert main(["bench", "engine", "--model", "tiny", "--prompt-file", str(path),
                 "--write-measured", str(tmp_path / "m.json")]) == 2
