"""`GET /v1/routing/fleet` on a real gateway with Redis: admin only (the admin key when one
is configured), current vs desired per model, the plan published in Redis, and planned
from the measurements a pool's config names."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs

from gateway.config import hash_api_key
from policies.keys import desired_fleet_key
from policies.planner import Benchmarked, FleetPlan
from tests.policies.test_planner_benchmarked import document

ADMIN_KEY = "fleet-admin-key"


def test_fleet_endpoint_is_admin_only_and_publishes(redis_url: str, tmp_path: Path) -> None:
    import redis

    measured = tmp_path / "measured.json"  # what the eagle pool's servers measured
    measured.write_text(json.dumps(document(Benchmarked(
        "eagle", 3, {("code", "t0"): 3.1, ("chat", "t0"): 2.4}, (1, 8), (0.03, 0.04)))))
    procs, urls = start_stubs(tmp_path, {"eagle": ["--k", "3"], "plain": []})
    try:
        config = {"redis_url": redis_url,
                  "server": {"admin_api_key_sha256": hash_api_key(ADMIN_KEY)},
                  "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                             "model": "m", "workers": [urls["eagle"]],
                             "measured": str(measured)},
                            {"name": "plain", "engine": "sglang", "method": "plain",
                             "model": "m", "workers": [urls["plain"]]}]}
        gateway_proc, gateway = start_gateway(tmp_path, config, policy="learned")
        procs["gateway"] = gateway_proc
        denied = httpx.get(gateway + "/v1/routing/fleet", timeout=10)
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "invalid_api_key"
        answer = httpx.get(gateway + "/v1/routing/fleet", timeout=30,
                           headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert answer.status_code == 200
        body = answer.json()
        assert body["planner"] == "on"
        plan = body["models"]["m"]
        assert plan["current"] == {"eagle": 1, "plain": 1}
        assert sum(plan["desired"].values()) == 2 and plan["published"] is True
        assert plan["reason"]
        assert plan["speeds"] == "the workers' measurements (2 configurations)"
        raw = redis.Redis.from_url(redis_url).get(desired_fleet_key("m"))
        assert FleetPlan.from_json(raw).desired == plan["desired"]
    finally:
        for proc in procs.values():
            stop_process(proc)
