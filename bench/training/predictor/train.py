"""Fit the per-request drafter predictor and write `policies/data/predictor.json`.

    python -m bench.training.predictor [--traces PATH] [--prompts PATH] [--out PATH]
    python -m bench.training.predictor --evaluate FOLDER  # report on held-out traces (docs/TRACES.md)

Per drafter family (n-gram, EAGLE), a small gradient-boosted tree ensemble
(scikit-learn `GradientBoostingRegressor`, depth 2) on the log of the request's mean accept
length (times Duan's smearing factor, so that it predicts a mean, not a geometric mean), from the features of gateway/classifier/features.py; flattened into JSON that the
runtime (policies/predictor.py) evaluates in pure Python. Deterministic: fixed seeds, rows
sorted by id, floats rounded. Grouped cross-validation (leave one source dataset out:
a dataset is never in both a fold's train and test) gives the figures written beside
the model, over all rows and per left-out dataset (`by_group`): the AUC of ranking "n-gram yields more tokens per step than EAGLE" per
request, the same AUC for the class mean the policy used before (each training fold's
mean per classifier task), and the MAE of accept length per family. `--evaluate` reads
held-out traces and only reports.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.traces.sources import rebuild_hint
from bench.training.predictor.data import (
    DEFAULT_PROMPTS,
    DEFAULT_TRACES,
    FAMILIES,
    ROOT,
    Row,
    load_rows,
)
from gateway.classifier.features import FEATURES
from policies.predictor import DEFAULT_PATH, TRACE_K, Predictor
from policies.types import ANY_TASK, TASKS

TREES = 60
DEPTH = 2
LEARNING_RATE = 0.05
SUBSAMPLE = 0.8
SEED = 0
DIGITS = 6  # rounding of every float written: the file is byte-for-byte reproducible


def _fit_family(rows: Sequence[Row], family: str) -> dict:
    from sklearn.ensemble import GradientBoostingRegressor  # training only: never at runtime

    x = [list(r.features) for r in rows]
    y = [math.log(r.accept_length[family]) for r in rows]
    model = GradientBoostingRegressor(n_estimators=TREES, max_depth=DEPTH,
                                      learning_rate=LEARNING_RATE, subsample=SUBSAMPLE,
                                      random_state=SEED).fit(x, y)
    trees = []
    for estimator in model.estimators_[:, 0]:
        tree = estimator.tree_
        trees.append({
            "feature": [int(f) for f in tree.feature],
            "threshold": [round(float(t), DIGITS) for t in tree.threshold],
            "left": [int(i) for i in tree.children_left],
            "right": [int(i) for i in tree.children_right],
            "value": [round(float(v[0][0]) * LEARNING_RATE, DIGITS) for v in tree.value],
        })
    # Duan's smearing: exp(mean log) is a geometric mean, below the arithmetic mean the
    # policy compares with its class's (n-gram's runs make it heavy-tailed); the mean of
    # exp(residual) over the training rows restores it
    residuals = [math.exp(target - fitted) for target, fitted in zip(y, model.predict(x),
                                                                     strict=True)]
    return {"base": round(float(model.init_.constant_[0][0]), DIGITS), "trees": trees,
            "smearing": round(sum(residuals) / len(residuals), DIGITS)}


def fit(rows: Sequence[Row]) -> dict:
    """The predictor's JSON document (without figures) fitted on `rows`."""
    class_mean: dict[str, dict[str, float]] = {}
    for family in FAMILIES:
        overall = sum(r.accept_length[family] for r in rows) / len(rows)
        class_mean[family] = {}
        for task in TASKS:
            own = [r.accept_length[family] for r in rows if r.task == task]
            class_mean[family][task] = round(sum(own) / len(own) if own else overall, DIGITS)
        class_mean[family][ANY_TASK] = round(overall, DIGITS)  # the pooled unit's mean
    return {
        "features": list(FEATURES),
        "k": TRACE_K,
        "target": "log mean accept length (tokens per verify step, prefill token excluded); "
                  "prediction exp(base + leaves) x smearing",
        "families": {family: _fit_family(rows, family) for family in FAMILIES},
        "class_mean": class_mean,
    }


