"""`specroute bench engine`: every decoding method x request class x temperature, in rounds.

Runs the embedded engine in-process (float32, the engine's CPU default; 2 threads unless
$SPECROUTE_BENCH_THREADS says otherwise) on SmolLM2-135M-Instruct, or the bundled model
with `--model tiny`. One round runs every prompt of every cell once per method, the
methods interleaved prompt by prompt (in an order that rotates), so machine noise hits
every method alike; a method's speedup in a round is its tokens/s over plain's in the same
round on the same prompts. Each method runs with the k `specroute up` gives its pool
(policies/fleet.py), or with the k its --methods entry names (`eagle:3`; one method at
several k is several rows). Several rounds give each ratio as a median and a range, and a
difference counts as real only when the ranges do not overlap: a method against plain
(its range excludes 1.0), and the best method of a cell against the runner-up.

Besides the three request classes, a `schema` class runs the structured prompts under a
JSON schema built from the fields each prompt names (constrained decoding, llguidance):
greedy output is the same tokens for every method, so what differs from `structured` is
what the grammar does to acceptance (forced tokens are free for plain decoding and
cheap to accept; drafts the grammar forbids are pruned before the forward). It stops
where the schema ends rather than at max tokens.

`--prompt-file PATH` runs the prompts of a JSONL file by category instead (one cell per
category, no schema cell; bench/engine/prompt_file.py), timing each request from its first
token on, so that a long prompt's prefill does not dilute the ratios; `--temperatures`
picks the temperatures (default 0,0.8).

`--write-measured PATH` writes the figures as JSON, the worker's prior for the policy:
{"model", "source", "measured_at", "device", "entries": [{"method", "k", "task",
"temperature", "accept_length", "tokens_per_s", "speedup", "requests"}]}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field

from bench.engine.measured import device_description, measured_document, write_measured
from bench.engine.prompt_file import file_prompts
from bench.workload import TASKS, Prompt, prompts
from policies.methods import default_k
from workers.models import ModelChoice, resolve_model

TEMPERATURES = (0.0, 0.8)
SCHEMA_TASK = "schema"  # structured prompts under a JSON schema; not a policy class
Cell = tuple[str, float]  # (task, temperature)
# The schema of each field the structured prompts may name (bench/workload.py _FIELDS);
# strings and numbers are bounded so that a small model cannot run on inside one.
FIELD_SCHEMAS: dict[str, dict] = {
    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "name": {"type": "string", "maxLength": 24},
    "email": {"type": "string", "maxLength": 32},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24},
    "active": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    "order_id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "status": {"enum": ["open", "shipped", "closed"]},
    "total": {"type": "integer", "minimum": 0, "maximum": 9999},
}


def schema_for(prompt: Prompt) -> str:
    """A strict JSON schema with the fields the prompt asks for (id, name, email if none)."""
    text = prompt.messages[-1]["content"]
    fields = [f for f in FIELD_SCHEMAS if f in text.replace("order_id", "")] or \
        ["id", "name", "email"]
    if "order_id" in text:
        fields.append("order_id")
    return json.dumps({"type": "object", "properties": {f: FIELD_SCHEMAS[f] for f in fields},
                       "required": fields, "additionalProperties": False})


@dataclass(frozen=True)
class Settings:
    rounds: int
    prompts: int  # per cell and round
    max_tokens: int
    seed: int
    # --prompt-file: prompts per category of that file (no schema cell); None: bench/workload.py's
    chosen: dict[str, list[Prompt]] | None = None
    temperatures: tuple[float, ...] = TEMPERATURES
    # time from the first token on (the policy's tokens/s), not prefill: a long prompt's
    # prefill would otherwise dilute every method's ratio towards 1
    decode_only: bool = False


@dataclass
class Tally:
    """One method in one cell: per-round tokens and seconds, and verify steps and the
    draft tokens they verified overall."""

    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    steps: int = 0
    requests: int = 0
    drafted: int = 0
    draft_histogram: list[int] = field(default_factory=list)  # steps by draft tokens

    def add_histogram(self, histogram: list[int]) -> None:
        self.draft_histogram.extend([0] * (len(histogram) - len(self.draft_histogram)))
        for drafted, steps in enumerate(histogram):
            self.draft_histogram[drafted] += steps

    def add(self, round_index: int, tokens: int, seconds: float, steps: int) -> None:
        while len(self.tokens) <= round_index:
            self.tokens.append(0)
            self.seconds.append(0.0)
        self.tokens[round_index] += tokens
        self.seconds[round_index] += seconds
        self.steps += steps
        self.requests += 1

    def rates(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds, strict=True)]


def split_label(label: str) -> tuple[str, int | None]:
    """A --methods entry "eagle:3" as ("eagle", 3); "eagle" as ("eagle", None)."""
    method, _, k = label.partition(":")
    return method, int(k) if k else None


def variant(label: str, max_k: int) -> tuple[str, int]:
    """(method, k) of a --methods entry: "eagle" runs at the k `specroute up` gives its pool
    (fleet default, within the engine's), "eagle:3" at k 3."""
    method, k = split_label(label)
    if method == "plain":
        return method, 0
    return method, min(default_k(method) if k is None else k, max_k)


def _k(engine, method: str) -> int:
    """The k `specroute up` gives the method's pool (fleet default), within the engine's."""
    return variant(method, engine.max_k)[1]


def _run(engine, ids: list[int], label: str, temperature: float, max_tokens: int, seed: int,
         schema: str | None = None):
    from workers.embedded.api import Constraint
    from workers.embedded.engine import SamplingParams

    if schema is None:
        params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, seed=seed,
                                ignore_eos=True)
    else:  # stops where the schema ends
        params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, seed=seed,
                                stop_token_ids=list(engine.tokenizer.stop_ids),
                                constraint=Constraint("json_schema", schema))
    method, k = variant(label, engine.max_k)
    t0 = time.perf_counter()
    gen = engine.start(ids, params, method=method, k=k)
    while not gen.finished:
        gen.step()
    return gen.stats, time.perf_counter() - t0


