"""A real vLLM CPU server moves between fixed-k pools as a desired fleet asks: two
supervised servers (`specroute supervise --follow-fleet`, as `specroute up --engine vllm
--follow-fleet` starts them), one plain and one n-gram k 4, behind the real gateway
(learned policy); the desired fleet asks for two n-gram servers; the plain server drains,
relaunches as n-gram, registers in the n-gram pool and serves there, while the official
`openai` client keeps sending edits through the gateway: none fails.

The desired fleet is published by the test, as the gateway's planner publishes its own
(`policies.planner`, which the simulator and tests/policies test). The gateway here refits
once an hour and plans every ten refits, after the test is over, so the test's plan and the
pools' k stand. With 100 s refits, a slow CI run got "connection refused" from a
registered n-gram server's /metrics after the move: the first refit can ask for another k
(one refit of wish is enough at the default relaunch cost) and the relaunch closes the port.

Needs the vLLM environment that scripts/test.sh builds (named in SPECROUTE_VLLM_VENV).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from conftest import free_port, start_process, stop_process, wait_http, wait_until
from gateway_harness import start_gateway

from tests.e2e.test_fleet_supervisor import publish, registered
from tests.e2e.test_vllm_stack import EDIT, vllm_venv  # noqa: F401 - the fixture
from workers.models import resolve_model

MODEL = "smollm2-135m-instruct"


def worker_events(logs: Path, failures: list[str]) -> str:
    """What the gateway logged about its workers and the supervisors about their
    servers (launches, relaunches, moves, exits), to say why requests failed."""
    lines = [line for line in (logs / "gateway.log").read_text(errors="replace").splitlines()
             if "worker" in line or "breaker" in line or "registry" in line]
    for log in sorted(logs.glob("supervisor-*.log")):
        lines += [f"{log.stem}: {line[:300]}" for line in log.read_text(errors="replace")
                  .splitlines() if " pool " in line or "Traceback" in line or "Killed" in line]
    return f"{len(failures)} failed, first {failures[0]!r}; " + "\n".join(lines[-80:])


@pytest.mark.timeout(1200)
def test_a_vllm_server_moves_to_the_pool_the_fleet_wants(redis_url: str, tmp_path: Path,
                                                         vllm_venv: str) -> None:  # noqa: F811
    import redis

    from specroute.stack import prepare_model
    from specroute.vllm_stack import server_env, vllm_pools

    model = prepare_model(resolve_model(None))
    pools = vllm_pools(model, Path(vllm_venv) / "bin" / "python", ["plain", "ngram"])
    config = {"redis_url": redis_url, "pools": pools,
              "server": {"discovery_interval_s": 0.5, "health_interval_s": 0.5},
              "policy": {"refit_interval_s": 3600.0}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    procs = []
    try:
        for i, pool in enumerate(("vllm-plain", "vllm-ngram")):
            procs.append(start_process(
                ["-m", "specroute.cli", "supervise", "--config", str(path), "--pool", pool,
                 "--port", str(free_port()), "--redis-url", redis_url, "--follow-fleet"],
                tmp_path / f"supervisor-{pool}.log", env=server_env(i)))
        wait_until(lambda: all(registered(client, MODEL).get(p)
                               for p in ("vllm-plain", "vllm-ngram")),
                   600, "the vLLM servers never registered", tuple(procs))
        gateway_proc, gateway = start_gateway(tmp_path, config, policy="learned")
        procs.append(gateway_proc)
        wait_http(gateway + "/ready", 60, gateway_proc)
        fleet = httpx.get(gateway + "/v1/routing/fleet", timeout=30).json()
        assert fleet["models"][MODEL]["current"] == {"vllm-plain": 1, "vllm-ngram": 1}

        served: list[str] = []
        failures: list[str] = []
        stop = threading.Event()

        def traffic() -> None:
            api = openai.OpenAI(base_url=gateway + "/v1", api_key="none", max_retries=0,
                                timeout=120)
            while not stop.is_set():
                try:
                    reply = api.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": EDIT}],
                        max_tokens=8, temperature=0)
                    served.append(reply.model_extra["specroute"]["pool"])
                except openai.OpenAIError as exc:
                    failures.append(repr(exc))
                stop.wait(0.5)  # a steady client: the relaunch shares the two cores

        thread = threading.Thread(target=traffic)
        thread.start()
        try:
            publish(client, MODEL, {"vllm-plain": 0, "vllm-ngram": 2})
            wait_until(lambda: len(registered(client, MODEL).get("vllm-ngram", [])) == 2, 700,
                       "the plain server never moved to the n-gram pool", tuple(procs))
            moved_at = len(served)
            wait_until(lambda: len(served) >= moved_at + 6, 120,
                       "traffic stalled after the move", tuple(procs))
        finally:
            stop.set()
            thread.join(180)
        assert failures == [], worker_events(tmp_path, failures)
        assert "vllm-plain" not in registered(client, MODEL)
        assert set(served[moved_at:]) == {"vllm-ngram"}
        for url in registered(client, MODEL)["vllm-ngram"]:
            try:
                spec = httpx.get(url + "/metrics", timeout=30).text
            except httpx.HTTPError as exc:
                raise AssertionError(worker_events(tmp_path, [f"{url}/metrics: {exc!r}"])) from exc
            assert "vllm:spec_decode_num_drafts_total" in spec  # both serve n-gram now
    finally:
        for proc in reversed(procs):
            stop_process(proc, timeout=90)
