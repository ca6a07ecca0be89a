"""`specroute bench live`: the adaptive gateway against equal homogeneous fleets and a
held-out oracle, on the embedded engine or on real vLLM CPU pools.

Per replicate, every fleet (bench/live/fleets.py; embedded: all up at once, blocks of
prompts interleaved over every configuration; vLLM: one fleet at a time, in a random
order): the adaptive gateway's (one server per method of `--methods`, the learned policy) and,
for each method of `--homogeneous`, a fleet of as many servers of that method alone,
measured at every (pool, k) configuration the policy may use there (embedded: k pinned per
request; vLLM: the pool as launched). Each fleet serves, per concurrency, the same
prompts at the same concurrency; prompts are fresh per replicate and concurrency and
held out from every prior, drafter and classifier (bench/live/prompts.py).

Before measuring, the adaptive fleet serves `--warmup` requests of other prompts (what it
learns from), split evenly over the measured concurrencies in turn (warmed at the highest
only, the policy had no traffic at the others to learn their costs from), and every
homogeneous fleet serves a few of them marked benchmark (its workers warm, nothing
learned). After a fleet's last request the bench reads its
telemetry stream: the adaptive gateway must have learned from exactly its own requests
and the homogeneous ones from none.

bench/live/stats.py turns the records into ratios with bootstrap intervals (clustered by
replicate) per stated mix (bench/live/prompts.py `MIXES`) and concurrency;
bench/live/report.py prints them. Concurrency above 1 runs only with a core per worker
(bench/live/fleets.py: each embedded worker pinned to its own core, the gateway, Redis
and the client on the rest); on a machine with fewer (`cores_needed`) those
concurrencies are dropped, said on stderr and in the JSON (`concurrency_dropped`). A run
that loses a stack (one that does not come up, or
stops mid-replicate) stops there and reports on every concurrency measured in full before
(`StackLost`), marked incomplete, rather than printing nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.live.cores import available_cores, cores_needed
from bench.live.fleets import (
    ADAPTIVE,
    BLOCK_PER_THREAD,
    Config,
    Fleet,
    Record,
    Stack,
    fleets,
    missing_ks,
    schedule,
)
from bench.live.prompts import CLASSES, HELD_OUT_CLASSES, Plan, plan
from bench.live.report import render, summarize
from workers.processes import available_gib

ENGINE_DEFAULTS = {  # --methods (the adaptive fleet), --homogeneous
    "embedded": ("plain,ngram,eagle,eagle2", "plain,ngram,eagle,eagle2"),
    "vllm": ("plain,ngram", "plain,ngram,eagle"),
}
READY_S = {"embedded": 300.0, "vllm": 900.0}


@dataclass(frozen=True, slots=True)
class Settings:
    engine: str
    methods: tuple[str, ...]
    homogeneous: tuple[str, ...]
    per_class: int
    warmup: int
    max_tokens: int
    concurrency: tuple[int, ...]
    replicates: int
    seed: int
    ks: tuple[str, ...] | None = None
    model: str | None = None
    classes: tuple[str, ...] = CLASSES
    follow_fleet: bool = False  # the adaptive fleet's servers follow the fleet planner
    prompts: str | None = None  # held-out public prompts (JSONL) the held-out classes draw

    @classmethod
    def saved(cls, fields: dict[str, Any]) -> Settings:
        """The settings `save` wrote (its JSON lists back to tuples)."""
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in fields.items()}
        return cls(**values)

    def describe(self, model: str) -> str:
        follows = " (servers follow the fleet planner)" if self.follow_fleet else ""
        return (f"engine {self.engine}, model {model}; adaptive fleet {'+'.join(self.methods)}"
                f"{follows} against {len(self.methods)} x each of {', '.join(self.homogeneous)}; "
                f"{self.per_class} fresh prompts per class, replicate and concurrency; "
                f"{self.replicates} replicate(s), seed {self.seed}; max_tokens "
                f"{self.max_tokens}; concurrency {','.join(map(str, self.concurrency))}; "
                f"warm-up {self.warmup}"
                + (f"; held-out prompts {self.prompts}" if self.prompts else ""))


class StackLost(RuntimeError):
    """A stack of a group did not come up or stopped while measuring; `records`: the
    group's concurrencies measured in full before (a concurrency it was in is dropped: its
    requests to the lost stack failed for want of a server, not of its configuration)."""

    def __init__(self, message: str, records: list[Record]) -> None:
        super().__init__(message)
        self.records = records


def _say(started: float, message: str) -> None:
    print(f"[bench live {time.monotonic() - started:6.0f}s] {message}", file=sys.stderr,
          flush=True)


def run_fleets(group: list[Fleet], settings: Settings, prompts: Plan, replicate: int,
               workdir: Path, started: float,
               progress: Callable[[list[Record]], None] | None = None,
               ) -> tuple[list[Record], list[dict]]:
    """Start the fleets' stacks (all up at once), warm them, measure every concurrency
    with each block going to every configuration of every fleet in the group in a fresh
    random order (so the machine's drift hits them alike), audit, stop."""
    stacks = [Stack(f, settings.engine, settings.model, workdir / f"r{replicate}-{f.name}",
                    follow_fleet=settings.follow_fleet and f.name == ADAPTIVE)
              for f in group]
    records: list[Record] = []
    warm: dict[str, list[Record]] = {}
    rng = random.Random(f"{settings.seed}-{replicate}-{'+'.join(f.name for f in group)}")
    try:
        for stack in stacks:
            stack.start(READY_S[settings.engine])
        pin_cores(stacks, settings.engine)
        top = max(settings.concurrency)
        for stack in stacks:
            fleet = stack.fleet
            if fleet.name == ADAPTIVE:
                warm[fleet.name] = []
                share = -(-len(prompts.warmup) // len(settings.concurrency))
                for i, conc in enumerate(settings.concurrency):
                    warm[fleet.name] += stack.run(
                        [(fleet.configs[0], prompts.warmup[i * share:(i + 1) * share])],
                        conc, replicate)
            else:  # warm the workers only: a few requests, marked benchmark
                first = prompts.warmup[: 2 * len(fleet.methods)]
                warm[fleet.name] = stack.run(
                    [(Config("warm-up", fleet.configs[0].pool), first)], top, replicate)
        _check_alive(stacks, "warming up")
        _say(started, f"replicate {replicate}: {', '.join(f.name for f in group)} up and warm")
        pairs = [(stack, config) for stack in stacks for config in stack.fleet.configs]
        for conc in settings.concurrency:
            items = prompts.measured[(replicate, conc)]
            here = []
            for (stack, config), block in schedule(items, pairs, BLOCK_PER_THREAD * conc, rng):
                here += stack.run([(config, block)], conc, replicate)
            _check_alive(stacks, f"measuring c={conc}")
            records += here
            errors = sum(1 for r in here if r.error)
            _say(started, f"replicate {replicate}: c={conc}: {len(here)} requests"
                 f"{f', {errors} failed' if errors else ''}")
            if progress is not None:
                progress(records)
        audits = []
        for stack in stacks:
            name = stack.fleet.name
            served = sum(1 for r in [*warm[name], *records] if not r.error and r.fleet == name)
            own = served if name == ADAPTIVE else 0
            audit = {"fleet": name, "replicate": replicate, "adaptive_requests": own,
                     **stack.telemetry(served)}
            audit["clean"] = audit["learned_from"] == own and (
                name != ADAPTIVE or audit["pinned"] == 0)
            audits.append(audit)
        return records, audits
    except (RuntimeError, TimeoutError) as exc:
        raise StackLost(f"replicate {replicate}, fleets "
                        f"{', '.join(f.name for f in group)}: {exc}", records) from exc
    finally:
        for stack in stacks:
            stack.stop()


def pin_cores(stacks: list[Stack], engine: str) -> bool:
    """Embedded stacks whose workers all fit a core each (one left over): pin them (one
    stack measures at a time, so every stack uses the same cores), and the bench's own
    client threads to the cores left. False: not pinned (too few cores; only
    concurrency 1 is then measured)."""
    cores = available_cores()
    if engine != "embedded" or not stacks or len(cores) < max(
            cores_needed(len(s.fleet.methods), engine) for s in stacks):
        return False
    for stack in stacks:
        stack.pin(cores)
    os.sched_setaffinity(0, set(cores[max(len(s.fleet.methods) for s in stacks):]))
    return True


def fair_concurrency(settings: Settings) -> tuple[Settings, dict[str, str]]:
    """`settings` without the concurrencies above 1 the machine cannot give a core per
    worker (see the module docstring), and why each was dropped."""
    order = fleets(settings.engine, list(settings.methods), list(settings.homogeneous),
                   settings.ks)
    needed = max(cores_needed(len(f.methods), settings.engine) for f in order)
    have = len(available_cores())
    if have >= needed:
        return settings, {}
    why = (f"{needed} cores needed (one per worker, one for the gateway, Redis and the "
           f"client), {have} available: the fleets' workers would contend"
           if settings.engine == "embedded" else
           f"{needed} cores needed (one per server), {have} available")
    dropped = {str(c): why for c in settings.concurrency if c > 1}
    kept = tuple(c for c in settings.concurrency if c <= 1)
    return replace(settings, concurrency=kept or (1,)), dropped


def _check_alive(stacks: list[Stack], during: str) -> None:
    lost = [s for s in stacks if not s.alive()]
    if lost:
        raise RuntimeError(f"stack {lost[0].fleet.name} stopped while {during} (exit "
                           f"{lost[0].proc.returncode}; see {lost[0].log.name})")


WORKER_GIB = 0.6  # one embedded SmolLM2 worker's resident memory, with some room


def groups(order: list[Fleet], engine: str) -> list[list[Fleet]]:
    """Embedded: every fleet up at once when the memory allows (an idle worker costs no
    CPU); vLLM (~5 GB a server): one fleet at a time."""
    servers = sum(len(f.methods) for f in order)
    if engine == "embedded" and servers * WORKER_GIB <= available_gib(0.0):
        return [order]
    return [[f] for f in order]


def save(path: Path, settings: Settings, model: str, records: list[Record],
         audits: list[dict]) -> None:
    path.write_text(json.dumps({
        "engine": settings.engine, "model": model, "settings": asdict(settings),
        "records": [asdict(r) for r in records], "audits": audits}))


def measure(settings: Settings, workdir: Path, records_path: Path | None = None,
            ) -> tuple[list[Record], list[dict], str, str]:
    """Every replicate's fleets: (records, audits, model, why the run stopped early or "").
    With `records_path`, the records so far are written after each concurrency (a run
    killed keeps what it measured: `--merge` reports on it); a lost stack ends the run
    with the concurrencies measured in full before it."""
    started = time.monotonic()
    prompts = plan("", settings.per_class, settings.warmup,
                   settings.concurrency, settings.replicates, settings.seed,
                   settings.max_tokens, held_out=settings.model != "tiny",
                   classes=settings.classes, prompts_file=settings.prompts)
    _say(started, f"prompts drawn: {sum(len(v) for v in prompts.measured.values())} "
         f"measured, {len(prompts.warmup)} warm-up")
    records: list[Record] = []
    audits: list[dict] = []
    model = ""
    for r in range(settings.replicates):
        order = fleets(settings.engine, list(settings.methods), list(settings.homogeneous),
                       settings.ks)
        random.Random(f"{settings.seed}-{r}").shuffle(order)
        for group in groups(order, settings.engine):
            def progress(got: list[Record], r: int = r, group: list[Fleet] = group,
                         done: list[Record] = records, audited: list[dict] = audits) -> None:
                if records_path is not None:  # a concurrency measured: keep it
                    name = _model_name(workdir / f"r{r}-{group[0].name}")
                    save(records_path, settings, name, [*done, *got], audited)

            try:
                got, audit = run_fleets(group, settings, prompts, r, workdir, started, progress)
            except StackLost as exc:
                records += exc.records
                _say(started, f"stack lost: {exc}; reporting what was measured")
                if records_path is not None:
                    save(records_path, settings, model, records, audits)
                model = model or _model_name(workdir / f"r{r}-{group[0].name}")
                return records, audits, model, str(exc)
            records += got
            audits += audit
            model = model or _model_name(workdir / f"r{r}-{group[0].name}")
            if records_path is not None:
                save(records_path, settings, model, records, audits)
    return records, audits, model, ""


def _model_name(work: Path) -> str:
    """The model a stack served ("" if it wrote no config)."""
    import yaml

    try:
        return str(yaml.safe_load((work / "config.yaml").read_text())["pools"][0]["model"])
    except OSError:
        return ""


def main(args: argparse.Namespace) -> int:
    engine = args.engine or "embedded"
    methods, homogeneous = ENGINE_DEFAULTS[engine]
    settings = Settings(
        engine=engine,
        methods=tuple((args.methods or methods).split(",")),
        homogeneous=tuple((args.homogeneous or homogeneous).split(",")),
        per_class=args.per_class or (2 if args.quick else 4),
        warmup=args.warmup if args.warmup is not None else (10 if args.quick else 60),
        max_tokens=args.max_tokens,
        concurrency=tuple(int(c) for c in (args.concurrency or "1,4").split(",")),
        replicates=args.replicates or (1 if args.quick else 3),
        seed=args.seed, model=args.model,
        ks=tuple(args.ks.split(",")) if args.ks else None,
        classes=(tuple(args.classes.split(",")) if args.classes
                 else HELD_OUT_CLASSES if args.prompts else CLASSES),
        follow_fleet=args.follow_fleet, prompts=args.prompts)
    if settings.follow_fleet and engine != "vllm":
        print("bench live: --follow-fleet needs --engine vllm (embedded workers are not "
              "supervised)", file=sys.stderr)
        return 2
    known = CLASSES + (HELD_OUT_CLASSES if settings.prompts else ())
    unknown = set(settings.classes) - set(known)
    if unknown:
        print(f"bench live: unknown classes {sorted(unknown)}; expected some of "
              f"{', '.join(known)}", file=sys.stderr)
        return 2
    if settings.prompts and not Path(settings.prompts).is_file():
        print(f"bench live: no prompts file {settings.prompts} (build one with "
              "`python -m bench.traces.heldout --clones DIR --out FOLDER`)", file=sys.stderr)
        return 2
    if settings.per_class < 2:
        print("bench live: --per-class must be >= 2 (the oracle is chosen on one half of a "
              "class's prompts and scored on the other)", file=sys.stderr)
        return 2
    incomplete = ""
    dropped: dict[str, str] = {}
    if args.merge:
        records, audits, model = [], [], ""
        for n, path in enumerate(args.merge.split(",")):
            saved = json.loads(Path(path).read_text())
            # replicates of different files are different replicates (and prompts)
            records += [Record(**{**r, "replicate": 100 * n + r["replicate"]})
                        for r in saved["records"]]
            audits += [{**a, "replicate": 100 * n + a["replicate"]} for a in saved["audits"]]
            model = saved.get("model", model)
        first = json.loads(Path(args.merge.split(",")[0]).read_text())["settings"]
        engine = first["engine"]
        settings = Settings.saved(first)
        description = (f"{len(args.merge.split(','))} record files merged, the first: "
                       f"{settings.describe(model)}")
    else:
        _warn_ks(settings)
        settings, dropped = fair_concurrency(settings)
        for conc, why in dropped.items():
            print(f"bench live: concurrency {conc} not measured: {why}", file=sys.stderr,
                  flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            records, audits, model, incomplete = measure(
                settings, Path(args.workdir or tmp), Path(args.records) if args.records else None)
        description = settings.describe(model)
    summary = summarize(records, audits, engine, incomplete)
    summary["json"]["ks_missing"] = ks_missing(settings)
    summary["json"]["concurrency_dropped"] = dropped
    print(render(summary, description))
    if args.records and not args.merge:
        save(Path(args.records), settings, model, records, audits)
    if args.json:
        print(json.dumps(summary["json"]))
    return 1 if incomplete else 0


def ks_missing(settings: Settings) -> dict[str, list[int]]:
    """Embedded: the k's the adaptive gateway may pick that the pinned grid leaves out."""
    if settings.engine != "embedded":
        return {}
    return missing_ks(list(settings.methods), list(settings.homogeneous), settings.ks)


def _warn_ks(settings: Settings) -> None:
    gaps = ks_missing(settings)
    if gaps:
        print("bench live: --ks leaves out k's the adaptive gateway may pick, which the "
              "oracle and the best homogeneous fleet then cannot choose (reported as "
              "uncovered picks): " + "; ".join(f"{m} {','.join(map(str, ks))}"
                                              for m, ks in gaps.items()),
              file=sys.stderr, flush=True)
