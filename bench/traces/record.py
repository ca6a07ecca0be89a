"""Record per-request, per-drafter acceptance traces on the embedded engine.

    python -m bench.traces.record --out DIR [--methods ngram,eagle] [--k 8]
        [--max-tokens 64] [--limit N] [--model smollm2] [--prompts PATH]

Runs the model in-process, greedy, one request at a time, every prompt of
bench/traces/data/prompts.jsonl (fetched text, not in git: `python -m bench.traces.sources
--clones DIR` builds it) (categories taken in turn, so a partial run stays
balanced) once with plain decoding and once per method at k, and appends one JSON line per
request and method to DIR/traces.jsonl:

    {"id", "source", "category", "method", "k", "model", "prompt_tokens",
     "output_tokens", "steps", "accept_lengths", "drafted", "step_ms", "prefill_ms",
     "wall_s", "finish_reason", "greedy_match", "first_mismatch"}

`accept_lengths[i]` is what verify step i yielded (1..k+1: the accepted draft tokens plus
the target's own token), in order; the first output token comes from the prefill forward
and is in no step, so sum(accept_lengths) + 1 == output_tokens. `drafted[i]` is the draft
tokens step i verified (n-gram may propose fewer than k; the last steps are trimmed to the
tokens left), `step_ms[i]` its wall time. `greedy_match` says the method's output equals
plain decoding's token for token (the engine's guarantee), `first_mismatch` where it
does not; the plain row carries the output ids. An id's rows are written together once all its methods ran, so an interrupted
run loses at most one prompt and a rerun skips the ids already in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bench.traces.sources import PROMPTS, rebuild_hint

TRACES = "traces.jsonl"


def load_prompts(path: Path) -> list[dict]:
    """The prompts with categories taken in turn (the i-th of each, then the i+1-th...)."""
    by_category: dict[str, list[dict]] = {}
    with open(path) as handle:
        for line in handle:
            item = json.loads(line)
            by_category.setdefault(item["category"], []).append(item)
    columns = list(by_category.values())
    depth = max(map(len, columns), default=0)
    return [column[i] for i in range(depth) for column in columns if i < len(column)]


def recorded_ids(path: Path, methods: list[str]) -> set[str]:
    """Ids whose every method (plain included) is in the trace file."""
    seen: dict[str, set[str]] = {}
    if path.exists():
        with open(path) as handle:
            for line in handle:
                row = json.loads(line)
                seen.setdefault(row["id"], set()).add(row["method"])
    return {i for i, done in seen.items() if done >= {"plain", *methods}}


def trace(engine, ids: list[int], method: str, k: int, max_tokens: int) -> tuple[dict, list]:
    """Run one request; its trace fields and output ids."""
    from workers.embedded.engine import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0,
                            stop_token_ids=list(engine.tokenizer.stop_ids))
    accepts, drafted, step_ms = [], [], []
    started = time.perf_counter()
    gen = engine.start(ids, params, method=method, k=0 if method == "plain" else k)
    prefill_ms = None
    while not gen.finished:
        before, t0 = gen.stats.batch_draft_tokens, time.perf_counter()
        out = gen.step()
        elapsed = (time.perf_counter() - t0) * 1000
        if prefill_ms is None:
            if out.token_ids:  # the forward that gave the first token ends the prefill
                prefill_ms = (time.perf_counter() - started) * 1000
            continue
        accepts.append(len(out.token_ids))
        drafted.append(gen.stats.batch_draft_tokens - before)
        step_ms.append(round(elapsed, 2))
    return {
        "prompt_tokens": len(ids), "output_tokens": len(gen.output_ids), "steps": len(accepts),
        "accept_lengths": accepts, "drafted": drafted, "step_ms": step_ms,
        "prefill_ms": round(prefill_ms or 0.0, 2),
        "wall_s": round(time.perf_counter() - started, 4), "finish_reason": gen.finish_reason,
    }, list(gen.output_ids)


def first_mismatch(output: list[int], reference: list[int]) -> int | None:
    """The first position where two outputs differ (the shorter one's end if one is a
    prefix of the other), None where they are equal."""
    if output == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(output, reference, strict=False)) if a != b),
                min(len(output), len(reference)))


def record_prompt(engine, item: dict, methods: list[str], k: int, max_tokens: int,
                  model: str) -> list[dict]:
    """Plain first (the reference output), then every method; one row each."""
    ids = engine.tokenizer.encode_chat(item["messages"])
    rows, reference = [], None
    for method in ["plain", *methods]:
        fields, output = trace(engine, ids, method, k, max_tokens)
        if reference is None:
            reference = output
        row = {"id": item["id"], "source": item["source"], "category": item["category"],
               "method": method, "k": 0 if method == "plain" else k, "model": model,
               **fields, "greedy_match": output == reference,
               "first_mismatch": first_mismatch(output, reference)}
        if method == "plain":
            row["output_ids"] = output
        rows.append(row)
    return rows


def record(engine, prompts: list[dict], out: Path, methods: list[str], k: int,
           max_tokens: int, model: str, progress: bool = True) -> int:
    """Record every prompt not yet in out/traces.jsonl; the number recorded now."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / TRACES
    done = recorded_ids(path, methods)
    todo = [p for p in prompts if p["id"] not in done]
    started = time.monotonic()
    for n, item in enumerate(todo, 1):
        rows = record_prompt(engine, item, methods, k, max_tokens, model)
        with open(path, "a") as handle:
            handle.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        if progress:
            print(f"[traces] {n}/{len(todo)} {item['id']} ({item['category']}) "
                  f"{time.monotonic() - started:.0f}s", flush=True)
    return len(todo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", default="ngram,eagle")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None,
                        help="the first N prompts (categories in turn); done ones skipped")
    parser.add_argument("--model", default=None, help="smollm2 (default) or tiny or a folder")
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    args = parser.parse_args(argv)
    if not args.prompts.exists():
        print(rebuild_hint(args.prompts) or f"{args.prompts} is not here", file=sys.stderr)
        return 2
    import torch

    from bench.engine.methods import _load_engine
    from workers.models import resolve_model

    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "1")))
    choice = resolve_model(args.model)
    engine = _load_engine(choice)
    methods = [m for m in args.methods.split(",") if m and m != "plain"]
    missing = [m for m in methods if m not in engine.methods]
    if missing:
        parser.error(f"{choice.name} offers no {', '.join(missing)} ({', '.join(engine.methods)})")
    warm = engine.tokenizer.encode("def f(x):\n    return x\n")
    for method in ["plain", *methods]:  # lazy initialisation is not timed
        trace(engine, warm, method, args.k, 8)
    prompts = load_prompts(args.prompts)[: args.limit]
    count = record(engine, prompts, args.out, methods, args.k, args.max_tokens, choice.name)
    print(f"recorded {count} prompts into {args.out / TRACES}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
