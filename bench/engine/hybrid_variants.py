"""`python -m bench.engine.hybrid_variants`: the hybrid drafter's branch choice, variants
side by side with n-gram, EAGLE and plain, through `specroute bench engine`'s own rounds.

Each `--variant NAME=field=value,...` registers one more engine method, a `HybridDrafter`
with those `HybridConfig` fields (min_match, max_ngram, min_confidence, miss_backoff), on
the same EAGLE head as the shipped `hybrid`; `--methods` names them like any method
(`NAME:3`). For choosing the hybrid's defaults on training prompts
(`--prompt-file bench/traces/data/prompts.jsonl`); never on the held-out ones.

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
from workers.models import resolve_model


def parse_variant(text: str) -> tuple[str, dict[str, float | int]]:
    """"b4=miss_backoff=4,min_match=2" -> ("b4", {"miss_backoff": 4, "min_match": 2})."""
    name, _, fields = text.partition("=")
    out: dict[str, float | int] = {}
    for item in filter(None, fields.split(",")):
        key, _, value = item.partition("=")
        out[key] = float(value) if key == "min_confidence" else int(value)
    return name, out


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
    engine = _load_engine(resolve_model("smollm2"))
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
    print(format_table(rows))
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
