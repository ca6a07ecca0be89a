"""`python -m bench.engine.hybrid_variants`: the hybrid drafter's branch choice, variants
side by side with n-gram, EAGLE and plain, through `specroute bench engine`'s own rounds.

Each `--variant NAME=field=value,...` registers one more engine method, a `HybridDrafter`
with those `HybridConfig` fields (min_match, max_ngram, min_confidence, miss_backoff,
short_k, eagle_min_rate, eagle_probe, fallback_k, sync_cost, eagle_gain, copy_k, eagle_k),
on the same EAGLE head as the shipped `hybrid`; `--methods` names them like any method
(`NAME:3`). For choosing the hybrid's defaults on training prompts (`--prompt-file
bench/traces/data/prompts.jsonl`); never on the held-out ones. Besides the timed table, a load-independent one: per cell the accept
length, the draft tokens verified per step, and the speedup they imply at the model's
measured step costs: the curve by positions where `measured.json` has one
(`verify_costs`, `bench.engine.verify_cost`), else a cost per drafted token
(`draft_token_cost`).

    SPECROUTE_BENCH_THREADS=1 python -m bench.engine.hybrid_variants \\
        --prompt-file bench/traces/data/prompts.jsonl --variant b4=miss_backoff=4 \\
        --methods plain,ngram:4,eagle:3,hybrid:3,b4:3 --prompts 2 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from bench.engine.methods import (
    TEMPERATURES,
    Settings,
    _load_engine,
    format_table,
    measure,
    summarize,
    variant,
)
from bench.engine.prompt_file import file_prompts
from bench.engine.verify_cost import step_cost
from workers.models import resolve_model, weights_dir

FLOAT_FIELDS = ("min_confidence", "eagle_min_rate", "sync_cost", "eagle_gain")


def parse_variant(text: str) -> tuple[str, dict[str, float | int]]:
    """"b4=miss_backoff=4,min_match=2" -> ("b4", {"miss_backoff": 4, "min_match": 2})."""
    name, _, fields = text.partition("=")
    out: dict[str, float | int] = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        out[key] = float(value) if key in FLOAT_FIELDS else int(value)
    return name, out


def draft_token_cost(measured: dict) -> float:
    """What one drafted token adds to a verify step, as a share of a plain step: the mean
    over measured.json's batch-1 EAGLE cost rows (`specroute bench batching`) of
    (step - plain step) / (draft tokens x plain step)."""
    costs = [c for c in measured["costs"] if c["batch"] == 1]
    plain = next(c["step_s"] for c in costs if c["method"] == "plain")
    shares = [(c["step_s"] - plain) / (c["draft_tokens"] * plain)
              for c in costs if c["method"] == "eagle" and c["draft_tokens"] > 0]
    return sum(shares) / len(shares)


def modelled(rows: list[dict], token_cost: float,
             verify_costs: list[dict] | None = None) -> list[dict]:
    """Each row's load-independent speedup: accept length over the step's measured cost,
    1 + token_cost x draft tokens per step (plain: 1, 1); with `verify_costs` (the cost
    curve by positions, `bench.engine.verify_cost`), the mean over the row's steps of the
    curve's cost of each step's draft length."""
    out = []
    for r in rows:
        cost = 1 + token_cost * r["draft_tokens"]
        histogram = r.get("draft_histogram") or []
        if verify_costs and sum(histogram):
            cost = sum(n * step_cost(verify_costs, d)
                       for d, n in enumerate(histogram)) / sum(histogram)
        out.append({**r, "modelled": round(r["accept_length"] / cost, 3)})
    return out


def format_modelled(rows: list[dict]) -> str:
    """Methods x cells: modelled speedup (accept length, draft tokens per step)."""
    cells = list(dict.fromkeys((r["task"], r["temperature"]) for r in rows))
    by_key = {(r["label"], r["task"], r["temperature"]): r for r in rows}
    lines = ["| method | " + " | ".join(f"{t} T{temp:g}" for t, temp in cells) + " |",
             "|---" * (len(cells) + 1) + "|"]
    for label in dict.fromkeys(r["label"] for r in rows):
        parts = [by_key[(label, *cell)] for cell in cells]
        lines.append(f"| {label} | " + " | ".join(
            f"{r['modelled']:.2f}x ({r['accept_length']:.2f}, {r['draft_tokens']:.2f})"
            for r in parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from workers.embedded.speculative.hybrid import HybridDrafter
    from workers.embedded.speculative.methods import EngineMethod

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-file", required=True)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--methods", required=True)
    parser.add_argument("--categories", default=None, help="comma-separated (default: all)")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperatures", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "2")))
    choice = resolve_model("smollm2")
    engine = _load_engine(choice)
    shipped = engine._methods["hybrid"].new_drafter()
    model, head = shipped._chain._eagle.model, shipped._chain._eagle.head
    for text in args.variant:
        name, fields = parse_variant(text)
        config = dataclasses.replace(shipped.config, **fields)
        engine._methods[name] = EngineMethod(
            name, lambda config=config: HybridDrafter(model, head, config), 3)
        print(f"{name}: {config}", file=sys.stderr)
    methods = ["plain", *[m for m in args.methods.split(",") if m != "plain"]]
    temperatures = tuple(float(t) for t in args.temperatures.split(",")) \
        if args.temperatures else TEMPERATURES
    categories = args.categories.split(",") if args.categories else None
    settings = Settings(rounds=args.rounds, prompts=args.prompts, max_tokens=args.max_tokens,
                        seed=args.seed, temperatures=temperatures, decode_only=True,
                        chosen=file_prompts(args.prompt_file, args.prompts, args.seed,
                                            categories))
    warm = engine.tokenizer.encode("def f(x):\n    return x\n")
    from bench.engine.methods import _run
    for method in methods:
        _run(engine, warm, method, 0.0, 8, 0)
    tallies = measure(engine, methods, settings, progress=True)
    rows = summarize(tallies, methods, {m: variant(m, engine.max_k) for m in methods})
    measured = weights_dir(choice.name) / "measured.json"
    if measured.is_file():
        document = json.loads(measured.read_text())
        cost = draft_token_cost(document)
        curve = document.get("verify_costs")
        rows = modelled(rows, cost, curve)
        print("modelled: a step costs its draft length's share of a plain step on the "
              "measured curve (verify_costs)" if curve else
              f"modelled: a drafted token costs {cost:.3f} of a plain step")
        print(format_modelled(rows))
    print(format_table(rows))
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
