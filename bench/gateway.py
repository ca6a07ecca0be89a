"""`specroute bench gateway`: what the gateway adds on top of a direct call, side by side.

Starts a trivial SGLang-shaped upstream (`bench.upstream`) and a real gateway in front of
it, then measures, in one run on this machine: sequential latency (p50/p99) and requests/s
at concurrency 32, direct to the upstream vs through the gateway, non-streaming and
streaming, with a minimal raw-ASGI + aiohttp pass-through (`bench.minproxy`) beside it:
the floor any Python proxy pays here. The load client shares the cores with the servers,
as in the figures of docs/GATEWAY.md ("Overhead").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

from specroute.procs import free_port, wait_http


async def _sequential(session: aiohttp.ClientSession, url: str, body: dict, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.post(url, json=body) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")
        times.append((time.perf_counter() - t0) * 1000)
    return times


async def _throughput(session: aiohttp.ClientSession, url: str, body: dict, seconds: float,
                      concurrency: int) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            async with session.post(url, json=body) as resp:
                await resp.read()
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(upstream: str, minproxy: str, gateway: str, n: int,
                   seconds: float) -> list[dict]:
    direct = {"text": "hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    via = {"model": "bench", "prompt": "hello", "max_tokens": 8, "temperature": 0}
    stream_direct, stream_via = {**direct, "stream": True}, {**via, "stream": True}
    cases = [
        ("direct /generate", f"{upstream}/generate", direct),
        ("minimal proxy /generate", f"{minproxy}/generate", direct),
        ("gateway /v1/completions", f"{gateway}/v1/completions", via),
        ("direct /generate stream", f"{upstream}/generate", stream_direct),
        ("minimal proxy /generate stream", f"{minproxy}/generate", stream_direct),
        ("gateway /v1/completions stream", f"{gateway}/v1/completions", stream_via),
    ]
    rows = []
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        for name, url, body in cases:
            await _sequential(session, url, body, 50)  # warm-up
            lat = await _sequential(session, url, body, n)
            rps = await _throughput(session, url, body, seconds, 32)
            rows.append({"path": name, "p50_ms": round(_pct(lat, 0.5), 3),
                         "p99_ms": round(_pct(lat, 0.99), 3), "rps_c32": round(rps)})
    for direct_row in (0, 3):  # each proxy's p50 over the direct call in the same group
        for i in (direct_row + 1, direct_row + 2):
            rows[i]["added_p50_ms"] = round(rows[i]["p50_ms"] - rows[direct_row]["p50_ms"], 3)
    return rows


def main(args: argparse.Namespace) -> int:
    n, seconds = (200, 1.0) if args.quick else (2000, 5.0)
    up_port, gw_port, min_port = free_port(), free_port(), free_port()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        config = {"server": {"host": "127.0.0.1", "port": gw_port, "log_level": "warning"},
                  "pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                             "method": "eagle", "k": 3,
                             "workers": [f"http://127.0.0.1:{up_port}"]}]}
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        try:
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.upstream", "--port",
                                           str(up_port)]))
            wait_http(f"http://127.0.0.1:{up_port}/health", 30, procs[-1], "upstream")
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.minproxy", "--port",
                                           str(min_port), "--upstream",
                                           f"http://127.0.0.1:{up_port}"]))
            wait_http(f"http://127.0.0.1:{min_port}/health", 30, procs[-1], "minimal proxy")
            procs.append(subprocess.Popen([sys.executable, "-m", "specroute.cli", "gateway",
                                           "--config", str(path)]))
            wait_http(f"http://127.0.0.1:{gw_port}/ready", 30, procs[-1], "gateway")
            rows = asyncio.run(_measure(f"http://127.0.0.1:{up_port}",
                                        f"http://127.0.0.1:{min_port}",
                                        f"http://127.0.0.1:{gw_port}", n, seconds))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    print(f"gateway benchmark: {n} sequential requests, then {seconds:g}s at concurrency 32")
    print("| path | p50 ms | p99 ms | added p50 ms | req/s at c32 |")
    print("|---|---|---|---|---|")
    for r in rows:
        added = f"{r['added_p50_ms']:+.3f}" if "added_p50_ms" in r else ""
        print(f"| {r['path']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {added} | {r['rps_c32']} |")
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0
