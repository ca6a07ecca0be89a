"""The embedded workers' n-gram and EAGLE prior from recorded traces (bench/traces/prior.py):
rows per drafter, k and class that are the trace world's walk, written into measured.json
in place of the engine bench's greedy rows only."""

from __future__ import annotations

import json

import pytest
from test_traces_world import CATEGORY_PROMPTS

from bench.traces.adaptive import profile_of
from bench.traces.prior import KS, METHODS, traced_entries, with_traced
from bench.traces.sources import PROMPTS
from bench.traces.world import DATA, LAWS, MEASURED, load_prompts, load_traces, serve


@pytest.fixture(scope="module")
def traces():
    return load_traces(DATA / "smollm2")


def _prompts(traces) -> dict[str, dict]:
    return {rid: {"id": rid, "messages": [{"role": "user", "content": CATEGORY_PROMPTS[
        m["plain"].category]}]} for rid, m in traces.items()}


def test_rows_are_the_walk_per_class(traces) -> None:
    prompts = _prompts(traces)
    ids = sorted(traces)[:40]
    entries = traced_entries(traces, prompts, ids)
    law = LAWS["embedded"]()
    task = {rid: profile_of(prompts[rid], traces[rid]["plain"].output_tokens,
                            traces[rid]["plain"].model)[0].task for rid in ids}
    assert {(e.method, e.k) for e in entries} == {(m, k) for m in METHODS for k in KS}
    for e in entries:
        mine = [rid for rid in ids if task[rid] == e.task]
        assert e.requests == len(mine) and e.temperature == 0.0
        walked = [serve(traces[rid][e.method], e.method, e.k, 1, law) for rid in mine]
        assert e.accept_length == pytest.approx(
            sum(w.tokens for w in walked) / sum(w.steps for w in walked), abs=1e-3)
        assert e.tokens_per_s == pytest.approx(
            sum(w.tokens for w in walked) / sum(w.decode_s for w in walked), abs=0.05)


def test_only_the_greedy_ngram_and_eagle_rows_are_replaced(traces) -> None:
    doc = json.loads(MEASURED.read_text())
    entries = traced_entries(traces, _prompts(traces), sorted(traces)[:20])
    out = with_traced(doc, entries)
    kept = [e for e in doc["entries"] if e["method"] not in METHODS or e["temperature"] > 0]
    assert out["entries"][:len(kept)] == kept
    assert len(out["entries"]) == len(kept) + len(entries)
    assert out["costs"] == doc["costs"] and out["source"].count("bench.traces.prior") == 1
    assert with_traced(out, entries) == out  # idempotent


def test_the_shipped_rows_are_the_training_traces() -> None:
    """measured.json's greedy n-gram and EAGLE rows are what the command derives from the
    committed training traces (their prompts are fetched data, built where tested)."""
    if not PROMPTS.exists():
        pytest.skip(f"{PROMPTS} not built here (python -m bench.traces.sources --clones DIR)")
    traces = load_traces(DATA / "smollm2")
    prompts = load_prompts(PROMPTS)
    ids = sorted(i for i, m in traces.items() if i in prompts and {"plain", *METHODS} <= set(m))
    shipped = [e for e in json.loads(MEASURED.read_text())["entries"]
               if e["method"] in METHODS and e["temperature"] == 0.0]
    derived = with_traced({"source": "", "entries": []}, traced_entries(traces, prompts, ids))
    assert shipped == derived["entries"]
