"""`specroute bench gateway`: specroute beside other gateways, in one run.

Starts a trivial upstream (`bench.gateway.upstream`), Redis, and in front of the upstream the
gateway in its production configuration (default learned policy, one `engine: sglang`
pool, a tenant with an API key, Redis telemetry), a minimal raw-ASGI + aiohttp
pass-through (`bench.gateway.minproxy`, the floor any Python proxy pays here) and the same on
the gateway's own upstream client (`minimal proxy http1`), smg,
sglang-router and LiteLLM proxy (`bench.gateway.peers`, installed into their own virtualenvs on
first use). One load
client sends the same `/v1/chat/completions` body everywhere; rounds are interleaved (each
round visits every path in turn), so a slow spell of the shared machine hits all of them.
Per path, streaming and not: sequential p50/p99 and the p50 added over the direct call,
then requests/s at concurrency 32 and the CPU a request cost the path's own processes
in that phase (from /proc: the gateway's threads and workers, a peer's children; the
direct row is the upstream's own). The load client shares the cores with the servers,
so req/s moves with the machine's load; CPU per request much less.
Last, classify + decide CPU p99 on a 4 KB prompt (`bench.gateway.classifier.cost`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench.gateway import peers
from bench.gateway.classifier import cost as classifier_cost
from workers.processes import free_port, free_ports, start_redis, wait_http

CONCURRENCY = 32
RATIO_PEERS = ("minimal proxy", "minimal proxy http1", "smg", "sglang-router",
               "litellm")  # specroute_rps_over_<peer>
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8, "temperature": 0}
HEADERS = {"Authorization": f"Bearer {peers.API_KEY}"}


@dataclass
class Target:
    name: str
    url: str = ""
    error: str = ""  # why it is not measured (not installed, did not start)
    metrics: str = ""  # a specroute /metrics URL: loop lag under load, memory
    lag_buckets: dict[float, float] = field(default_factory=dict)  # le -> count, c32 only
    lag_max_s: float = 0.0
    rss_idle_mb: float = 0.0
    latency: dict[bool, list[float]] = field(default_factory=lambda: {False: [], True: []})
    done: dict[bool, int] = field(default_factory=lambda: {False: 0, True: 0})
    seconds: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})
    pid: int | None = None  # the path's process: its tree's CPU is counted at c32
    cpu_s: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and every process below it (uvicorn's workers,
    LiteLLM's children), from /proc; 0.0 where /proc cannot tell (not Linux, gone)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(
                int(entry.name))
    total, todo, tick = 0.0, [pid], os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        todo += children.get(current, [])
    return total


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


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Unlabelled samples and the loop-lag histogram buckets of a /metrics page."""
    async with session.get(url) as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("specroute_event_loop_lag_seconds_bucket{le="):
            le = line.split('"')[1]
            out[f"lag_le_{le}"] = float(line.split()[-1])
        elif line and not line.startswith("#") and "{" not in line:
            name, value = line.split()[:2]
            out[name] = float(value)
    return out


def lag_p99_ms(buckets: dict[float, float]) -> float | None:
    """The upper bound (ms) of the histogram bucket holding the 99th percentile; None
    when there are no samples or the p99 is past the last finite bound (JSON has no
    infinity; the max is reported beside it)."""
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return None
    for le in sorted(buckets):
        if buckets[le] >= 0.99 * total:
            return le * 1000 if le != float("inf") else None
    return None


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
        for target in live:
            if target.metrics:  # idle: started, nothing served yet
                idle = await _scrape(session, target.metrics)
                target.rss_idle_mb = idle.get("process_resident_memory_bytes", 0.0) / 2**20
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
                        before = await _scrape(session, target.metrics) if target.metrics \
                            else {}
                        cpu = tree_cpu_s(target.pid) if target.pid else 0.0
                        done, spent = await _throughput(session, target.url, body,
                                                        seconds / rounds)
                        if target.pid:
                            target.cpu_s[stream] += tree_cpu_s(target.pid) - cpu
                        if target.metrics:
                            _add_lag(target, before, await _scrape(session, target.metrics))
                    except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
                        target.error = f"failed: {type(exc).__name__}: {exc}"[:120]
                        live.remove(target)
                        continue
                    target.done[stream] += done
                    target.seconds[stream] += spent


