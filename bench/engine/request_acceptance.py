"""Does a per-request acceptance model beat the per-class aggregates the policy keeps?

Runs the embedded engine in-process on the bench workload (bench/workload.py), half the
code prompts with a pasted stdlib function (input-grounded, where n-gram drafting
shines), every method at its fleet k, and records per request the accept length and the
features a gateway can see before routing: prompt token 3-gram repetition, prompt and
output length (log), temperature, response_format, task. Then, per method, on prompts
held out from fitting (odd-indexed prompts):
- per-class: the mean per-token acceptance `a` of the training requests of the same
  (task, temperature bucket) — what the policy's aggregates predict;
- per-request: a ridge regression (numpy, closed form) of `a` on the features.
Prints the mean absolute error of the predicted accept length E(a, k) for both.

    python -m bench.engine.request_acceptance [--model tiny] [--prompts 24] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import statistics
import textwrap

import numpy as np

from bench.engine.methods import _k, _load_engine, _run
from bench.workload import TASKS, prompts
from policies.acceptance import expected_accept_length, invert_accept_length
from policies.types import temperature_bucket
from workers.models import resolve_model

TEMPERATURES = (0.0, 0.8)


def repetition(ids: list[int], n: int = 3) -> float:
    """Fraction of the prompt's token n-grams that occur more than once in it."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    if not grams:
        return 0.0
    counts: dict[tuple, int] = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    return sum(1 for g in grams if counts[g] > 1) / len(grams)


GROUNDING = (textwrap.indent, textwrap.dedent, statistics.median, statistics.mode)


def grounded(message: str, i: int) -> str:
    """The ask with a stdlib function's source pasted in (an edit-style prompt)."""
    source = textwrap.dedent(inspect.getsource(GROUNDING[i % len(GROUNDING)]))
    return f"{message}\nStart from this code and keep its style:\n{source}"


def features(row: dict) -> list[float]:
    return [1.0, row["repetition"], math.log(row["prompt_tokens"]),
            math.log(row["max_tokens"]), row["temperature"], float(row["json"]),
            *(float(row["task"] == t) for t in TASKS[:-1])]


def ridge(x: np.ndarray, y: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    penalty = alpha * np.eye(x.shape[1])
    penalty[0, 0] = 0.0  # no shrinkage on the intercept
    return np.linalg.solve(x.T @ x + penalty, x.T @ y)


def collect(engine, n: int, max_tokens: int, methods: list[str]) -> list[dict]:
    rows = []
    for task in TASKS:
        for i, prompt in enumerate(prompts(task, n, seed=7)):
            messages = [dict(m) for m in prompt.messages]
            if task == "code" and i % 4 >= 2:
                messages[-1]["content"] = grounded(messages[-1]["content"], i)
            ids = engine.tokenizer.encode_chat(messages)
            for temperature in TEMPERATURES:
                tokens = max_tokens // 2 if i % 3 == 0 else max_tokens
                for method in methods:
                    stats, _ = _run(engine, ids, method, temperature, tokens, i)
                    k = _k(engine, method)
                    accept = stats.accept_length
                    rows.append({"method": method, "k": k, "task": task, "prompt": i,
                                 "temperature": temperature, "max_tokens": tokens,
                                 "prompt_tokens": len(ids), "repetition": repetition(ids),
                                 "json": prompt.response_format is not None,
                                 "accept_length": accept,
                                 "a": invert_accept_length(accept, k)})
    return rows


def evaluate(rows: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Per method: (MAE per-class, MAE per-request, held-out requests)."""
    out = {}
    for method in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == method]
        train = [r for r in mine if r["prompt"] % 2 == 0]
        test = [r for r in mine if r["prompt"] % 2 == 1]
        k = mine[0]["k"]
        by_class: dict[tuple[str, str], list[float]] = {}
        for r in train:
            by_class.setdefault((r["task"], temperature_bucket(r["temperature"])), []).append(r["a"])
        overall = statistics.fmean(r["a"] for r in train)
        coef = ridge(np.array([features(r) for r in train]), np.array([r["a"] for r in train]))
        err_class, err_request = [], []
        for r in test:
            a_class = statistics.fmean(by_class.get((r["task"], temperature_bucket(
                r["temperature"])), [overall]))
            a_request = float(np.clip(np.array(features(r)) @ coef, 0.0, 0.995))
            err_class.append(abs(expected_accept_length(a_class, k) - r["accept_length"]))
            err_request.append(abs(expected_accept_length(a_request, k) - r["accept_length"]))
        out[method] = (statistics.fmean(err_class), statistics.fmean(err_request), len(test))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=24, help="per task")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--methods", default="ngram,lookahead,medusa,eagle,eagle2,draft")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "1")))
    engine = _load_engine(resolve_model(args.model))
    methods = [m for m in args.methods.split(",") if m in engine.methods]
    rows = collect(engine, args.prompts, args.max_tokens, methods)
    results = evaluate(rows)
    print(f"per-request acceptance vs per-class aggregates, {args.model}, {args.prompts} "
          f"prompts per task x {len(TEMPERATURES)} temperatures, held-out: odd prompts")
    print("| method | k | MAE accept length, per-class | per-request model | held-out |")
    print("|---|---|---|---|---|")
    for method, (mae_class, mae_request, n) in results.items():
        k = next(r["k"] for r in rows if r["method"] == method)
        print(f"| {method} | {k} | {mae_class:.3f} | {mae_request:.3f} | {n} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
