"""The shipped text model: held-out accuracy, latency, training, the `.npz` format."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.training.classifier.data import build_dataset
from bench.training.classifier.train import TASKS, TrainConfig, chat_body, evaluate, train
from gateway.classifier.classify import DEFAULT_MODEL_PATH, classify, load_classifier
from gateway.classifier.scorer import LinearTextModel, features, window
from gateway.schemas import parse_request

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shipped() -> LinearTextModel:
    return LinearTextModel.load(DEFAULT_MODEL_PATH)


def test_held_out_accuracy_of_shipped_model(shipped: LinearTextModel) -> None:
    config = TrainConfig()
    result = evaluate(shipped, build_dataset("test", per_class=config.test_per_class))
    # 0.91: the split's code templates that edit the code they give ("optimize: <code>",
    # "debug pls <code>", "Make this code async ...", 208 of 800) are labelled `code`;
    # the pipeline calls them `edit` (copy-heavy, issue 41). Chat and structured: 0.99+
    assert result.pipeline_accuracy >= 0.90
    assert result.model_accuracy >= 0.90  # the model alone, on phrasings it never saw
    report = json.loads(DEFAULT_MODEL_PATH.with_suffix(".json").read_text())
    assert abs(report["pipeline_accuracy"] - result.pipeline_accuracy) < 0.01  # assets in sync
    assert report["classes"] == list(TASKS)


def test_dataset_is_deterministic_and_splits_templates() -> None:
    first = build_dataset("test", per_class=50)
    assert first == build_dataset("test", per_class=50)
    train_sources = {e.source for e in build_dataset("train", per_class=300)}
    test_sources = {e.source for e in build_dataset("test", per_class=300)}
    assert not train_sources & test_sources
    assert {e.label for e in first} == set(TASKS)


def test_latency_of_4kb_prompt(shipped: LinearTextModel) -> None:
    """p99 of 1000 calls after warmup, best of 3 rounds, on this thread's CPU time with a
    1 ms guard: a loaded CI box preempts us, which wall time would count as our cost.
    Wall-clock p50 is checked too; the real figures are in docs/CLASSIFIER.md."""
    sentence = "Could you tell me more about the history of the old harbour town we visited? "
    body = parse_request(chat_body((sentence * 60)[:4096]), "chat")
    assert classify(body, model=shipped).reasons[0].startswith("model:")
    for _ in range(200):
        classify(body, model=shipped)
    cpu_p99, wall_p50 = [], []
    for _ in range(3):
        wall, cpu = [], []
        for _ in range(1000):
            start_wall, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
            classify(body, model=shipped)
            cpu.append(time.thread_time_ns() - start_cpu)
            wall.append(time.perf_counter_ns() - start_wall)
        cpu_p99.append(sorted(cpu)[989])
        wall_p50.append(sorted(wall)[499])
    assert min(cpu_p99) < 1_000_000, cpu_p99
    assert min(wall_p50) < 1_000_000, wall_p50


def test_training_smoke_writes_a_loadable_model(tmp_path: Path) -> None:
    report = train(TrainConfig(train_per_class=120, test_per_class=40, latency_calls=0),
                   out_dir=tmp_path)
    model = LinearTextModel.load(tmp_path / "classifier.npz")
    assert set(model.classes) == set(TASKS)
    assert report.pipeline_accuracy > 0.8
    assert json.loads((tmp_path / "classifier.json").read_text())["train_examples"] == 360
    profile = classify(parse_request(chat_body("Fix this bug:\nint main() { return 0 }"), "chat"),
                       model=model)
    assert profile.task == "code"


def test_save_load_round_trip_is_exact(tmp_path: Path, shipped: LinearTextModel) -> None:
    shipped.save(tmp_path / "m.npz")
    again = LinearTextModel.load(tmp_path / "m.npz")
    assert again.names == shipped.names and again.classes == shipped.classes
    np.testing.assert_array_equal(again.weights, shipped.weights)
    text = "How do I sort a dict by value in Python?"
    assert again.predict(text) == shipped.predict(text)


def test_model_file_from_other_featurizer_is_refused(tmp_path: Path,
                                                     shipped: LinearTextModel) -> None:
    path = tmp_path / "old.npz"
    np.savez(path, format_version=np.array([0, 1, 1]), classes=np.zeros(1, np.uint8),
             vocabulary=np.zeros(1, np.uint8), weights=shipped.weights, bias=shipped.bias)
    with pytest.raises(ValueError, match="featurizer version"):
        LinearTextModel.load(path)


def test_numpy_scorer_matches_sklearn() -> None:
    """The exported weights + our featurizer reproduce sklearn's own probabilities."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import normalize

    examples = build_dataset("train", per_class=60)
    vectorizer = CountVectorizer(analyzer=features, binary=True)
    matrix = normalize(vectorizer.fit_transform([e.text for e in examples]))
    clf = LogisticRegression(max_iter=500).fit(matrix, [e.label for e in examples])
    model = LinearTextModel(tuple(clf.classes_), tuple(vectorizer.get_feature_names_out()),
                            clf.coef_.T.astype(np.float32), clf.intercept_.astype(np.float32))
    for example in examples[:20]:
        expected = clf.predict_proba(normalize(vectorizer.transform([example.text])))[0]
        got = model.predict(example.text)
        assert got.label == clf.classes_[expected.argmax()]
        assert got.probability == pytest.approx(expected.max(), abs=1e-4)