def _add_lag(target: Target, before: dict[str, float], after: dict[str, float]) -> None:
    for key, value in after.items():
        if key.startswith("lag_le_"):
            le = float(key[len("lag_le_"):])
            target.lag_buckets[le] = target.lag_buckets.get(le, 0.0) + value - before.get(key, 0.0)
    target.lag_max_s = max(target.lag_max_s,
                           after.get("specroute_event_loop_lag_max_seconds", 0.0))


def summarize(targets: list[Target], classify_decide_p99_us: float | None = None,
              classify_decide: dict | None = None) -> dict:
    """Rows per path and mode; specroute's throughput over each peer's (None where either
    side was not measured), its added p50, its loop lag under c32 and the given classify
    + decide CPU p99 (all calls), with `classify_decide`'s other figures beside it
    (`bench.gateway.classifier.timed`: p50, the calls without a context switch, the
    collector's runs)."""
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
            if t.cpu_s[stream] and t.done[stream]:
                row["cpu_us_per_request_c32"] = round(t.cpu_s[stream] / t.done[stream] * 1e6)
            if t is not direct and direct.latency[stream]:
                row["added_p50_ms"] = round(p50 - _pct(direct.latency[stream], 0.5), 3)
            rows.append(row)
    out: dict = {"rows": rows}
    for t in targets:
        if t.metrics and not t.error:
            out.setdefault("specroute_process", {})[t.name] = {
                "rss_idle_mb": round(t.rss_idle_mb, 1),
                "loop_lag_p99_ms_c32": lag_p99_ms(t.lag_buckets),
                "loop_lag_max_ms": round(t.lag_max_s * 1000, 2)}
    by = {(r["path"], r["stream"]): r for r in rows}
    ours_names = [t.name for t in targets if t.name.startswith("specroute")]
    for name in ours_names:  # "specroute", "specroute x2" -> specroute_x2_rps_over_...
        prefix = name.replace(" ", "_")
        for peer in RATIO_PEERS:
            key = peer.replace(" ", "_").replace("-", "_")
            for stream, suffix in ((False, ""), (True, "_stream")):
                ours, theirs = by.get((name, stream)), by.get((peer, stream))
                ratio = None
                if ours and theirs and "rps_c32" in ours and "rps_c32" in theirs:
                    ratio = round(ours["rps_c32"] / theirs["rps_c32"], 2)
                out[f"{prefix}_rps_over_{key}{suffix}"] = ratio
    for stream, suffix in ((False, ""), (True, "_stream")):
        row = by.get(("specroute", stream), {})
        out[f"specroute_added_p50_ms{suffix}"] = row.get("added_p50_ms")
    out["loop_lag_p99_ms"] = out.get("specroute_process", {}).get("specroute", {}).get(
        "loop_lag_p99_ms_c32")
    out["classify_decide_p99_us"] = classify_decide_p99_us
    out.update({f"classify_decide_{key}": value
                for key, value in (classify_decide or {}).items()})
    return out


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Terminate every process the bench started, then kill what is still up after 15 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()

