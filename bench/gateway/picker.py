"""`specroute bench picker`: specroute as Envoy's endpoint picker, beside Envoy alone,
the standalone gateway and smg, in one run.

One upstream (`bench.gateway.upstream`), one load client and one body for every path (those of
`specroute bench gateway`, imported from `bench.gateway.overhead`), rounds interleaved so a slow
spell of the shared machine hits every path:

- direct: the upstream itself (the floor every "added" figure is measured from);
- envoy: Envoy 1.40 alone, the router filter and a round-robin cluster of the upstream;
- envoy + epp: the same Envoy with specroute's picker as its ext_proc filter (the
  bootstrap of `gateway.picker.envoy`: GAIE's ORIGINAL_DST cluster routed by
  `x-gateway-destination-endpoint`, the response read by the picking filter);
- envoy + epp observer: the same picker, the response read by a second filter in
  `observability_mode` (nothing waited on, one more gRPC stream per request);
- envoy + epp body: the same picker, the response read from its body alone (response
  headers SKIP; status and served endpoint as attributes: one message fewer);
- specroute: the standalone gateway (`specroute gateway`, default learned policy);
- smg: smg 1.13 (`bench.gateway.peers`), round robin.

Per path, streaming and not: sequential p50/p99, the p50 added over direct, then
requests/s at concurrency 32. Before the load, the picker's decision in process (request
headers and a 4 KB chat body to a pick, `Exchange.handle`), p50 and p99 over `--rounds`
x 1000 picks. The load client shares the cores with the servers.
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

import yaml

from bench.gateway import peers
from bench.gateway.overhead import (
    BODY,
    CONCURRENCY,
    Target,
    _measure,
    _pct,
    _start,
    _start_peer,
    _start_specroute,
    _table,
    stop_all,
    summarize,
)
from workers.processes import free_port, free_ports, start_redis

ENVOY, EPP, GATEWAY, SMG = "envoy", "envoy + epp", "specroute", "smg"
EPP_OBSERVE = "envoy + epp observer"  # the response read by an observer filter
EPP_BODY = "envoy + epp body"  # the response read from its body alone
# the JSON's keys: (its prefix, the row's path)
KEYS = (("envoy_epp", EPP), ("envoy_epp_observe", EPP_OBSERVE), ("envoy_epp_body", EPP_BODY),
        ("envoy_alone", ENVOY), ("specroute", GATEWAY), ("smg", SMG))
PROMPT_4KB = "word " * 800  # a 4 KB prompt: the decision-latency target


def picker_config(upstream: str) -> dict:
    """The bench's one pool (the gateway bench's), for the picker and the gateway."""
    return {"server": {"host": "127.0.0.1", "log_level": "warning"},
            "pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                       "method": "eagle", "k": 3, "workers": [upstream]}]}


def _envoy(procs: list[subprocess.Popen], tmp: Path, name: str, config: dict,
           ready: str) -> None:
    from gateway.picker.envoy import envoy_binary

    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    _start(procs, [str(envoy_binary()), "-c", str(path), "--use-dynamic-base-id", "-l",
                   "warning", "--concurrency", "1"], ready, name, tmp / f"{name}.log")


def _start_envoys(procs: list[subprocess.Popen], up_port: int, tmp: Path,
                  body_mode: str) -> list[Target]:
    """Envoy alone, then the picker and Envoy in front of it (ready once a request
    passes both: the picker answers only once its first health round has run)."""
    from gateway.picker.envoy import alone_bootstrap, bootstrap

    pod = ("127.0.0.1", up_port)
    alone, admin = free_ports(2)
    _envoy(procs, tmp, "envoy-alone", alone_bootstrap(("127.0.0.1", admin),
                                                      ("127.0.0.1", alone), [pod]),
           f"http://127.0.0.1:{admin}/ready")
    picker, epp, admin, observer, admin2, body, admin3 = free_ports(7)
    config = tmp / "picker.yaml"
    config.write_text(yaml.safe_dump(picker_config(f"http://127.0.0.1:{up_port}")))
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "specroute.cli", "picker", "--config", str(config), "--port",
         str(picker), "--max-endpoints", "1"], stdout=(tmp / "picker.log").open("wb"),
        stderr=subprocess.STDOUT, start_new_session=True))
    _envoy(procs, tmp, "envoy-epp", bootstrap(
        ("127.0.0.1", picker), ("127.0.0.1", admin), {"original_dst": ("127.0.0.1", epp)},
        [pod], body_modes={"original_dst": body_mode}),
        f"http://127.0.0.1:{epp}/health")  # through the picker
    _envoy(procs, tmp, "envoy-epp-observer", bootstrap(
        ("127.0.0.1", picker), ("127.0.0.1", admin2),
        {"original_dst": ("127.0.0.1", observer)}, [pod],
        body_modes={"original_dst": body_mode}, response="observe"),
        f"http://127.0.0.1:{observer}/health")
    _envoy(procs, tmp, "envoy-epp-body", bootstrap(
        ("127.0.0.1", picker), ("127.0.0.1", admin3), {"original_dst": ("127.0.0.1", body)},
        [pod], body_modes={"original_dst": body_mode}, response="body"),
        f"http://127.0.0.1:{body}/health")
    return [Target(ENVOY, f"http://127.0.0.1:{alone}/v1/chat/completions"),
            Target(EPP, f"http://127.0.0.1:{epp}/v1/chat/completions"),
            Target(EPP_OBSERVE, f"http://127.0.0.1:{observer}/v1/chat/completions"),
            Target(EPP_BODY, f"http://127.0.0.1:{body}/v1/chat/completions")]


def decision_latency(picks: int, upstream: str = "http://127.0.0.1:9") -> dict:
    """The picker's decision in process: request headers and a 4 KB chat body through
    `Exchange.handle` to the pick (the learned policy, as `specroute picker` runs by
    default), microseconds of wall time and of the thread's CPU time (on a shared machine
    the wall p99 is the scheduler's); each exchange closed (recorded) outside the timing."""
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

    from gateway.config import parse_config
    from gateway.picker.exchange import Exchange
    from gateway.picker.runtime import build

    services = build(parse_config(picker_config(upstream)), policy="learned",
                     max_endpoints=1)
    for pool in services.pools.values():
        for worker in pool.workers:
            worker.healthy = worker.probed = True
    services.started = True
    body = {**BODY, "messages": [{"role": "user", "content": PROMPT_4KB}]}
    values = {":path": "/v1/chat/completions", ":method": "POST", "content-type":
              "application/json", "authorization": f"Bearer {peers.API_KEY}"}
    head = ext.ProcessingRequest(request_headers=ext.HttpHeaders(headers=base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()])))
    raw = ext.ProcessingRequest(request_body=ext.HttpBody(body=json.dumps(body).encode(),
                                                          end_of_stream=True))

    async def run() -> tuple[list[float], list[float]]:
        wall, cpu = [], []
        for i in range(picks + 200):
            exchange = Exchange(services, 1)
            t0, c0 = time.perf_counter(), time.thread_time()
            await exchange.handle(head)
            answers = await exchange.handle(raw)
            spent, used = time.perf_counter() - t0, time.thread_time() - c0
            assert answers and answers[0].HasField("request_body"), answers
            exchange.close()
            if i >= 200:  # warm-up: caches, lazy imports
                wall.append(spent * 1e6)
                cpu.append(used * 1e6)
        return wall, cpu

    wall, cpu = asyncio.run(run())
    return {"decision_p50_us": round(_pct(wall, 0.5), 1),
            "decision_p99_us": round(_pct(wall, 0.99), 1),
            # CPU time of the deciding thread: what the pick costs, whatever else runs
            "decision_cpu_p50_us": round(_pct(cpu, 0.5), 1),
            "decision_cpu_p99_us": round(_pct(cpu, 0.99), 1),
            "decision_body_bytes": len(raw.request_body.body)}


