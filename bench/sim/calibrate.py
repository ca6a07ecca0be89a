"""`python -m bench.sim.calibrate`: the figures the policy simulator takes from this
repository's own engine and classifier (bench/sim/calibration.py stores the results).

1. Per-prompt acceptance spread. The embedded engine (bundled model, one thread) decodes
   bench/workload.py prompts per (task, temperature) with several methods at fixed k and
   keeps every verify step's accepted drafts. Per request, per-token acceptance `a` is
   the inverse of its mean accept length (arXiv 2211.17192). The spread of logit(a)
   *between prompts* of one class is estimated split-half: the covariance, across
   prompts, of logit(a) from the odd and from the even verify steps of each request, so
   step-to-step sampling noise (independent between halves) drops out. Also reported:
   the correlation between methods of the per-prompt logit(a) (same prompt, same
   temperature), and the conditional acceptance per draft position (positional decay).
2. Classifier confusion: `gateway.classifier.classify` on the classifier's held-out
   labelled split (bench/training/classifier/data.py, `build_dataset("test")`) and on
   bench/workload.py prompts; rows = true task, columns = predicted task.

Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import defaultdict

import numpy as np

from bench.workload import TASKS, prompts

METHODS = ("ngram", "lookahead", "medusa", "eagle", "eagle2", "draft")
TEMPERATURES = (0.0, 0.8)


def _logit(a: float) -> float:
    a = min(max(a, 0.02), 0.98)
    return math.log(a / (1.0 - a))


def _a_of(accepted: list[int], k: int) -> float:
    from policies.acceptance import invert_accept_length

    return invert_accept_length(1.0 + sum(accepted) / len(accepted), k) if accepted else 0.0


def decode_records(n_prompts: int, max_tokens: int, ks: tuple[int, ...], seed: int) -> list[dict]:
    import torch

    from workers.embedded.chat_template import render_chat
    from workers.embedded.engine import Engine, SamplingParams

    torch.set_num_threads(1)
    engine = Engine()
    records = []
    for task in TASKS:
        for i, prompt in enumerate(prompts(task, n_prompts, seed + 101)):
            ids = engine.tokenizer.encode(render_chat(list(prompt.messages)))
            for temperature in TEMPERATURES:
                for method in METHODS:
                    for k in ks:
                        params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature,
                                                seed=seed + i, ignore_eos=True)
                        gen = engine.start(ids, params, method=method, k=k)
                        steps = []
                        while not gen.finished:
                            steps.append(len(gen.step().token_ids) - 1)
                        # drop the prefill step and the last (possibly cut by max_tokens)
                        records.append({"task": task, "temperature": temperature, "prompt": i,
                                        "method": method, "k": k, "accepted": steps[1:-1]})
    return records


def spread(records: list[dict], k: int) -> dict:
    """Split-half between-prompt std of logit(a) per method, pooled over classes."""
    by_class: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        acc = r["accepted"]
        if r["k"] != k or len(acc) < 8:
            continue
        by_class[(r["method"], r["task"], r["temperature"])].append(
            (_logit(_a_of(acc[0::2], k)), _logit(_a_of(acc[1::2], k))))
    per_method: dict[str, list[tuple[float, int]]] = defaultdict(list)
    classes = {}
    for (method, task, temperature), pairs in by_class.items():
        if len(pairs) < 4:
            continue
        x = np.array(pairs)
        cov = float(np.cov(x[:, 0], x[:, 1])[0, 1])
        total = float(np.var(x.mean(axis=1), ddof=1))
        classes[f"{method}/{task}/T{temperature:g}"] = {
            "prompts": len(pairs), "between_std": math.sqrt(max(cov, 0.0)),
            "observed_std": math.sqrt(total)}
        per_method[method].append((cov, len(pairs)))
    pooled = {m: math.sqrt(max(sum(c * n for c, n in v) / sum(n for _, n in v), 0.0))
              for m, v in per_method.items()}
    return {"per_method_logit_std": pooled, "classes": classes,
            "all_methods_logit_std": float(np.mean(list(pooled.values())))}


def correlation(records: list[dict], k: int) -> dict:
    """Correlation between methods of per-prompt logit(a), within a class, pooled."""
    table: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r["k"] == k and len(r["accepted"]) >= 4:
            table[(r["task"], r["temperature"], r["prompt"])][r["method"]] = _logit(
                _a_of(r["accepted"], k))
    out = {}
    for i, m1 in enumerate(METHODS):
        for m2 in METHODS[i + 1:]:
            xs, ys = [], []
            for task in TASKS:
                for temperature in TEMPERATURES:
                    rows = [v for key, v in table.items() if key[:2] == (task, temperature)
                            and m1 in v and m2 in v]
                    if len(rows) < 4:
                        continue
                    a = np.array([v[m1] for v in rows])
                    b = np.array([v[m2] for v in rows])
                    xs.extend(a - a.mean())  # within-class deviations
                    ys.extend(b - b.mean())
            if len(xs) > 8:
                out[f"{m1}~{m2}"] = float(np.corrcoef(xs, ys)[0, 1])
    return out


def positional(records: list[dict], k: int) -> dict:
    """P(draft i+1 accepted | drafts 1..i accepted), i = 0..k-1, per method."""
    out = {}
    for method in METHODS:
        reach = np.zeros(k + 1)
        for r in records:
            if r["method"] != method or r["k"] != k:
                continue
            for accepted in r["accepted"]:
                reach[: min(accepted, k) + 1] += 1
        out[method] = [round(float(reach[i + 1] / reach[i]), 3) if reach[i] else None
                       for i in range(k)]
    return out


def saturation(records: list[dict], ks: tuple[int, ...]) -> dict:
    """Mean accept length per method at each k (all classes): trees stop growing with k."""
    out = {}
    for method in METHODS:
        out[method] = {}
        for k in ks:
            steps = [a for r in records if r["method"] == method and r["k"] == k
                     for a in r["accepted"]]
            out[method][k] = round(1.0 + float(np.mean(steps)), 3) if steps else None
    return out


def confusion() -> dict:
    from bench.training.classifier.data import build_dataset
    from gateway.classifier.classify import classify
    from gateway.schemas import parse_request

    def matrix(pairs: list[tuple[str, str]]) -> dict:
        counts = {t: {p: 0 for p in TASKS} for t in TASKS}
        for true, predicted in pairs:
            counts[true][predicted] += 1
        return {t: {p: counts[t][p] / max(sum(counts[t].values()), 1) for p in TASKS}
                | {"n": sum(counts[t].values())} for t in TASKS}

    held_out = build_dataset("test")
    body = lambda text: {"model": "m", "messages": [{"role": "user", "content": text}]}  # noqa: E731
    out = {"held_out": matrix([(ex.label, classify(parse_request(body(ex.text), "chat")).task)
                               for ex in held_out])}
    bench = []
    for task in TASKS:
        for p in prompts(task, 200, seed=7):
            req = p.chat_body("m", 64, 0.0)
            bench.append((task, classify(parse_request(req, "chat")).task))
    out["bench_workload"] = matrix(bench)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--records", help="also write the per-request records (JSON) here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ks = (4, 8)
    confusion_rates = confusion()  # first: cheap, and fails fast if the classifier API moves
    records = decode_records(args.prompts, args.max_tokens, ks, args.seed)
    if args.records:
        with open(args.records, "w") as f:
            json.dump(records, f)
    out = {"setup": {"prompts_per_class": args.prompts, "max_tokens": args.max_tokens,
                     "temperatures": TEMPERATURES, "ks": ks, "methods": METHODS,
                     "model": "bundled specroute-tiny", "threads": 1},
           "spread_k4": spread(records, 4), "correlation_k4": correlation(records, 4),
           "positional_k8": positional(records, 8), "accept_length_by_k": saturation(records, ks),
           "confusion": confusion_rates}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
