"""The committed prompt set: public sources only, none of the held-out judging sets,
every category of issue 41, each item in the recorder's shape. The held-out prompts
(bench/traces/data/heldout/): only the judging sets, and never in anything trained on."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.traces import heldout
from bench.traces.record import PROMPTS
from bench.traces.sources import CATEGORIES, SOURCES
from bench.training.classifier.data import build_dataset

ROOT = Path(__file__).resolve().parents[3]
HELD_OUT_DIR = ROOT / "bench" / "traces" / "data" / "heldout"

HELD_OUT = ("spec-bench", "specdecode", "mt-bench", "mt_bench", "wmt", "cnn", "dailymail",
            "natural_questions", "natural-questions", "gsm8k", "sharegpt", "instructcoder")


def test_prompt_file_covers_every_category_from_public_sources() -> None:
    items = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    assert len({i["id"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == set(CATEGORIES) and min(counts.values()) >= 20
    for item in items:
        assert item["source"] in SOURCES and item["id"].startswith(item["source"] + ":")
        assert [m["role"] for m in item["messages"]] == ["user"]
        assert item["messages"][0]["content"].strip()


def test_no_source_is_a_held_out_set() -> None:
    for name, source in SOURCES.items():
        text = f"{name} {source.repo} {source.path}".lower()
        assert not any(word in text for word in HELD_OUT), name


def _held_out_items() -> list[dict]:
    """The held-out prompts: fetched public text, kept out of the repository (rebuilt with
    `python -m bench.traces.heldout --clones DIR`); without them there is nothing to check."""
    path = HELD_OUT_DIR / "prompts.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not built here (python -m bench.traces.heldout --clones DIR)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_held_out_prompts_come_from_the_judging_sets_only() -> None:
    items = _held_out_items()
    assert len({i["id"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == {"mt_bench", "translation", "summarization", "qa", "math_reasoning",
                           "rag", "code_edit"} and min(counts.values()) >= 10
    for item in items:
        assert item["source"] in heldout.SOURCES and item["id"].startswith(item["source"] + ":")
        assert [m["role"] for m in item["messages"]] == ["user"]


def test_held_out_prompts_never_enter_training() -> None:
    """No id, no text, not one run of `heldout.RUN` words shared with what is trained on:
    the trace prompts, the classifier's generated data and its sources' literal text, the
    test fixtures; no training module reads the held-out folder; no training trace
    records a held-out id."""
    items = _held_out_items()
    training = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    assert not {i["id"] for i in items} & {t["id"] for t in training}
    texts = [m["content"] for t in training for m in t["messages"]]
    texts += [e.text for split in ("train", "test") for e in build_dataset(split, 400)]
    code = [*(ROOT / "bench" / "training").rglob("*.py"), ROOT / "tests" / "smollm2_prompts.py"]
    texts += [path.read_text() for path in [*code, *(ROOT / "tests" / "data").glob("*.jsonl")]]
    seen = set().union(*map(heldout.word_runs, texts))
    whole = set(texts)
    for item in items:
        text = item["messages"][0]["content"]
        assert text not in whole and not heldout.word_runs(text) & seen, item["id"]
    names = ("data/heldout", '/ "heldout"', "traces.heldout", "traces import heldout")
    for path in code:
        assert not any(name in path.read_text() for name in names), path
    ids = {i["id"] for i in items}
    for traces in (ROOT / "bench" / "traces" / "data").glob("smollm2*/traces.jsonl"):
        assert not {json.loads(line)["id"] for line in traces.open()} & ids, traces
    recorded = HELD_OUT_DIR / "smollm2" / "traces.jsonl"
    if recorded.exists():
        assert {json.loads(line)["id"] for line in recorded.open()} <= ids
