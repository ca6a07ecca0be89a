"""`specroute bench gateway`: specroute beside other gateways, in one run.

Starts a trivial upstream (`bench.upstream`) and, in front of it, the gateway (its
default learned policy, one `engine: sglang` pool), a minimal raw-ASGI + aiohttp
pass-through (`bench.minproxy`, the floor any Python proxy pays here), sglang-router and
LiteLLM proxy (`bench.peers`, installed into their own virtualenvs on first use). One load
client sends the same `/v1/chat/completions` body everywhere; rounds are interleaved (each
round visits every path in turn), so a slow spell of the shared machine hits all of them.
Per path, streaming and not: sequential p50/p99 and the p50 added over the direct call,
then requests/s at concurrency 32. The load client shares the cores with the servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench import peers
from specroute.procs import free_port, wait_http

CONCURRENCY = 32
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8, "temperature": 0}
HEADERS = {"Authorization": f"Bearer {peers.API_KEY}"}


@dataclass
class Target:
    name: str
    url: str = ""
    error: str = ""  # why it is not measured (not installed, did not start)
    latency: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    done: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    seconds: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})


async def _call(session: aiohttp.ClientSession, url: str, body: dict) -> None:
    async with session.post(url, json=body, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")


async def _sequential(session: aiohttp.ClientSession, url: str, body: dict,
                      n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await _call(session, url, body)
        times.append((time.perf_counter() - t0) * 1000)
    return times


async def _throughput(session: aiohttp.ClientSession, url: str, body: dict,
                      seconds: float) -> tuple[int, float]:
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await _call(session, url, body)
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
    return done, time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(targets: list[Target], n: int, seconds: float, rounds: int) -> None:
    live = [t for t in targets if not t.error]
    connector = aiohttp.TCPConnector(limit=2 * CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        for target in live:  # warm-up: connections, caches, lazy imports
            for stream in (False, True):
                await _sequential(session, target.url, {**BODY, "stream": stream}, 50)
        for r in range(rounds):
            order = live[r % len(live):] + live[:r % len(live)]
            for stream in (False, True):
                body = {**BODY, "stream": stream}
                for target in order:
                    try:
                        target.latency[stream] += await _sequential(session, target.url,
                                                                    body, n // rounds)
                        done, spent = await _throughput(session, target.url, body,
                                                        seconds / rounds)
                    except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                        target.error = f"failed: {type(exc).__name__}: {exc}"[:120]
                        live.remove(target)
                        continue
                    target.done[stream] += done
                    target.seconds[stream] += spent


def summarize(targets: list[Target]) -> dict:
    """Rows per path and mode, plus specroute's throughput over each peer's."""
    direct = targets[0]
    rows = []
    for stream in (False, True):
        for t in targets:
            row: dict = {"path": t.name, "stream": stream}
            if t.error or not t.latency[stream]:
                rows.append({**row, "error": t.error or "not measured"})
                continue
            p50 = _pct(t.latency[stream], 0.5)
            row.update(p50_ms=round(p50, 3), p99_ms=round(_pct(t.latency[stream], 0.99), 3),
                       rps_c32=round(t.done[stream] / t.seconds[stream]))
            if t is not direct and direct.latency[stream]:
                row["added_p50_ms"] = round(p50 - _pct(direct.latency[stream], 0.5), 3)
            rows.append(row)
    out: dict = {"rows": rows}
    by = {(r["path"], r["stream"]): r for r in rows}
    for peer, key in (("sglang-router", "sglang_router"), ("litellm", "litellm")):
        for stream, suffix in ((False, ""), (True, "_stream")):
            ours, theirs = by.get(("specroute", stream)), by.get((peer, stream))
            ratio = None
            if ours and theirs and "rps_c32" in ours and "rps_c32" in theirs:
                ratio = round(ours["rps_c32"] / theirs["rps_c32"], 2)
            out[f"specroute_rps_over_{key}{suffix}"] = ratio
    return out


def _gateway_config(tmp: Path, port: int, upstream: str) -> Path:
    config = {"server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
              "pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                         "method": "eagle", "k": 3, "workers": [upstream]}]}
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _start(procs: list[subprocess.Popen], argv: list[str], ready: str, name: str,
           log: Path, env: dict | None = None, timeout: float = 60) -> None:
    with open(log, "wb") as handle:
        procs.append(subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
    wait_http(ready, timeout, procs[-1], name, log)


def _start_peer(procs: list[subprocess.Popen], peer: peers.Peer, upstream: str,
                tmp: Path) -> Target:
    try:
        venv = peers.install(peer)
    except RuntimeError as exc:
        return Target(peer.name, error=f"not installed: {exc}")
    port = free_port()
    try:
        _start(procs, peer.launch(venv, port, upstream, tmp), f"http://127.0.0.1:{port}"
               f"{peer.ready_path}", peer.name, tmp / f"{peer.name}.log", peers.environment(peer),
               timeout=180)
    except (RuntimeError, TimeoutError) as exc:
        return Target(peer.name, error=f"did not start: {str(exc).splitlines()[0][:100]}")
    return Target(peer.name, f"http://127.0.0.1:{port}/v1/chat/completions")


def run(names: list[str], n: int, seconds: float, rounds: int) -> dict:
    procs: list[subprocess.Popen] = []
    up_port, gw_port, min_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            _start(procs, [sys.executable, "-m", "bench.upstream", "--port", str(up_port)],
                   f"{upstream}/health", "upstream", tmp / "upstream.log")
            _start(procs, [sys.executable, "-m", "bench.minproxy", "--port", str(min_port),
                           "--upstream", upstream], f"http://127.0.0.1:{min_port}/health",
                   "minimal proxy", tmp / "minproxy.log")
            _start(procs, [sys.executable, "-m", "specroute.cli", "gateway", "--config",
                           str(_gateway_config(tmp, gw_port, upstream))],
                   f"http://127.0.0.1:{gw_port}/ready", "gateway", tmp / "gateway.log")
            targets = [Target("direct", f"{upstream}/v1/chat/completions"),
                       Target("minimal proxy", f"http://127.0.0.1:{min_port}/v1/chat/completions"),
                       Target("specroute", f"http://127.0.0.1:{gw_port}/v1/chat/completions")]
            targets += [_start_peer(procs, peers.PEERS[name], upstream, tmp) for name in names]
            asyncio.run(_measure(targets, n, seconds, rounds))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return summarize(targets)


def _table(result: dict) -> list[str]:
    lines = ["| path | stream | p50 ms | p99 ms | added p50 ms | req/s at c32 |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mode = "yes" if r["stream"] else "no"
        if "error" in r:
            lines.append(f"| {r['path']} | {mode} | {r['error']} | | | |")
            continue
        added = f"{r['added_p50_ms']:+.3f}" if "added_p50_ms" in r else ""
        lines.append(f"| {r['path']} | {mode} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{added} | {r['rps_c32']} |")
    return lines


def main(args: argparse.Namespace) -> int:
    n, seconds = (150, 1.5) if args.quick else (1500, 6.0)
    rounds = args.rounds or (1 if args.quick else 3)
    names = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    unknown = [p for p in names if p not in peers.PEERS]
    if unknown:
        print(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(peers.PEERS)}",
              file=sys.stderr)
        return 2
    result = run(names, n, seconds, rounds)
    print(f"gateway benchmark: /v1/chat/completions, {n} sequential requests then {seconds:g} s "
          f"at concurrency {CONCURRENCY} per path and mode, in {rounds} interleaved round(s)")
    print("\n".join(_table(result)))
    for key, value in result.items():
        if key.startswith("specroute_rps_over_"):
            print(f"{key}: {value if value is not None else 'n/a'}")
    if args.json:
        print(json.dumps(result))
    return 0