def auc(labels: Sequence[bool], scores: Sequence[float]) -> float:
    """Area under the ROC curve (ties count half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def _figures(rows: Sequence[Row], predict: Callable[[Row], dict[str, float]],
             class_score: Callable[[Row], float]) -> dict:
    labels = [r.accept_length["ngram"] > r.accept_length["eagle"] for r in rows]
    predicted = [predict(r) for r in rows]
    out = {
        "requests": len(rows),
        "ngram_beats_eagle": sum(labels),
        "auc": round(auc(labels, [math.log(p["ngram"] / p["eagle"]) for p in predicted]), 3),
        "auc_class_mean": round(auc(labels, [class_score(r) for r in rows]), 3),
    }
    for family in FAMILIES:
        errors = [abs(p[family] - r.accept_length[family]) for p, r in zip(predicted, rows,
                                                                            strict=True)]
        out[f"mae_{family}"] = round(sum(errors) / len(errors), 3)
    out["tokens_per_step"] = _choices(rows, [math.log(p["ngram"] / p["eagle"])
                                             for p in predicted],
                                      [class_score(r) for r in rows])
    return out


def _choices(rows: Sequence[Row], scores: Sequence[float], class_scores: Sequence[float]
             ) -> dict[str, float]:
    """Mean tokens per verify step each request gets when its drafter is chosen by: the
    predictor (n-gram where its score is > 0), the class mean, an oracle, or one drafter
    for all. Tokens per step, not per second: an EAGLE step also pays its draft head."""
    def mean(values: Sequence[float]) -> float:
        return round(sum(values) / len(values), 3)

    def by(chosen: Sequence[bool]) -> float:
        return mean([r.accept_length["ngram" if c else "eagle"] for r, c in zip(rows, chosen,
                                                                                strict=True)])

    return {"predictor": by([s > 0 for s in scores]), "class_mean": by([s > 0 for s in
                                                                         class_scores]),
            "oracle": mean([max(r.accept_length.values()) for r in rows]),
            **{f"all_{family}": mean([r.accept_length[family] for r in rows])
               for family in FAMILIES}}


def _scorer(document: dict) -> tuple[Callable[[Row], dict[str, float]], Callable[[Row], float]]:
    predictor = Predictor(document)
    means = document["class_mean"]

    def class_score(row: Row) -> float:
        return math.log(means["ngram"][row.task] / means["eagle"][row.task])

    return (lambda row: predictor.accept_lengths(row.features)), class_score


def grouped_cv(rows: Sequence[Row]) -> dict:
    """Leave one source dataset out: every row predicted by a model that never saw its
    dataset; figures over all rows."""
    predicted: dict[str, dict[str, float]] = {}
    class_scores: dict[str, float] = {}
    for group in sorted({r.group for r in rows}):
        train = [r for r in rows if r.group != group]
        predict, class_score = _scorer(fit(train))
        for row in rows:
            if row.group == group:
                predicted[row.id], class_scores[row.id] = predict(row), class_score(row)
    figures = _figures(rows, lambda r: predicted[r.id], lambda r: class_scores[r.id])
    figures["by_group"] = {}
    for group in sorted({r.group for r in rows}):
        own = [r for r in rows if r.group == group]
        labels = [r.accept_length["ngram"] > r.accept_length["eagle"] for r in own]
        scores = [math.log(predicted[r.id]["ngram"] / predicted[r.id]["eagle"]) for r in own]
        value = auc(labels, scores)  # nan where one drafter wins every request
        figures["by_group"][group] = {"requests": len(own), "ngram_beats_eagle": sum(labels),
                                      "auc": None if math.isnan(value) else round(value, 3)}
    return figures


def train(traces: Path, prompts: Path) -> dict:
    rows = load_rows(traces, prompts)
    document = fit(rows)
    document["data"] = {"traces": _relative(traces), "prompts": _relative(prompts),
                        "sources": sorted({r.source for r in rows})}
    document["grouped_cv"] = grouped_cv(rows)
    return document


def evaluate(traces: Path, document: dict) -> dict:
    """Figures of a fitted model on held-out traces (a `traces.jsonl`, or a folder holding
    one, with the `prompts.jsonl` beside it or one folder up): evaluation only, nothing is
    fitted; per source too."""
    traces = traces / "traces.jsonl" if traces.is_dir() else traces
    prompts = next((folder / "prompts.jsonl" for folder in (traces.parent, traces.parent.parent)
                    if (folder / "prompts.jsonl").exists()), traces.parent / "prompts.jsonl")
    rows = load_rows(traces, prompts, allow_held_out=True)
    scorers = _scorer(document)
    out = _figures(rows, *scorers)
    out["by_source"] = {source: _figures([r for r in rows if r.source == source], *scorers)
                        for source in sorted({r.source for r in rows})}
    return out


def _relative(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def dumps(document: dict) -> str:
    return json.dumps(document, indent=None, separators=(",", ":"), sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.training.predictor",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--out", type=Path, default=DEFAULT_PATH)
    parser.add_argument("--evaluate", type=Path, default=None,
                        help="held-out traces (a traces.jsonl or its folder): report the "
                             "shipped model on them, fit nothing")
    args = parser.parse_args(argv)
    try:
        _run(args)
    except FileNotFoundError as exc:  # the prompts are fetched data, kept out of git
        hint = rebuild_hint(exc.filename)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        raise SystemExit(2) from None


def _run(args: argparse.Namespace) -> None:
    if args.evaluate is not None:
        document = json.loads(args.out.read_text())
        print(json.dumps(evaluate(args.evaluate, document), indent=2))
        return
    document = train(args.traces, args.prompts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dumps(document))
    print(json.dumps(document["grouped_cv"], indent=2))
