"""How many tokens a drafter gets accepted per step, on two kinds of held-out prompts.

    python -m bench.engine.acceptance [--methods eagle:3,eagle2:8,medusa:2] [--prompts 6]
        [--max-tokens 48] [--held-out runs/smollm2-magpie:3 ...] [--candidate DIR] [--json]

In-process, greedy (T 0), SmolLM2 on the engine's serving path, each answer until its
stop token or --max-tokens; accept length = tokens / verify steps (the step's bonus token
included, as `specroute bench engine` counts it). Prompt sets, none of them trained on:
- `workload`: the benchmark's prompts (`bench.workload`, seed 11, --prompts a task: code,
  structured, chat), the ones `specroute bench engine` measures;
- each `--held-out FOLDER:N`: the prompts of the first N shards of a data folder (those
  the trainer holds out with `--holdout-shards N`), per task: `distill_data`'s templated
  prompts, or a magpie run's queries (prompts the target wrote).
Rows for the shipped drafters and, with --candidate (a folder holding `eagle/` and
`medusa/` as `train_smollm2_drafters --export --out DIR` writes them), for those too, on
the same model in the same run. Timing is not measured here (`specroute bench engine`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

WORKLOAD_SEED = 11
WORKLOAD_TASKS = ("code", "structured", "chat")


def held_out(spec: str) -> tuple[Path, int]:
    """"FOLDER:N" as (folder, N); "FOLDER" holds out 1."""
    folder, _, count = spec.rpartition(":") if ":" in spec else (spec, "", "1")
    return Path(folder), int(count)


def prompt_sets(tokenizer, prompts: int, folders: Sequence[tuple[Path, int]] = (),
                ) -> dict[str, list[list[int]]]:
    """{"<set>/<task>": [prompt ids]}: the workload's, then each folder's held-out shards'
    (named by the folder)."""
    from bench.training.drafters.smollm2_data import split_shards
    from bench.workload import prompts as workload_prompts

    sets = {f"workload/{task}": [tokenizer.encode_chat(list(p.messages))
                                 for p in workload_prompts(task, prompts, WORKLOAD_SEED)]
            for task in WORKLOAD_TASKS}
    for folder, count in folders:
        _, shards = split_shards([folder], [count])
        rows = [json.loads(line) for shard in shards for line in shard.read_text().splitlines()]
        for task in WORKLOAD_TASKS:
            chosen = [r["prompt_ids"] for r in rows if r["task"] == task]
            if chosen:
                sets[f"{folder.name}/{task}"] = chosen
    return sets


def accept_length(engine, prompts: list[list[int]], method: str, k: int,
                  max_tokens: int) -> tuple[float, int]:
    """(tokens per verify step, tokens) over the prompts' greedy answers."""
    from workers.embedded.engine import SamplingParams

    tokens = steps = 0
    for ids in prompts:
        params = SamplingParams(max_new_tokens=max_tokens, temperature=0.0, seed=0,
                                stop_token_ids=list(engine.tokenizer.stop_ids))
        gen = engine.start(ids, params, method=method, k=k)
        while not gen.finished:
            gen.step()
        tokens += gen.stats.completion_tokens
        steps += gen.stats.verify_steps
    return (tokens / steps if steps else 0.0), tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="eagle:3,eagle2:8,medusa:2")
    p.add_argument("--prompts", type=int, default=6, help="workload prompts a task")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--held-out", action="append", default=[], metavar="FOLDER:N",
                   help="also the prompts of a data folder's first N (held-out) shards")
    p.add_argument("--candidate", type=Path, default=None,
                   help="drafters to measure beside the shipped ones")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    import torch

    from workers.embedded.engine import Engine
    from workers.embedded.fetch_model import ensure_smollm2
    from workers.embedded.speculative.methods import load_methods

    torch.set_num_threads(1)
    shipped = Engine(model_dir=ensure_smollm2())
    engines = {"shipped": shipped}
    if args.candidate is not None:
        engines["candidate"] = Engine.from_model(
            shipped.model, shipped.tokenizer, methods=load_methods(args.candidate, shipped.model))
    sets = prompt_sets(shipped.tokenizer, args.prompts, [held_out(h) for h in args.held_out])
    rows = []
    for label in args.methods.split(","):
        method, _, k = label.partition(":")
        for drafters, engine in engines.items():
            for name, prompts in sets.items():
                value, tokens = accept_length(engine, prompts, method, int(k or 3),
                                              args.max_tokens)
                rows.append({"method": label, "drafters": drafters, "set": name,
                             "prompts": len(prompts), "tokens": tokens,
                             "accept_length": round(value, 2)})
                print(f"[bench acceptance] {label} {drafters} {name}: {value:.2f}",
                      file=sys.stderr, flush=True)
    names = list(sets)
    print("| method | drafters | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for label in args.methods.split(","):
        for drafters in engines:
            cells = {r["set"]: r for r in rows if r["method"] == label and r["drafters"] == drafters}
            print(f"| {label} | {drafters} | "
                  + " | ".join(f"{cells[n]['accept_length']:.2f}" for n in names) + " |")
    print(f"prompts: {', '.join(f'{n} {len(sets[n])}' for n in names)}; greedy, up to "
          f"{args.max_tokens} tokens")
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
