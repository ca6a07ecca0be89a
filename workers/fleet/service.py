"""`specroute supervise`: one pool's supervised server, or a fleet member, until a signal."""

from __future__ import annotations

import logging
import os
import signal
import threading

from policies.fleet import FleetConfigError, load_pool
from workers.fleet.launch import command_builder
from workers.fleet.member import FleetMember, MemberSettings, model_pools
from workers.fleet.supervisor import (
    DEFAULT_START_TIMEOUT_S,
    Supervisor,
    SupervisorError,
    SupervisorSettings,
    advertised_url,
)

# how long a start may take before it counts as hung (then it is tried again): SGLang
# loads weights and captures CUDA graphs (DEFAULT_START_TIMEOUT_S); vLLM CPU eager starts
# in well under a minute on a quiet machine, and a relaunch while the other server takes
# all the traffic takes several times as long (measured: docs/FLEET.md)
START_TIMEOUT_S = {"vllm": 420.0}


def supervise(config_path: str, pool: str, command_template: str | None, port: int | None,
              redis_url: str | None, follow_fleet: bool = False, min_workers: int = 1) -> int:
    """Blocking loop of `specroute supervise`; returns 0 after SIGINT/SIGTERM. With
    `follow_fleet` the worker changes pool as the fleet planner wants
    (workers/fleet/member.py); `pool` is where it starts without a desired fleet."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        spec, config_redis = load_pool(config_path, pool)
    except FleetConfigError as exc:
        raise SupervisorError(str(exc)) from exc
    url = redis_url or os.environ.get("REDIS_URL") or config_redis
    if url is None:
        raise SupervisorError("no Redis: pass --redis-url, set REDIS_URL or redis_url in config")
    advertised, listen_port = advertised_url(
        spec, port, os.environ.get("SPECROUTE_ADVERTISE_URL"))
    start_timeout_s = float(os.environ.get("SPECROUTE_START_TIMEOUT_S")
                            or START_TIMEOUT_S.get(spec.engine, DEFAULT_START_TIMEOUT_S))
    settings = SupervisorSettings(url=advertised, port=listen_port,
                                  health_timeout_s=start_timeout_s)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    one = Supervisor(spec, url, command_builder(spec, command_template), settings, stopping)
    sup: Supervisor | FleetMember = one
    if follow_fleet:
        sup = FleetMember(one, model_pools(config_path, spec.model),
                          lambda p: command_builder(p, command_template),
                          MemberSettings(min_workers=min_workers))
    try:
        sup.start()
        while not stopping.wait(settings.poll_interval_s):
            sup.poll_once()
    finally:
        sup.stop(drain=True)
    return 0
