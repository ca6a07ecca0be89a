"""The text model's one-sum scorer gives the answers of the plain formula it replaced:
per class, bias + the weights of the known `features()` summed, over sqrt(their number),
softmax. Same label, probabilities within 1e-9, the same explaining features, on the
hand-labelled held-out prompts, the training generator's test split, odd text and the
bench's 4 KB prompt."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from bench.gateway.classifier import PROMPT_4KB
from bench.training.classifier.data import build_dataset
from gateway.classifier.classify import DEFAULT_MODEL_PATH
from gateway.classifier.scorer import LinearTextModel, Prediction, features

DATA = Path(__file__).resolve().parents[2] / "data"


def texts() -> list[str]:
    found = [json.loads(line)["text"] for name in ("classifier_heldout.jsonl",
                                                   "classifier_heldout_fresh.jsonl")
             for line in (DATA / name).read_text().splitlines() if line.strip()]
    found += [e.text for e in build_dataset("test", per_class=150)]
    rnd = random.Random(1)
    alphabet = "ab Cz\n\t;{}()=:->!?<>/_#$'\"`[]\x1c\x1f\x85é中\u212a"
    found += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 900)))
              for _ in range(200)]
    return [*found, PROMPT_4KB, "", "   ", "ALL CAPS SHOUTING? YES!"]


def reference(model: LinearTextModel, text: str) -> tuple[str, list[float], list[int]]:
    """The formula as the scorer computed it before: one sum per class."""
    rows = {model.vocabulary[f] for f in features(text) if f in model.vocabulary}
    weights = model.weights.astype(float)
    logits = [float(b) for b in model.bias]
    if rows:
        scale = 1.0 / math.sqrt(len(rows))
        logits = [sum(float(weights[r, c]) for r in rows) * scale + float(model.bias[c])
                  for c in range(len(model.classes))]
    scores = [math.exp(x - max(logits)) for x in logits]
    best = scores.index(1.0)
    ranked = sorted(rows, key=lambda r: -weights[r, best])
    return model.classes[best], [s / sum(scores) for s in scores], ranked


def check(model: LinearTextModel, text: str) -> None:
    got: Prediction = model.predict(text)
    label, probabilities, ranked = reference(model, text)
    assert got.label == label, text[:80]
    assert got.probabilities == pytest.approx(probabilities, abs=1e-9, rel=0)
    assert got.probability == pytest.approx(max(probabilities), abs=1e-9, rel=0)
    best = model.classes.index(label)
    names = {n: i for i, n in enumerate(model.names)}
    got_weights = [model.weights[names[n], best] for n in got.top_features]
    assert got_weights == [model.weights[r, best] for r in ranked[:3]]  # ties in any order


def test_shipped_model_gives_the_reference_answers() -> None:
    model = LinearTextModel.load(DEFAULT_MODEL_PATH)
    for text in texts():
        check(model, text)


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_other_class_counts_give_the_reference_answers(classes: int) -> None:
    """Three classes or fewer share one complex sum; more take one sum per class."""
    shipped = LinearTextModel.load(DEFAULT_MODEL_PATH)
    rng = np.random.default_rng(classes)
    model = LinearTextModel(tuple(f"c{i}" for i in range(classes)), shipped.names,
                            rng.normal(size=(len(shipped.names), classes)).astype(np.float32),
                            rng.normal(size=classes).astype(np.float32))
    for text in texts()[:400]:
        check(model, text)
