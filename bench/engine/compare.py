"""`specroute bench engine --compare vllm`: the embedded engine beside vLLM CPU, per method.

The same model folder (SmolLM2-135M-Instruct, Hugging Face layout), the same held-out
prompts (`bench.workload`, seed 11: no prior, drafter or classifier was built from them),
the same methods with the same `k` (`workers.fleet.vllm_cpu.VLLM_METHODS`, or the k a
`--methods eagle:2` entry names; the drafters are the project's own, exported for vLLM by
`workers.fleet.vllm_drafters`) and the same client: each server is an HTTP server on
127.0.0.1 bound to the same cores, started alone (one at a time: a vLLM CPU server takes
~4 GB), measured, stopped. Per method the two
engines alternate which goes first, so drift over the run hits both alike.

At c = 1 every prompt is one request (tokens/s as the client sees it, end to end); at
c = 4 four requests run at once and the figure is all tokens over the wall time. Accept
length is each engine's own report: vLLM's `metrics.speculative_decoding` (per request,
`--per-request-spec-decode-metrics summary`), the embedded engine's `sglext`.

Greedy output of the two engines differs past the first near-tie (bf16/float32 rounding,
different kernels), so the tokens generated differ a little; the figure is tokens/s on the
same prompts, not the same text.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.workload import prompts
from workers.processes import free_port, stop_group, wait_http

TASKS = ("edit", "code", "chat")
SEED = 11
MODEL = "smollm2-135m-instruct"
ENGINES = ("embedded", "vllm")


def core_count(cores: str) -> int:
    """How many cores `VLLM_CPU_OMP_THREADS_BIND`'s list names ("0", "0-1", "0,2-3")."""
    count = 0
    for part in cores.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def vllm_command(python: Path, model: Path, method: str, k: int, drafter: Path | None,
                 port: int, dtype: str) -> list[str]:
    from policies.fleet import FleetPool
    from workers.fleet.launch import command_builder
    from workers.fleet.vllm_cpu import CPU_LAUNCH

    launch = {"vllm_python": str(python), "host": "127.0.0.1", "dtype": dtype, **CPU_LAUNCH,
              **({"draft_model_path": str(drafter)} if drafter else {})}
    pool = FleetPool(name=f"vllm-{method}", engine="vllm", model=MODEL, model_path=str(model),
                     method=method, k=k, launch=launch)
    return command_builder(pool, None)(port, k)


