"""`specroute bench classifier`: the request classifier's accuracy on the hand-labelled
held-out set, and what classification and the routing decision cost per request.

Accuracy: every prompt of `tests/data/classifier_heldout.jsonl` (hand-written, never
read by `bench.training.classifier`) as the user message of a chat request; the
confusion matrix has the true class as rows. Cost: a 4 KB chat prompt that no rule
decides (rules scan, then the text model: the slowest path), then `PoolRouter.route`
with the learned policy over two pools, timed per call on this thread's CPU clock
(`time.thread_time_ns`: a preempted call is not charged for the time it waited, but it
runs on after the other process on cold caches) and on the wall clock, over all calls and
over those without a context switch, beside a fixed pure-Python yardstick
(`sum(range(5000))`) that shows how fast this machine ran at the time.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

from gateway.classifier.classify import classify, load_classifier
from gateway.config import parse_config
from gateway.pools import build_pools
from gateway.routing.policy import build_routing_policy
from gateway.routing.router import PoolRouter
from gateway.schemas import GenerationRequest, parse_request
from policies.types import TASKS

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
# Written before the rules' last changes (which were made reading its errors), and after
# them (never tuned on): docs/CLASSIFIER.md, "Hand-labelled held-out sets".
HELDOUT_SETS = (DATA / "classifier_heldout.jsonl", DATA / "classifier_heldout_fresh.jsonl")
PARAGRAPHS = (
    "The committee met on Tuesday to discuss the budget for next year, and several members "
    "raised concerns about the cost of the new library.",
    "Could you tell me more about the history of the old harbour town we visited last "
    "summer? The guide mentioned a fire in the eighteenth century.",
    "My sister thinks we should rent a cabin by the lake for the reunion, but my parents "
    "would rather stay at a hotel in town.",
)
PROMPT_4KB = "\n\n".join(PARAGRAPHS * 12)[:4096]


def chat_request(text: str) -> GenerationRequest:
    return parse_request({"model": "bench", "messages": [{"role": "user", "content": text}]},
                         "chat")


def heldout(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def accuracy(rows: list[dict]) -> dict:
    """Accuracy, the confusion matrix (rows: true, columns: predicted, order `TASKS`)
    and every miss with the classifier's reason."""
    index = {task: i for i, task in enumerate(TASKS)}
    confusion = [[0] * len(TASKS) for _ in TASKS]
    misses = []
    for row in rows:
        profile = classify(chat_request(row["text"]))
        confusion[index[row["label"]]][index[profile.task]] += 1
        if profile.task != row["label"]:
            misses.append({"text": row["text"][:100], "label": row["label"],
                           "predicted": profile.task, "reason": profile.reasons[0][:80]})
    right = sum(confusion[i][i] for i in range(len(TASKS)))
    return {"examples": len(rows), "accuracy": round(right / len(rows), 4),
            "classes": list(TASKS), "confusion": confusion, "misses": misses}


def _router() -> PoolRouter:
    config = parse_config({"pools": [
        {"name": "eagle", "engine": "sglang", "model": "bench", "method": "eagle", "k": 3,
         "workers": ["http://127.0.0.1:9"]},
        {"name": "ngram", "engine": "sglang", "model": "bench", "method": "ngram", "k": 4,
         "workers": ["http://127.0.0.1:10"]}]})
    pools = build_pools(config)
    for pool in pools.values():
        for worker in pool.workers:
            worker.healthy = True  # as if probed: routing needs an available worker
    policy = build_routing_policy("learned", config)
    return PoolRouter(pools, policy)