def envoy_summary(targets: list[Target]) -> dict:
    """The gateway bench's rows, and the issue's figures: added p50 per path, the
    picker's p50 over Envoy alone's, each path's req/s over smg's."""
    out = summarize(targets)
    out = {"rows": out["rows"], **({"specroute_process": out["specroute_process"]}
                                   if "specroute_process" in out else {})}
    by = {(r["path"], r["stream"]): r for r in out["rows"]}
    for stream, suffix in ((False, ""), (True, "_stream")):
        smg = by.get((SMG, stream), {})
        for prefix, path in KEYS:
            row = by.get((path, stream), {})
            out[f"{prefix}_added_p50_ms{suffix}"] = row.get("added_p50_ms")
            if path != SMG:
                out[f"{prefix}_rps_over_smg{suffix}"] = (
                    round(row["rps_c32"] / smg["rps_c32"], 2)
                    if "rps_c32" in row and smg.get("rps_c32") else None)
        alone = out[f"envoy_alone_added_p50_ms{suffix}"]
        for prefix in ("envoy_epp", "envoy_epp_observe", "envoy_epp_body"):
            epp = out[f"{prefix}_added_p50_ms{suffix}"]
            out[f"{prefix}_over_alone_p50_ms{suffix}"] = (
                round(epp - alone, 3) if epp is not None and alone is not None else None)
    return out


def run(n: int, seconds: float, rounds: int, body_mode: str, with_smg: bool) -> dict:
    procs: list[subprocess.Popen] = []
    up_port = free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            _start(procs, [sys.executable, "-m", "bench.gateway.upstream", "--port", str(up_port)],
                   f"{upstream}/health", "upstream", tmp / "upstream.log")
            redis, redis_url = start_redis(tmp)  # the standalone gateway's production config
            procs.append(redis.proc)
            targets = [Target("direct", f"{upstream}/v1/chat/completions"),
                       *_start_envoys(procs, up_port, tmp, body_mode),
                       _start_specroute(procs, upstream, tmp, 1, redis_url)]
            if with_smg:
                targets.append(_start_peer(procs, peers.PEERS[SMG], upstream, tmp))
            asyncio.run(_measure(targets, n, seconds, rounds))
        finally:
            stop_all(procs)
    return envoy_summary(targets)


def main(args: argparse.Namespace) -> int:
    n, seconds = (150, 1.5) if args.quick else (600, 4.5)
    rounds = args.rounds or (1 if args.quick else 3)
    decision = decision_latency(300 if args.quick else 1000 * rounds)
    result = {**run(n, seconds, rounds, args.body_mode, args.peers != "none"), **decision}
    print(f"picker benchmark: /v1/chat/completions, {n} sequential requests then {seconds:g} s "
          f"at concurrency {CONCURRENCY} per path and mode, in {rounds} interleaved round(s); "
          f"the picker's request body {args.body_mode}")
    print("\n".join(_table(result)))
    for key, value in result.items():
        if key != "rows" and not isinstance(value, dict):
            print(f"{key}: {value if value is not None else 'n/a'}")
    if args.json:
        print(json.dumps(result))
    return 0
