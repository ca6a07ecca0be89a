"""The traces summary: accept length per category and method over verify steps, decode
speed against plain from the recorded step times, n-gram against EAGLE per request."""

from __future__ import annotations

import json
from pathlib import Path

from bench.traces.record import TRACES
from bench.traces.summary import complete, load, markdown, method_table, ngram_vs_eagle


def row(id_: str, method: str, accepts: list[int], ms: float) -> dict:
    return {"id": id_, "category": "code_edit", "method": method, "steps": len(accepts),
            "accept_lengths": accepts, "output_tokens": sum(accepts) + 1,
            "step_ms": [ms] * len(accepts), "greedy_match": method != "eagle"}


def write(folder: Path) -> None:
    rows = [row("a", "plain", [1] * 8, 10.0), row("a", "ngram", [5, 3], 20.0),
            row("a", "eagle", [2, 2, 2, 2], 12.0), row("b", "plain", [1] * 4, 10.0),
            row("b", "ngram", [1, 1, 1, 1], 11.0), row("b", "eagle", [2, 2], 12.0),
            row("c", "ngram", [9], 10.0)]  # no plain row: left out
    (folder / TRACES).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_accept_length_speed_and_head_to_head(tmp_path: Path) -> None:
    write(tmp_path)
    traces = complete(load(tmp_path))
    assert set(traces) == {"a", "b"}
    cells = {r["method"]: r for r in method_table(traces)}
    assert cells["ngram"]["accept_length"] == 12 / 6 and cells["plain"]["accept_length"] == 1
    # ngram: 12 tokens in 84 ms; plain: 12 tokens in 120 ms.
    assert abs(cells["ngram"]["speedup"] - 120 / 84) < 1e-9
    assert cells["eagle"]["mismatches"] == 2 and cells["ngram"]["mismatches"] == 0
    assert ngram_vs_eagle(traces) == [{"category": "code_edit", "requests": 2,
                                       "by_tokens_per_step": 1, "by_time": 1}]
    assert "| all | 2 | 1 (50%) | 1 (50%) |" in markdown(tmp_path)