def _percentiles(ns: list[int]) -> dict[str, float]:
    ordered = sorted(ns)
    if not ordered:
        return {"p50_us": 0.0, "p99_us": 0.0}
    return {"p50_us": round(ordered[len(ordered) // 2] / 1000, 1),
            "p99_us": round(ordered[int(0.99 * len(ordered))] / 1000, 1)}


def _switches() -> int:
    """This thread's context switches so far, voluntary and not (Linux: RUSAGE_THREAD)."""
    usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return usage.ru_nvcsw + usage.ru_nivcsw


def timed(step: Callable[[], object], calls: int) -> dict:
    """CPU and wall p50/p99 of `calls` calls of `step`, and apart the calls that ran
    without a context switch (`undisturbed`): on a shared machine a call another process
    preempted resumes on caches that process filled (2026-12-07, load 5.5-7.6 on 2
    cores: 8% of the calls, and without them the p99 fell from 3.5x to 2.5x the p50,
    docs/results/2026-12-07-hot-path.md). The garbage collector's runs during the
    calls are counted, and left in (they are this process's own cost)."""
    collections = [0]

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections[0] += 1

    for _ in range(200):
        step()
    cpu, wall, calm, with_gc = [], [], [], 0
    gc.callbacks.append(count)
    try:
        for _ in range(calls):
            switched, collected = _switches(), collections[0]
            start_wall, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
            step()
            spent = time.thread_time_ns() - start_cpu
            wall.append(time.perf_counter_ns() - start_wall)
            cpu.append(spent)
            with_gc += collections[0] != collected
            if _switches() == switched:
                calm.append(spent)
    finally:
        gc.callbacks.remove(count)
    return {"cpu": _percentiles(cpu), "wall": _percentiles(wall),
            "undisturbed": {**_percentiles(calm), "calls": len(calm)},
            "calls": calls, "calls_with_gc": with_gc}


def cost(calls: int) -> dict:
    """CPU and wall p50/p99 of classify, route, and both, on the 4 KB prompt (`timed`),
    the collector's state, and a pure-Python yardstick timed the same way: its p99 over
    its p50 is the machine's own tail at the time."""
    request, router = chat_request(PROMPT_4KB), _router()
    profile = classify(request)
    steps = {"classify": lambda: classify(request),
             "route": lambda: router.route(request, profile),
             "classify + route": lambda: router.route(request, classify(request))}
    out: dict = {"task": profile.task, "reason": profile.reasons[0],
                 "gc": {"enabled": gc.isenabled(), "thresholds": list(gc.get_threshold()),
                        "tracked_objects": len(gc.get_objects())}}
    for name, step in steps.items():
        out[name] = timed(step, calls)
    yardstick = timed(lambda: sum(range(5000)), min(calls, 1000))
    out["yardstick_us"] = yardstick["cpu"]["p50_us"]
    out["yardstick_p99_us"] = yardstick["cpu"]["p99_us"]
    return out


def main(args: argparse.Namespace) -> int:
    load_classifier()
    qualities = {path.name: accuracy(heldout(path)) for path in HELDOUT_SETS}
    figures = cost(500 if args.quick else 5000)
    for name, quality in qualities.items():
        print(f"held-out set tests/data/{name}: {quality['examples']} hand-labelled prompts, "
              f"accuracy {quality['accuracy']:.3f}")
        print("| true \\ predicted | " + " | ".join(quality["classes"]) + " |")
        print("|---" * (len(quality["classes"]) + 1) + "|")
        for task, counts in zip(quality["classes"], quality["confusion"], strict=True):
            print(f"| {task} | " + " | ".join(map(str, counts)) + " |")
        for miss in quality["misses"]:
            print(f"  miss: {miss['label']} -> {miss['predicted']}: {miss['text']!r} "
                  f"({miss['reason']})")
    print(f"\n4 KB chat prompt ({figures['task']}, {figures['reason'][:50]}); "
          f"yardstick sum(range(5000)) p50 {figures['yardstick_us']} us, "
          f"p99 {figures['yardstick_p99_us']} us; gc {figures['gc']}")
    print("| step | CPU p50 us | CPU p99 us | undisturbed CPU p50 / p99 us (calls) | "
          "calls with a gc | wall p50 us | wall p99 us |")
    print("|---|---|---|---|---|---|---|")
    for name in ("classify", "route", "classify + route"):
        row = figures[name]
        cpu, wall, calm = row["cpu"], row["wall"], row["undisturbed"]
        print(f"| {name} | {cpu['p50_us']} | {cpu['p99_us']} | {calm['p50_us']} / "
              f"{calm['p99_us']} ({calm['calls']} of {row['calls']}) | {row['calls_with_gc']} "
              f"| {wall['p50_us']} | {wall['p99_us']} |")
    path = getattr(args, "categories", None)
    by_category = categories(Path(path)) if path else {}
    if by_category:
        tasks = ("chat", "code", "structured", "edit")
        print(f"\n{path}: the task given, per category")
        print("| category | " + " | ".join(tasks) + " |")
        print("|---" * (len(tasks) + 1) + "|")
        for category, counts in sorted(by_category.items()):
            print(f"| {category} | " + " | ".join(str(counts.get(t, 0)) for t in tasks) + " |")
    if args.json:
        print(json.dumps({"heldout": qualities, "cost": figures, "categories": by_category}))
    return 0


def categories(path: Path) -> dict[str, dict[str, int]]:
    """The task `classify` gives each prompt of a JSONL of `{category, messages}`, counted
    per category."""
    out: dict[str, dict[str, int]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        request = parse_request({"model": "m", "messages": row["messages"]}, "chat")
        counts = out.setdefault(row["category"], {})
        task = classify(request).task
        counts[task] = counts.get(task, 0) + 1
    return out
