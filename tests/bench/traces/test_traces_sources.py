"""The prompt set (fetched public text, built by `python -m bench.traces.sources --clones
DIR`, not in git): public sources only, none of the held-out judging sets, every category
of issue 41, each item in the recorder's shape. The held-out prompts
(bench/traces/data/heldout/): only the judging sets, and never in anything trained on.
Checks of the files themselves skip where they are not built; what tells a user how to
build them runs everywhere."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bench.traces import heldout
from bench.traces.record import main as record_main
from bench.traces.sources import CATEGORIES, EXTRA, PROMPTS, SOURCES, rebuild_hint
from bench.training.classifier.data import build_dataset

ROOT = Path(__file__).resolve().parents[3]
HELD_OUT_DIR = ROOT / "bench" / "traces" / "data" / "heldout"

HELD_OUT = ("spec-bench", "specdecode", "mt-bench", "mt_bench", "wmt", "cnn", "dailymail",
            "natural_questions", "natural-questions", "gsm8k", "sharegpt", "instructcoder")


def _training_items() -> list[dict]:
    if not PROMPTS.exists():
        pytest.skip(f"{PROMPTS} not built here (python -m bench.traces.sources --clones DIR)")
    return [json.loads(line) for line in PROMPTS.read_text().splitlines()]


def test_prompt_file_covers_every_category_from_public_sources() -> None:
    items = _training_items()
    assert len({i["id"] for i in items}) == len(items)
    assert len({i["messages"][0]["content"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == set(CATEGORIES) | set(EXTRA) and min(counts.values()) >= 15
    assert counts["code_edit"] >= 60  # the second draw's code edits
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
    training = _training_items()
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


def test_a_missing_prompts_file_names_the_command_that_builds_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "python -m bench.traces.sources --clones DIR" in rebuild_hint(PROMPTS)
    assert "python -m bench.traces.heldout --clones DIR" in rebuild_hint(
        HELD_OUT_DIR / "prompts.jsonl")
    assert rebuild_hint(tmp_path / "prompts.jsonl") is None  # not a fetched file of ours
    assert rebuild_hint(None) is None
    missing = PROMPTS if not PROMPTS.exists() else tmp_path / "absent.jsonl"
    assert record_main(["--out", str(tmp_path), "--prompts", str(missing)]) == 2
    assert "is not here" in capsys.readouterr().err


def test_bench_traces_without_its_prompts_says_how_to_build_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.traces import sources
    from specroute.cli import build_parser

    missing = (tmp_path / "prompts.jsonl").resolve()  # stands for the default, not built
    monkeypatch.setitem(sources.REBUILD, missing, "python -m bench.traces.sources --clones DIR")
    args = build_parser().parse_args(["bench", "traces", "--quick", "--prompts", str(missing)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "python -m bench.traces.sources --clones DIR" in err and "Traceback" not in err