def _start_specroute(procs: list[subprocess.Popen], upstream: str, tmp: Path,
                     workers: int, redis_url: str) -> Target:
    """The gateway in its production configuration (default learned policy, a tenant
    with an API key, Redis telemetry) with `workers` processes on one port."""
    port = free_port()
    config = {"server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
              "redis_url": redis_url,
              "tenants": [{"name": "bench", "api_key_sha256": [
                  hashlib.sha256(peers.API_KEY.encode()).hexdigest()]}],
              "pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                         "method": "eagle", "k": 3, "workers": [upstream]}]}
    path = tmp / f"gateway-{workers}.yaml"
    path.write_text(yaml.safe_dump(config))
    name = "specroute" if workers == 1 else f"specroute x{workers}"
    _start(procs, [sys.executable, "-m", "specroute.cli", "gateway", "--config", str(path),
                   "--workers", str(workers)], f"http://127.0.0.1:{port}/ready", name,
           tmp / f"gateway-{workers}.log")
    base = f"http://127.0.0.1:{port}"
    # one process: its /metrics is the gateway's (with N, each scrape sees one of them)
    return Target(name, f"{base}/v1/chat/completions",
                  metrics=f"{base}/metrics" if workers == 1 else "", pid=procs[-1].pid)


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
    return Target(peer.name, f"http://127.0.0.1:{port}/v1/chat/completions",
                  pid=procs[-1].pid)


def run(names: list[str], n: int, seconds: float, rounds: int,
        gateway_workers: tuple[int, ...] = (1,)) -> dict:
    procs: list[subprocess.Popen] = []
    up_port, min_port, min1_port = free_ports(3)
    upstream = f"http://127.0.0.1:{up_port}"
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            redis, redis_url = start_redis(tmp)
            procs.append(redis.proc)
            _start(procs, [sys.executable, "-m", "bench.gateway.upstream", "--port", str(up_port)],
                   f"{upstream}/health", "upstream", tmp / "upstream.log")
            _start(procs, [sys.executable, "-m", "bench.gateway.minproxy", "--port", str(min_port),
                           "--upstream", upstream], f"http://127.0.0.1:{min_port}/health",
                   "minimal proxy", tmp / "minproxy.log")
            _start(procs, [sys.executable, "-m", "bench.gateway.minproxy", "--port", str(min1_port),
                           "--upstream", upstream, "--client", "http1"],
                   f"http://127.0.0.1:{min1_port}/health", "minimal proxy http1",
                   tmp / "minproxy-http1.log")
            up_pid, min_pid, min1_pid = (proc.pid for proc in procs[-3:])
            targets = [Target("direct", f"{upstream}/v1/chat/completions", pid=up_pid),
                       Target("minimal proxy", f"http://127.0.0.1:{min_port}/v1/chat/completions",
                              pid=min_pid),
                       Target("minimal proxy http1",
                              f"http://127.0.0.1:{min1_port}/v1/chat/completions",
                              pid=min1_pid)]
            targets += [_start_specroute(procs, upstream, tmp, w, redis_url)
                        for w in gateway_workers]
            targets += [_start_peer(procs, peers.PEERS[name], upstream, tmp) for name in names]
            asyncio.run(_measure(targets, n, seconds, rounds))
        finally:
            stop_all(procs)
    # classify + decide on the slowest 4 KB prompt, in this process (bench/gateway/classifier.py)
    figures = classifier_cost(3000)
    both = figures["classify + route"]
    return summarize(targets, both["cpu"]["p99_us"], {
        "p50_us": both["cpu"]["p50_us"], "undisturbed_p99_us": both["undisturbed"]["p99_us"],
        "undisturbed_calls": both["undisturbed"]["calls"], "calls": both["calls"],
        "calls_with_gc": both["calls_with_gc"], "yardstick_p50_us": figures["yardstick_us"],
        "yardstick_p99_us": figures["yardstick_p99_us"]})


def _table(result: dict) -> list[str]:
    lines = ["| path | stream | p50 ms | p99 ms | added p50 ms | req/s at c32 "
             "| CPU µs a request at c32 |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        mode = "yes" if r["stream"] else "no"
        if "error" in r:
            lines.append(f"| {r['path']} | {mode} | {r['error']} | | | | |")
            continue
        added = f"{r['added_p50_ms']:+.3f}" if "added_p50_ms" in r else ""
        lines.append(f"| {r['path']} | {mode} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{added} | {r['rps_c32']} | {r.get('cpu_us_per_request_c32', '')} |")
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
    try:
        workers = tuple(int(w) for w in args.gateway_workers.split(","))
    except ValueError:
        print(f"--gateway-workers: comma-separated integers, got {args.gateway_workers!r}",
              file=sys.stderr)
        return 2
    result = run(names, n, seconds, rounds, workers)
    print(f"gateway benchmark: /v1/chat/completions, {n} sequential requests then {seconds:g} s "
          f"at concurrency {CONCURRENCY} per path and mode, in {rounds} interleaved round(s)")
    print("\n".join(_table(result)))
    for key, value in result.items():
        if "_rps_over_" in key:
            print(f"{key}: {value if value is not None else 'n/a'}")
    for key in ("specroute_added_p50_ms", "specroute_added_p50_ms_stream",
                "classify_decide_p99_us", "classify_decide_p50_us",
                "classify_decide_undisturbed_p99_us", "classify_decide_calls_with_gc",
                "classify_decide_yardstick_p99_us", "loop_lag_p99_ms"):
        print(f"{key}: {result.get(key) if result.get(key) is not None else 'n/a'}")
    for name, facts in result.get("specroute_process", {}).items():
        p99 = facts["loop_lag_p99_ms_c32"]
        print(f"{name}: idle RSS {facts['rss_idle_mb']:.0f} MB; event-loop lag under c32 "
              f"p99 <= {p99 if p99 is not None else 'n/a'} ms (histogram bucket), "
              f"max {facts['loop_lag_max_ms']:.1f} ms")
    if args.json:
        print(json.dumps(result))
    return 0
