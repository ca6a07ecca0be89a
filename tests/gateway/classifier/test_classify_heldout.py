"""The classifier on hand-labelled prompts it was never trained on, and the wall between
those prompts and the training code."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gateway.classifier import HELDOUT_SETS, accuracy, chat_request, heldout
from bench.training.classifier.data import build_dataset
from gateway.classifier.classify import classify

TRAINING = Path(__file__).resolve().parents[3] / "bench" / "training" / "classifier"


@pytest.mark.parametrize("path", HELDOUT_SETS, ids=lambda p: p.name)
def test_heldout_accuracy(path: Path) -> None:
    rows = heldout(path)
    assert len(rows) >= 45
    result = accuracy(rows)
    assert result["accuracy"] >= 0.93, result["misses"]


def test_the_first_set_has_150_prompts_of_every_kind() -> None:
    rows = heldout(HELDOUT_SETS[0])
    assert len(rows) >= 150
    counts = {label: sum(r["label"] == label for r in rows) for label in
              ("code", "structured", "chat")}
    assert min(counts.values()) >= 40, counts
    assert sum(not r["text"].isascii() for r in rows) >= 20  # several languages


@pytest.mark.parametrize(("text", "task"), [
    ("What is the capital of France? Answer in one sentence.", "chat"),
    ("Count from 1 to 10", "chat"),
    ("Show me the code for shutil.copytree.", "code"),
    ("用Python写一个函数，判断一个数是不是质数。", "code"),
    ("请以JSON格式返回三个中国城市及其人口。", "structured"),
    ("How do I pretty-print a JSON file from the command line with jq?", "code"),
])
def test_cases_named_in_the_issue_and_its_errors(text: str, task: str) -> None:
    assert classify(chat_request(text)).task == task


def test_training_never_reads_the_heldout_prompts() -> None:
    for source in TRAINING.rglob("*.py"):
        text = source.read_text()
        assert "heldout" not in text and "tests/data" not in text, source
    generated = {e.text for split in ("train", "test") for e in build_dataset(split, 400)}
    written = {r["text"] for path in HELDOUT_SETS for r in heldout(path)}
    assert not generated & written
