"""The drafter predictor's training: the shipped JSON is what the training command
produces, the pure-Python runtime predicts what scikit-learn's model does, and no
held-out dataset is ever in the training data.

The recorded prompts' text is fetched data kept out of git (`python -m bench.traces.sources
--clones DIR` builds it): only the reproduction of the shipped file needs it and skips
without it; the rest trains on prompts and traces written here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.training.predictor.data import (
    DEFAULT_PROMPTS,
    DEFAULT_TRACES,
    FAMILIES,
    is_held_out,
    load_rows,
)
from bench.training.predictor.train import (
    DEPTH,
    LEARNING_RATE,
    SEED,
    SUBSAMPLE,
    TREES,
    dumps,
    evaluate,
    fit,
    train,
)
from policies.predictor import DEFAULT_PATH, Predictor

# Nine datasets (codealpaca twice: one group), prompts of their kind written here, and
# per request a made-up accept length per drafter: n-gram long where the prompt gives
# material to copy, EAGLE steady.
SOURCES = {
    "codealpaca-2k": "Rewrite this function to use a list comprehension.\n\n"
                     "def evens(xs):\n    out = []\n    for x in xs:\n        if x % {n} == 0:\n"
                     "            out.append(x)\n    return out\n",
    "codealpaca-new": "Fix the bug in this code.\n\nint total = 0;\nfor (int i = 0; i <= {n}; "
                      "i++) {{\n    total += values[i];\n}}\nreturn total;\n",
    "humaneval": "Complete this Python function.\n\n```python\ndef scale(xs, k={n}):\n"
                 "    \"\"\"Multiply every element by k.\"\"\"\n```",
    "dialogsum": "Summarize the following dialogue.\n\n#Person1#: Did the parcel arrive? "
                 "#Person2#: Yes, {n} boxes came this morning and one was damaged. "
                 "#Person1#: Send a photo of the damaged one to the shop today.",
    "quoref-t0": "Read the passage and extract the answer.\n\nThe orchestra played {n} "
                 "concerts in the old hall before the fire. Its conductor, Mara Lind, "
                 "moved it to the harbour theatre.\n\nWho conducted the orchestra?",
    "svamp": "Tom had {n} apples and gave 3 to each of his 2 friends. How many are left?",
    "tatoeba": "Translate this English text into French.\n\nI have lived here for {n} years.",
    "self-instruct-user": "Give me {n} ideas for a rainy weekend with children.",
    "debugbench": "Observe the following Python3 faulty code. Your task is to fix up the "
                  "code.\n\nclass Solution:\n    def last(self, nums):\n"
                  "        return nums[len(nums) + {n}]\n",
}
COPYING = ("codealpaca", "dialogsum", "quoref", "debugbench")


def write_training_files(folder: Path, per_source: int = 5) -> tuple[Path, Path]:
    prompts, traces = folder / "prompts.jsonl", folder / "traces.jsonl"
    with open(prompts, "w") as p, open(traces, "w") as t:
        for source, text in SOURCES.items():
            for n in range(per_source):
                key = f"{source}:{n}"
                p.write(json.dumps({"id": key, "source": source, "category": "x", "messages": [
                    {"role": "user", "content": text.format(n=n + 2)}]}) + "\n")
                copy = source.startswith(COPYING)
                steps = {"ngram": [4 + n % 3, 6, 2, 5] if copy else [1, 1, 2, 1 + n % 2],
                         "eagle": [2, 2 + n % 2, 1, 2]}
                for method, accepts in steps.items():
                    t.write(json.dumps({"id": key, "method": method, "k": 8,
                                        "accept_lengths": accepts}) + "\n")
    return traces, prompts


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list:
    return load_rows(*write_training_files(tmp_path_factory.mktemp("predictor")))


def test_the_shipped_model_is_what_training_produces() -> None:
    if not DEFAULT_PROMPTS.exists():
        pytest.skip(f"{DEFAULT_PROMPTS} not built here (python -m bench.traces.sources "
                    "--clones DIR)")
    produced = dumps(train(DEFAULT_TRACES, DEFAULT_PROMPTS))
    assert produced == DEFAULT_PATH.read_text(), "rerun: python -m bench.training.predictor"


def test_the_runtime_predicts_what_scikit_learn_predicts(rows: list) -> None:
    from sklearn.ensemble import GradientBoostingRegressor

    document = fit(rows)
    predictor = Predictor(document)
    x = [list(r.features) for r in rows]
    for family in FAMILIES:
        model = GradientBoostingRegressor(n_estimators=TREES, max_depth=DEPTH,
                                          learning_rate=LEARNING_RATE, subsample=SUBSAMPLE,
                                          random_state=SEED)
        model.fit(x, [math.log(r.accept_length[family]) for r in rows])
        smearing = document["families"][family]["smearing"]
        assert 1.0 <= smearing < 1.5
        expected = [math.exp(v) * smearing for v in model.predict(x)]
        got = [predictor.accept_lengths(r.features)[family] for r in rows]
        assert got == pytest.approx(expected, rel=1e-3)


def test_no_held_out_dataset_is_trained_on() -> None:
    document = json.loads(DEFAULT_PATH.read_text())
    sources = document["data"]["sources"]
    assert len(sources) >= 8
    assert not [s for s in sources if is_held_out(s)]
    for name in ("spec-bench:mt_bench", "gsm8k", "cnn_dailymail", "nq-rag", "wmt14-de-en",
                 "ShareGPT", "instructcoder", "mt-bench"):
        assert is_held_out(name), name


def test_a_held_out_source_in_the_training_files_is_refused(tmp_path: Path) -> None:
    prompts, traces = tmp_path / "prompts.jsonl", tmp_path / "traces.jsonl"
    prompts.write_text(json.dumps({"id": "gsm8k:1", "source": "gsm8k", "category": "math",
                                   "messages": [{"role": "user", "content": "1 + 1?"}]}) + "\n")
    traces.write_text("".join(json.dumps({"id": "gsm8k:1", "method": method, "k": 8,
                                          "accept_lengths": [1, 2]}) + "\n"
                              for method in FAMILIES))
    with pytest.raises(ValueError, match="held-out"):
        load_rows(traces, prompts)
    assert len(load_rows(traces, prompts, allow_held_out=True)) == 1  # evaluation only


def test_grouped_cv_beats_the_class_mean() -> None:
    figures = json.loads(DEFAULT_PATH.read_text())["grouped_cv"]
    assert figures["requests"] >= 200
    assert figures["auc"] > figures["auc_class_mean"]


def test_evaluate_reports_held_out_traces_and_fits_nothing(tmp_path: Path) -> None:
    passage = "The lighthouse was built in 1788 and still guides boats into the channel. " * 6
    items = {"spec-bench:1": ("summarization", f"Summarize the following article.\n\n{passage}",
                              {"ngram": [9, 1, 5], "eagle": [1, 2, 1]}),
             "spec-bench:2": ("mt_bench", "Write a short poem about autumn leaves.",
                              {"ngram": [1, 1, 1], "eagle": [2, 3, 2]})}
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"id": key, "source": "spec-bench", "category": category,
                    "messages": [{"role": "user", "content": text}]}) + "\n"
        for key, (category, text, _) in items.items()))
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "traces.jsonl").write_text("".join(
        json.dumps({"id": key, "method": method, "k": 8, "accept_lengths": steps}) + "\n"
        for key, (_, _, traces) in items.items() for method, steps in traces.items()))
    shipped = DEFAULT_PATH.read_text()
    figures = evaluate(tmp_path / "smollm2", json.loads(shipped))
    assert figures["requests"] == 2 and figures["ngram_beats_eagle"] == 1
    assert figures["auc"] == 1.0  # the summary ranked above the poem
    assert set(figures["by_source"]) == {"spec-bench"}
    assert DEFAULT_PATH.read_text() == shipped


def test_grouped_cv_never_tests_a_dataset_it_trained_on(monkeypatch: pytest.MonkeyPatch,
                                                        rows: list) -> None:
    import bench.training.predictor.train as training

    seen: list[set[str]] = []
    real_fit = training.fit

    def recording_fit(train_rows: list) -> dict:
        seen.append({r.group for r in train_rows})
        return real_fit(train_rows)

    monkeypatch.setattr(training, "fit", recording_fit)
    figures = training.grouped_cv(rows)
    groups = {r.group for r in rows}
    assert len(seen) == len(groups) >= 8  # one fold per dataset
    assert all(len(groups - trained) == 1 for trained in seen)  # exactly one left out
    assert "codealpaca" in groups and "codealpaca-2k" not in groups  # one dataset, two files
    assert figures["requests"] == len(rows)
    assert figures["auc"] > 0.9  # copying sources told apart from the others
    assert set(figures["by_group"]) == groups  # and per left-out dataset
    assert sum(g["requests"] for g in figures["by_group"].values()) == len(rows)
