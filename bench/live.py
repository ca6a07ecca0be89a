"""`specroute bench live`: the mixed workload through a real stack, adaptive vs fixed pools.

Starts `specroute up` (or uses `--url`), sends `WARMUP_ROUNDS` warm-up passes so the policy
sees live acceptance, then measures the same mixed workload (code, JSON, chat at temperature 0 and
0.8) through the adaptive gateway and pinned to each pool in turn (`x-specroute-pool`),
interleaved request by request so machine noise hits every configuration alike.
Tokens/s = completion tokens / wall time of sequential requests (batch 1).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import httpx

from bench.workload import TASKS, prompts
from specroute.procs import free_port, wait_http

TEMPERATURES = (0.0, 0.8)
MODEL = "specroute-tiny"
WARMUP_ROUNDS = 2  # passes over the workload (other prompts) before measuring


def _workload(per_cell: int, seed: int) -> list[tuple[str, float, dict]]:
    items = []
    for task in TASKS:
        for temperature in TEMPERATURES:
            for i, prompt in enumerate(prompts(task, per_cell, seed)):
                body = prompt.chat_body(MODEL, max_tokens=64, temperature=temperature)
                body["seed"] = seed + i
                items.append((task, temperature, body))
    return items


def _pools(client: httpx.Client, body: dict) -> list[str]:
    explained = client.post("/v1/routing/explain", json=body).json()
    return [c["pool"] if isinstance(c, dict) else c for c in explained.get("candidates", [])
            if not isinstance(c, dict) or c.get("eligible", True)]


def _send(client: httpx.Client, body: dict, pool: str | None) -> tuple[int, float, str]:
    headers = {"x-specroute-pool": pool} if pool else {}
    t0 = time.perf_counter()
    resp = client.post("/v1/chat/completions", json=body, headers=headers)
    elapsed = time.perf_counter() - t0
    resp.raise_for_status()
    data = resp.json()
    return data["usage"]["completion_tokens"], elapsed, data.get("specroute", {}).get("pool", "")


def measure(url: str, per_cell: int, seed: int) -> dict:
    work = _workload(per_cell, seed)
    with httpx.Client(base_url=url, timeout=120) as client:
        pools = _pools(client, work[0][2])
        for round_ in range(WARMUP_ROUNDS):  # warm-up: the policy learns from its own picks
            for _task, _t, body in _workload(per_cell, seed + 1000 + round_):
                _send(client, body, None)
        configs = ["adaptive", *pools]
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        per_class: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        chosen: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for task, temperature, body in work:
            cls = f"{task}/t{temperature:g}"
            for config in configs:
                tokens, seconds, pool = _send(client, body, None if config == "adaptive" else config)
                totals[config][0] += tokens
                totals[config][1] += seconds
                per_class[(config, cls)][0] += tokens
                per_class[(config, cls)][1] += seconds
                if config == "adaptive":
                    chosen[cls][pool] += 1
    rates = {c: t[0] / t[1] for c, t in totals.items()}
    fixed = {c: r for c, r in rates.items() if c != "adaptive"}
    best = max(fixed, key=fixed.get)
    plain = next((c for c in fixed if c.endswith("plain")), best)
    classes = sorted({cls for _, cls in per_class})
    return {
        "rows": [{"config": c, "tokens_per_s": round(r, 1), "vs_plain": round(r / rates[plain], 3)}
                 for c, r in sorted(rates.items(), key=lambda kv: -kv[1])],
        "per_class": {cls: {c: round(per_class[(c, cls)][0] / per_class[(c, cls)][1], 1)
                            for c in configs} for cls in classes},
        "adaptive_choices": {cls: dict(v) for cls, v in chosen.items()},
        "best_fixed": best,
        "adaptive_vs_best_fixed": round(rates["adaptive"] / fixed[best], 3),
        "adaptive_vs_plain": round(rates["adaptive"] / rates[plain], 3),
        "requests_per_config": len(work),
    }


def _print(result: dict) -> None:
    print(f"live benchmark: {result['requests_per_config']} requests per configuration, "
          "sequential, max_tokens 64")
    print("| configuration | tokens/s | vs plain |")
    print("|---|---|---|")
    for row in result["rows"]:
        print(f"| {row['config']} | {row['tokens_per_s']:.0f} | {row['vs_plain']:.2f}x |")
    configs = [row["config"] for row in result["rows"]]
    print("\n| class | " + " | ".join(configs) + " | adaptive chose |")
    print("|---|" + "---|" * (len(configs) + 1))
    for cls, rates in result["per_class"].items():
        picks = ", ".join(f"{p} x{n}" for p, n in result["adaptive_choices"].get(cls, {}).items())
        print(f"| {cls} | " + " | ".join(f"{rates[c]:.0f}" for c in configs) + f" | {picks} |")
    print(f"\nadaptive vs best fixed ({result['best_fixed']}): {result['adaptive_vs_best_fixed']:.3f}x")


def main(args: argparse.Namespace) -> int:
    per_cell = 1 if args.quick else 6
    if args.url:
        result = measure(args.url, per_cell, args.seed)
    else:
        port = free_port()
        with tempfile.TemporaryDirectory() as workdir:
            proc = subprocess.Popen([sys.executable, "-m", "specroute.cli", "up", "--port", str(port),
                                     "--workdir", workdir], start_new_session=True)
            try:
                url = f"http://127.0.0.1:{port}"
                try:
                    wait_http(f"{url}/ready", 180, proc, "specroute up")
                except (RuntimeError, TimeoutError) as exc:
                    print(f"specroute up did not become ready: {exc}", file=sys.stderr)
                    return 1
                result = measure(url, per_cell, args.seed)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    _print(result)
    if args.json:
        print(json.dumps(result))
    return 0