def _timed(stats, seconds: float, decode_only: bool) -> tuple[int, float, int]:
    """(tokens, seconds, verify steps) of one request; decode only: after the first token."""
    if not decode_only or stats.first_token_at is None or stats.completion_tokens < 2:
        return stats.completion_tokens, seconds, stats.verify_steps
    decode = time.perf_counter() - stats.first_token_at  # the request ended just now
    return stats.completion_tokens - 1, decode, stats.verify_steps - 1


def measure(engine, methods: list[str], settings: Settings,
            progress: bool = False) -> dict[Cell, dict[str, Tally]]:
    """Run every round; tallies per cell and method."""
    if settings.chosen is not None:
        chosen = dict(settings.chosen)
    else:
        chosen = {task: prompts(task, settings.prompts, settings.seed) for task in TASKS}
        chosen[SCHEMA_TASK] = chosen["structured"]
    cells = [(task, t) for task in chosen for t in settings.temperatures]
    encoded = {task: [engine.tokenizer.encode_chat(list(p.messages)) for p in ps]
               for task, ps in chosen.items()}
    schemas = {task: [schema_for(p) if task == SCHEMA_TASK else None for p in ps]
               for task, ps in chosen.items()}
    tallies: dict[Cell, dict[str, Tally]] = {c: defaultdict(Tally) for c in cells}
    started = time.monotonic()
    for r in range(settings.rounds):
        for task, temperature in cells:
            for i, ids in enumerate(encoded[task]):
                shift = (r + i) % len(methods)
                for method in methods[shift:] + methods[:shift]:
                    stats, seconds = _run(engine, ids, method, temperature, settings.max_tokens,
                                          settings.seed + 1000 * r + i, schemas[task][i])
                    tally = tallies[(task, temperature)][method]
                    tally.add(r, *_timed(stats, seconds, settings.decode_only))
                    tally.drafted += stats.num_proposed_drafts
                    tally.add_histogram(stats.draft_histogram)
        if progress:
            print(f"[bench engine] round {r + 1}/{settings.rounds} done in "
                  f"{time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return tallies


def summarize(tallies: dict[Cell, dict[str, Tally]], methods: list[str],
              variants: dict[str, tuple[str, int]]) -> list[dict]:
    """One row per (--methods entry, cell): accept length, median tokens/s, speedup median
    and range; "label" is the entry ("eagle:3"), "method" and "k" what it ran."""
    rows = []
    for (task, temperature), by_method in tallies.items():
        plain = by_method["plain"].rates()
        for method in methods:
            tally = by_method[method]
            rates = tally.rates()
            ratios = [m / p for m, p in zip(rates, plain, strict=True)]
            rows.append({
                "label": method, "method": variants[method][0], "k": variants[method][1],
                "task": task, "temperature": temperature,
                "accept_length": round(sum(tally.tokens) / max(tally.steps, 1), 2),
                "draft_tokens": round(tally.drafted / max(tally.steps, 1), 2),  # per step
                "tokens_per_s": round(statistics.median(rates), 1),
                "speedup": round(statistics.median(ratios), 3),
                "speedup_min": round(min(ratios), 3), "speedup_max": round(max(ratios), 3),
                "requests": tally.requests,
                "draft_histogram": list(tally.draft_histogram),
            })
    return rows


def _cells(rows: list[dict]) -> list[Cell]:
    return list(dict.fromkeys((r["task"], r["temperature"]) for r in rows))


def verdicts(rows: list[dict]) -> list[str]:
    """Per cell: the best method, and whether its lead over the runner-up and over plain
    is real (ranges over rounds do not overlap)."""
    lines = []
    for task, temperature in _cells(rows):
        cell = sorted((r for r in rows if (r["task"], r["temperature"]) == (task, temperature)),
                      key=lambda r: r["speedup"], reverse=True)
        best, second = cell[0], cell[1] if len(cell) > 1 else None
        text = f"{task} T{temperature:g}: best {best['label']} {best['speedup']:.2f}x"
        if best["label"] != "plain":
            real = best["speedup_min"] > 1.0
            text += " (real vs plain)" if real else " (not distinguishable from plain)"
        if second is not None:
            apart = best["speedup_min"] > second["speedup_max"]
            text += (f"; ahead of {second['label']} {second['speedup']:.2f}x "
                     + ("(real)" if apart else "(ranges overlap: a tie)"))
        slower = [r["label"] for r in cell if r["speedup_max"] < 1.0]
        if slower:
            text += f"; slower than plain for sure: {', '.join(slower)}"
        lines.append(text)
    return lines


def format_table(rows: list[dict]) -> str:
    """Methods x cells: speedup median [min-max over rounds] (accept length)."""
    cells = _cells(rows)
    methods = list(dict.fromkeys(r["label"] for r in rows))
    by_key = {(r["label"], r["task"], r["temperature"]): r for r in rows}
    head = "| method | " + " | ".join(f"{t} T{temp:g}" for t, temp in cells) + " |"
    lines = [head, "|---" * (len(cells) + 1) + "|"]
    for method in methods:
        parts = []
        for task, temp in cells:
            r = by_key[(method, task, temp)]
            if method == "plain":
                parts.append(f"1.00x ({r['accept_length']:.1f})")
                continue
            mark = "**" if r["speedup_min"] > 1.0 or r["speedup_max"] < 1.0 else ""
            parts.append(f"{mark}{r['speedup']:.2f}x{mark} [{r['speedup_min']:.2f}–"
                         f"{r['speedup_max']:.2f}] ({r['accept_length']:.1f})")
        lines.append(f"| {method} | " + " | ".join(parts) + " |")
    plain = [f"{by_key[('plain', t, temp)]['tokens_per_s']:.1f}" for t, temp in cells]
    lines.append("| *plain tokens/s* | " + " | ".join(plain) + " |")
    return "\n".join(lines)


def _load_engine(choice: ModelChoice):
    from workers.embedded.engine import Engine

    folder = choice.folder
    if folder is None:
        from workers.embedded.fetch_model import ensure_smollm2

        folder = ensure_smollm2()
    return Engine(model_dir=folder)


def _source(args: argparse.Namespace, model: str, settings: Settings, methods: list[str]) -> str:
    return (f"specroute bench engine --model {model} --rounds {settings.rounds} --prompts "
            f"{settings.prompts} --max-tokens {settings.max_tokens} --seed {settings.seed} "
            f"--methods {','.join(methods)}")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "compare", None) == "vllm":
        from bench.engine.compare import main as compare

        return compare(args)
    import torch

    if getattr(args, "prompt_file", None) and args.write_measured:
        print("--write-measured writes the policy's prior: not from --prompt-file prompts",
              file=sys.stderr)
        return 2
    choice = resolve_model(args.model)
    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "2")))
    engine = _load_engine(choice)
    wanted = args.methods.split(",") if args.methods else list(engine.methods)
    methods = ["plain", *[m for m in wanted if m != "plain"]]
    n_prompts = args.prompts or (1 if args.quick else 2)
    prompt_file = getattr(args, "prompt_file", None)
    temperatures = tuple(float(t) for t in args.temperatures.split(",")) \
        if getattr(args, "temperatures", None) else TEMPERATURES
    settings = Settings(rounds=args.rounds or (1 if args.quick else 3), prompts=n_prompts,
                        max_tokens=16 if args.quick else args.max_tokens, seed=args.seed,
                        chosen=file_prompts(prompt_file, n_prompts, args.seed) if prompt_file else None,
                        temperatures=temperatures, decode_only=bool(prompt_file))
    # Warm up every method once so lazy initialisation is not timed.
    warm = engine.tokenizer.encode("def f(x):\n    return x\n")
    for method in methods:
        _run(engine, warm, method, 0.0, 8, 0)
    tallies = measure(engine, methods, settings, progress=not args.json)
    rows = summarize(tallies, methods, {m: variant(m, engine.max_k) for m in methods})
    dtype = str(engine.model.lm_head.weight.dtype).removeprefix("torch.")
    threads = torch.get_num_threads()
    print(f"engine benchmark: {choice.name}, {dtype}, {threads} threads, {settings.rounds} "
          f"interleaved rounds x {settings.prompts} prompts x {settings.max_tokens} tokens "
          "per cell and method" + (f"; prompts of {prompt_file} by category, decode time only "
                                   "(after the first token)" if prompt_file else ""))
    print("cells: speedup over plain tokens/s, median [range over rounds] (accept length); "
          "bold: the range excludes 1.00x")
    print(format_table(rows))
    print("\n".join(verdicts(rows)))
    if args.write_measured:
        document = measured_document(choice.name, _source(args, choice.name, settings, methods),
                                     device_description(f"{threads} torch threads, {dtype}"),
                                     rows)
        write_measured(args.write_measured, document)
        print(f"wrote {args.write_measured}")
    if args.json:
        print(json.dumps({"model": choice.name, "rows": rows, "threads": threads,
                          "rounds": settings.rounds, "prompts_per_cell": settings.prompts,
                          "max_tokens": settings.max_tokens}))
    return 0