def test_serving_features_are_the_training_features(shipped: LinearTextModel) -> None:
    """`known_rows` (serving: ASCII text on a bytes path, no bigram strings) finds exactly
    the known features that `features` (training) lists, on prose, code and odd text."""
    import random

    texts = [json.loads(line)["text"] for name in ("classifier_heldout.jsonl",
                                                   "classifier_heldout_fresh.jsonl")
             for line in (ROOT / "tests" / "data" / name).read_text().splitlines() if line]
    rnd = random.Random(0)
    alphabet = "ab Cz\n\t;{}()=:->!?<>/_#$'\"`[]\x1c\x1f\x85é中\u212a"  # K sign lowers to k
    texts += ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 900)))
              for _ in range(300)]
    for text in texts:
        expected = {shipped.vocabulary[f] for f in features(text) if f in shipped.vocabulary}
        assert shipped.known_rows(text) == expected, text[:80]
    assert features("Fix THIS: x = f(a)\x1cb") == [
        "fix", "this", "x", "f", "a", "b", "fix this", "this x", "x f", "f a", "a b",
        "<paren>", "<colon>", "<assign>"]  # \x1c splits words as in training


def test_window_bounds_long_prompts() -> None:
    long_text = "a " * 50_000
    assert len(window(long_text)) < 1100
    assert features("x" * 10 + "y") == ["xxxxxxxxxxy"]


def test_no_model_io_at_import() -> None:
    code = ("import gateway.classifier.classify as c; assert c._MODEL is None; "
            "from gateway.schemas import parse_request; "
            "c.classify(parse_request({'model': 'm', 'messages': [{'role': 'user', "
            "'content': 'hi'}]}, 'chat')); "
            "assert c._MODEL is not None")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_load_classifier_replaces_cached_model(tmp_path: Path, shipped: LinearTextModel) -> None:
    shipped.save(tmp_path / "copy.npz")
    try:
        assert load_classifier(tmp_path / "copy.npz").names == shipped.names
    finally:
        load_classifier()


def test_runtime_import_path_has_no_training_code() -> None:
    """The gateway classifies with numpy only: scikit-learn and the training package are
    never imported by the app, not even after the first classification."""
    code = ("import sys, gateway.http.app; from gateway.classifier.classify import classify; "
            "from gateway.schemas import parse_request; "
            "classify(parse_request({'model': 'm', 'messages': [{'role': 'user', "
            "'content': 'hi'}]}, 'chat')); "
            "bad = [m for m in sys.modules if m.startswith(('sklearn', 'scipy', "
            "'bench.training.classifier', 'torch', 'specroute', 'bench'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