def start(engine: str, method: str, k: int, model: Path, port: int, work: Path,
          cores: str, threads: int, dtype: str) -> subprocess.Popen:
    from workers.fleet.vllm_cpu import SERVER_ENV, vllm_drafter
    from workers.fleet.vllm_env import ensure_vllm

    if engine == "vllm":
        drafter = vllm_drafter(model, method) if method in ("medusa", "eagle") else None
        argv = vllm_command(ensure_vllm(), model, method, k, drafter, port, dtype)
        env = {**os.environ, **SERVER_ENV, "VLLM_CPU_OMP_THREADS_BIND": cores}
    else:
        argv = [sys.executable, "-m", "specroute.cli", "worker", "--method", method,
                "--num-speculative-tokens", str(k), "--port", str(port), "--model", str(model),
                "--threads", str(threads)]
        env = dict(os.environ)
    log = (work / f"{engine}-{method}-k{k}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    stop_group(proc)


def accept_length(answer: dict) -> float | None:
    metrics = (answer.get("metrics") or {}).get("speculative_decoding") or {}
    if metrics.get("mean_acceptance_length") is not None:
        return float(metrics["mean_acceptance_length"])
    details = (answer.get("sglext") or {}).get("spec_tokens_details") or {}
    value = details.get("spec_accept_length")
    return float(value) if value is not None else None


def one(client: httpx.Client, body: dict) -> dict:
    started = time.perf_counter()
    reply = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - started
    reply.raise_for_status()
    answer = reply.json()
    tokens = int(answer["usage"]["completion_tokens"])
    return {"tokens": tokens, "seconds": seconds, "accept_length": accept_length(answer)}


def measure(port: int, bodies: dict[str, list[dict]]) -> dict[str, dict]:
    """{task: {"c1": tok/s, "c4": tok/s, "accept": mean accept length or None}}."""
    out: dict[str, dict] = {}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        one(client, bodies[TASKS[0]][0])  # warm-up, not measured
        for task, items in bodies.items():
            rows = [one(client, body) for body in items]
            started = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                batch = list(pool.map(lambda body: one(client, body), (items * 4)[:4]))
            wall = time.perf_counter() - started
            accepts = [r["accept_length"] for r in rows + batch if r["accept_length"]]
            out[task] = {"c1": statistics.mean(r["tokens"] / r["seconds"] for r in rows),
                         "c4": sum(r["tokens"] for r in batch) / wall,
                         "accept": statistics.mean(accepts) if accepts else None}
    return out


def entry(label: str) -> tuple[str, int]:
    """(method, k) of a --methods entry: "eagle" at the k the vLLM pool launches with
    (`VLLM_METHODS`), "eagle:2" at k 2 on both engines."""
    from workers.fleet.vllm_cpu import VLLM_METHODS

    method, _, k = label.partition(":")  # bench.engine.methods imports this module: no import back
    return method, (int(k) if k and method != "plain" else VLLM_METHODS[method])


def report(results: dict[str, dict[str, dict]], methods: list[str]) -> dict:
    """The table, and the JSON summary: per method, embedded over vLLM tokens/s (mean
    over tasks) at c = 1 and 4; per method and task, each engine's accept length and
    tokens/s over its own plain decoding at c = 1."""
    print("| method | task | embedded c1 | vLLM c1 | emb / vLLM | embedded c4 | vLLM c4 | "
          "emb / vLLM | accept emb | accept vLLM |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    over: dict[str, dict[str, float]] = {}
    speedup: dict[str, dict[str, float]] = {}
    embedded_speedup: dict[str, dict[str, float]] = {}
    accepts: dict[str, dict[str, float | None]] = {}
    for method in methods:
        emb, vll = results[f"embedded/{method}"], results[f"vllm/{method}"]
        for task in TASKS:
            e, v = emb[task], vll[task]
            acc = [f"{x['accept']:.2f}" if x["accept"] else "-" for x in (e, v)]
            print(f"| {method} | {task} | {e['c1']:.1f} | {v['c1']:.1f} | {e['c1'] / v['c1']:.2f}"
                  f" | {e['c4']:.1f} | {v['c4']:.1f} | {e['c4'] / v['c4']:.2f} | {acc[0]} |"
                  f" {acc[1]} |")
        over[method] = {c: round(statistics.mean(emb[t][c] for t in TASKS)
                                 / statistics.mean(vll[t][c] for t in TASKS), 3)
                        for c in ("c1", "c4")}
        accepts[method] = {t: emb[t]["accept"] and round(emb[t]["accept"], 3) for t in TASKS}
        if "plain" in methods:
            plain, own = results["vllm/plain"], results["embedded/plain"]
            speedup[method] = {t: round(vll[t]["c1"] / plain[t]["c1"], 3) for t in TASKS}
            embedded_speedup[method] = {t: round(emb[t]["c1"] / own[t]["c1"], 3) for t in TASKS}
    summary: dict = {"embedded_over_vllm": over, "accept_length": accepts,
                     "speedup_over_plain": embedded_speedup, "vllm_speedup_over_plain": speedup,
                     "k": {method: entry(method)[1] for method in methods}}
    summary["targets"] = targets(summary)
    print("\n| target (issue 26) | figure | verdict |\n|---|---|---|")
    for row in summary["targets"]:
        verdict = "not measured" if row["met"] is None else "met" if row["met"] else "missed"
        print(f"| {row['target']} | {row['figure']} | {verdict} |")
    return summary


def targets(summary: dict) -> list[dict]:
    """The issue's targets this run measures, each with its figure and whether it is met
    (None: the run lacks the methods). Best = the best of every method and k run."""
    def best(table: dict, task: str, methods: list[str]) -> tuple[float, str] | None:
        found = [(table[m][task], m) for m in methods if table.get(m, {}).get(task) is not None]
        return max(found) if found else None

    rows = []
    plain = summary["embedded_over_vllm"].get("plain")
    rows.append({"target": "embedded plain >= 1.0x vLLM CPU eager tokens/s at c = 1",
                 "figure": f"{plain['c1']:.2f}x" if plain else "-",
                 "met": plain["c1"] >= 1.0 if plain else None})
    speculative = [m for m in summary["k"] if m != "plain"]
    for task, goal in (("code", 1.5), ("chat", 1.3)):
        found = best(summary["speedup_over_plain"], task, speculative)
        rows.append({"target": f"best speculation >= {goal}x plain on {task} at T0",
                     "figure": f"{found[0]:.2f}x ({found[1]})" if found else "-",
                     "met": found[0] >= goal if found else None})
    eagle = [m for m in speculative if entry(m)[0] == "eagle"]
    for task in ("code", "chat"):
        found = best(summary["accept_length"], task, eagle)
        rows.append({"target": f"EAGLE accept length >= 2.5 on {task} at T0, best k",
                     "figure": f"{found[0]:.2f} ({found[1]})" if found else "-",
                     "met": found[0] >= 2.5 if found else None})
    return rows


def main(args: argparse.Namespace) -> int:
    from workers.embedded.fetch_model import ensure_smollm2
    from workers.fleet.vllm_cpu import VLLM_METHODS, cpu_dtype
    from workers.models import resolve_model

    model = resolve_model(args.model).folder or ensure_smollm2()
    methods = [m for m in (args.methods.split(",") if args.methods else list(VLLM_METHODS))
               if entry(m)[0] in VLLM_METHODS]
    n = args.prompts or (1 if args.quick else 3)
    bodies = {task: [p.chat_body(MODEL, args.max_tokens, 0.0) | {
        "return_spec_tokens_details": True} for p in prompts(task, n, SEED)] for task in TASKS}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="specroute-bench-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    cores, threads = args.cores, core_count(args.cores)
    results: dict[str, dict[str, dict]] = {}
    for i, label in enumerate(methods):
        method, k = entry(label)
        for engine in (ENGINES if i % 2 == 0 else ENGINES[::-1]):
            port = free_port()
            proc = start(engine, method, k, model, port, work, cores, threads, cpu_dtype())
            try:
                wait_http(f"http://127.0.0.1:{port}/health", 600, proc)
                results[f"{engine}/{label}"] = measure(port, bodies)
            finally:
                stop(proc)
            print(f"bench engine --compare vllm: {engine} {label} done", file=sys.stderr,
                  flush=True)
    summary = report(results, methods)
    if args.json:
        print(json.dumps({"results": results, **summary}))
    return 0
