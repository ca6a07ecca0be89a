"""`specroute up --engine vllm`: a real vLLM CPU server (n-gram speculation) launched by
the supervisor, found in Redis by the real gateway, and served to the official `openai`
client; the engine's own acceptance reaches the policy; a signal stops every process
the stack started, the vLLM server included.

Needs the vLLM environment that scripts/test.sh builds (`workers.fleet.vllm_env`, named
in SPECROUTE_VLLM_VENV); skipped elsewhere unless SPECROUTE_REQUIRE_VLLM is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import free_port, start_process, wait_http

from tests.e2e.test_up import assert_stops_cleanly, children_of, descendants, kill_stack
from workers.models import resolve_model
from workers.processes import stop_group

VENV = os.environ.get("SPECROUTE_VLLM_VENV")
MODEL = "smollm2-135m-instruct"
EDIT = ("Repeat this sentence exactly, replacing 'cat' with 'dog': The cat sat on the mat "
        "and looked at the cat next door, and the cat next door looked back.")


def engine_accept_length(port: int, timeout_s: float = 15.0) -> float:
    """The gateway's `specroute_engine_accept_length{pool="vllm-ngram"}`, once scraped."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith('specroute_engine_accept_length{pool="vllm-ngram"}'):
                return float(line.split()[-1])
        if time.monotonic() > deadline:
            return 0.0
        time.sleep(0.5)


def kill_server(stack_pid: int, pool: str) -> set[int]:
    """SIGKILL the vLLM server (and its engine processes) of `pool`'s supervisor."""
    for pid in children_of(stack_pid):
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"supervise" in command and pool.encode() in command:
            victims = descendants(pid)
            for victim in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            return victims
    raise AssertionError(f"no supervisor of {pool}")


def relaunches_with_no_request_lost(client: openai.OpenAI, work: Path, edit: list) -> None:
    """A new desired k for the n-gram pool (as the policy publishes it): its supervisor
    drains the server and relaunches it with that k while requests keep coming; every
    request is answered (by the plain pool while n-gram is out of service), and the
    relaunched server registers the new k and serves again."""
    import redis
    import yaml

    from policies.keys import desired_k_key
    from workers.fleet.registry import list_workers

    store = redis.Redis.from_url(yaml.safe_load((work / "config.yaml").read_text())["redis_url"])
    store.set(desired_k_key("vllm-ngram"), "2")
    served: list[str] = []
    failures: list[str] = []
    relaunched = None  # how many replies had come when the new server registered
    deadline = time.monotonic() + 700  # a hung start: 420 s, then a second start
    while time.monotonic() < deadline:
        time.sleep(0.5)  # a steady client, not a flood: the relaunch shares the two cores
        try:
            reply = client.chat.completions.create(model=MODEL, messages=edit, max_tokens=8,
                                                   temperature=0)
            served.append(reply.model_extra["specroute"]["pool"])
        except openai.OpenAIError as exc:
            failures.append(repr(exc))
        ngram = list_workers(store, "vllm-ngram")
        if relaunched is None and ngram and ngram[0].k == 2 and not ngram[0].draining:
            relaunched = len(served)
        if relaunched is not None and "vllm-ngram" in served[relaunched:]:
            break
    else:
        raise AssertionError(f"no relaunch at k 2: {list_workers(store, 'vllm-ngram')}, "
                             f"served {served[-5:]}")
    assert not failures, failures
    assert "vllm-plain" in served  # the n-gram pool was out of service meanwhile


@pytest.fixture
def vllm_venv() -> str:
    if VENV and (Path(VENV) / "bin" / "python").exists():
        return VENV
    if os.environ.get("SPECROUTE_REQUIRE_VLLM"):
        pytest.fail("SPECROUTE_REQUIRE_VLLM is set but SPECROUTE_VLLM_VENV names no vLLM")
    pytest.skip("no vLLM environment (scripts/test.sh builds one)")


@pytest.mark.timeout(1200)
def test_vllm_stack_serves_records_acceptance_and_stops(tmp_path: Path,
                                                        vllm_venv: str) -> None:
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "up", "--engine", "vllm", "--methods",
                          "plain,ngram", "--port", str(port), "--workdir",
                          str(tmp_path / "work")],
                         tmp_path / "up.log", env={"REDIS_URL": "",
                                                   "SPECROUTE_VLLM_VENV": vllm_venv})
    pids: set[int] = set()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", 600, proc)
        pids = descendants(proc.pid)
        assert len(pids) >= 6  # redis, two supervisors, their vLLM servers, the gateway
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        edit = [{"role": "user", "content": EDIT}]
        for _ in range(8):  # the first may be cold-start tries of a pool nothing measured
            reply = client.chat.completions.create(model=MODEL, messages=edit, max_tokens=48,
                                                   temperature=0)
            facts = reply.model_extra["specroute"]
            if facts["pool"] == "vllm-ngram":
                break
        assert facts["pool"] == "vllm-ngram" and facts["k"] == 4
        assert reply.choices[0].message.content.strip()  # a 135 M model: its words are its own
        assert facts["accept_length"] > 1.5  # vLLM's own per-request figure (summary)
        chunks = list(client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0,
            stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].text for c in chunks if c.choices).strip()
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        streamed = client.chat.completions.create(model=MODEL, messages=edit, max_tokens=24,
                                                  temperature=0, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                  "required": ["ok"], "additionalProperties": False}
        structured = client.chat.completions.create(  # enforced by vLLM's own grammar
            model=MODEL, max_tokens=32, temperature=0,
            messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "ok", "schema": schema}})
        assert isinstance(json.loads(structured.choices[0].message.content)["ok"], bool)
        for _ in range(6):  # the policy learns vLLM's acceptance on edits
            client.chat.completions.create(model=MODEL, messages=edit, max_tokens=48,
                                           temperature=0)
        body = {"model": MODEL, "messages": edit, "max_tokens": 48, "temperature": 0}
        explained = httpx.post(f"http://127.0.0.1:{port}/v1/routing/explain", json=body,
                               timeout=30).json()
        assert explained["decision"]["pool"] == "vllm-ngram"
        assert explained["decision"]["predicted_accept_length"] > 1.5, explained["decision"]
        assert explained["predictions"]["vllm-ngram"]["predicted_accept_length"] > 1.5
        assert engine_accept_length(port) > 1.5  # the server's own /metrics counters
        # a vLLM server killed under traffic: its requests go to the other pool before
        # their first token; its supervisor starts it again and it takes traffic back
        killed = kill_server(proc.pid, "vllm-ngram")
        for _ in range(4):
            reply = client.chat.completions.create(model=MODEL, messages=edit,
                                                   max_tokens=16, temperature=0)
            assert reply.model_extra["specroute"]["pool"] == "vllm-plain"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if reply.model_extra["specroute"]["pool"] == "vllm-ngram":
                break
            time.sleep(2)
            reply = client.chat.completions.create(model=MODEL, messages=edit,
                                                   max_tokens=16, temperature=0)
        assert reply.model_extra["specroute"]["pool"] == "vllm-ngram"
        pids = (pids - killed) | descendants(proc.pid)
        relaunches_with_no_request_lost(client, tmp_path / "work", edit)
        pids = descendants(proc.pid) | pids
        # the supervisors drain their servers, then stop them
        assert_stops_cleanly(proc, pids, signal.SIGINT, exit_s=90, linger_s=30)
    finally:
        kill_stack(proc, pids)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("method,k", [("medusa", 4), ("eagle", 3)])
def test_our_drafters_run_on_vllm_and_are_accepted(tmp_path: Path, vllm_venv: str, method: str,
                                                   k: int) -> None:
    """The project's SmolLM2 Medusa heads and EAGLE head, exported into vLLM's formats, load
    in a real vLLM CPU server and its own counters show drafts accepted (> 1 token per
    verify step)."""
    from specroute.stack import prepare_model
    from workers.fleet.vllm_cpu import cpu_dtype
    from workers.fleet.vllm_drafters import EXPORTERS
    from workers.models import weights_dir

    model = prepare_model(resolve_model(None))
    heads = EXPORTERS[method](weights_dir(model.name) / method, model, tmp_path / method)
    port = free_port()
    spec = {"method": method, "model": str(heads), "num_speculative_tokens": k}
    log = (tmp_path / "vllm.log").open("wb")
    server = subprocess.Popen(  # its own session: the engine's processes stop with it
        [str(Path(vllm_venv) / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(model), "--served-model-name", MODEL, "--host", "127.0.0.1",
         "--port", str(port), "--max-model-len", "2048", "--dtype", cpu_dtype(),
         "--enforce-eager", "--speculative-config", json.dumps(spec),
         "--per-request-spec-decode-metrics", "summary"], stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
        start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 400, server)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=120)
        lengths = []
        for ask in ("Write a Python function that reverses a string.",
                    "Explain what a hash map is."):
            reply = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": ask}], max_tokens=48,
                temperature=0)
            lengths.append(reply.model_extra["metrics"]["speculative_decoding"]
                           ["mean_acceptance_length"])
        assert min(lengths) >= 1.0 and max(lengths) > 1.0, lengths
    finally:
        stop_group(server)
        log.close()


def test_follow_fleet_needs_supervised_servers(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Embedded workers are not supervised (they take every k per request): `up
    --follow-fleet` says so before it starts anything."""
    from specroute.stack import run_stack

    assert run_stack(engine="embedded", follow_fleet=True, workdir=str(tmp_path / "w")) == 2
    assert "needs --engine vllm" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.timeout(600)
def test_seeded_requests_under_load_leave_the_fleets_vllm_serving(tmp_path: Path,
                                                                  vllm_venv: str) -> None:
    """vLLM CPU 0.32 raises in its worker on a seeded request whose prefill it chunks
    (`CPU Generator does not use offset`) and serves only 500s from then on. The fleet
    launches it so that no prefill is chunked: concurrent seeded requests whose prompts
    exceed one step's token budget all answer, and the server keeps serving."""
    from bench.engine.compare import vllm_command
    from specroute.stack import prepare_model
    from workers.fleet.vllm_cpu import SERVER_ENV, cpu_dtype

    model = prepare_model(resolve_model(None))
    port = free_port()
    log = (tmp_path / "vllm.log").open("wb")
    argv = vllm_command(Path(vllm_venv) / "bin" / "python", model, "plain", 0, None, port,
                        cpu_dtype())
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **SERVER_ENV}, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 400, server)
        prompt = ("Summarize the following text in one sentence. "
                  + "The quick brown fox jumps over the lazy dog near the river bank. " * 12)
        url = f"http://127.0.0.1:{port}/v1/completions"

        async def burst() -> tuple[list[int], int]:  # ~8,500 prompt tokens at once
            async with httpx.AsyncClient(timeout=300) as client:
                replies = await asyncio.gather(*(client.post(url, json={
                    "model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0.8,
                    "seed": seed}) for seed in range(48)))
                after = await client.post(url, json={"model": MODEL, "prompt": "Hello",
                                                     "max_tokens": 2, "seed": 1})
                return [r.status_code for r in replies], after.status_code

        statuses, after = asyncio.run(burst())
        assert statuses == [200] * 48 and after == 200
        assert b"does not use offset" not in (tmp_path / "vllm.log").read_bytes()
    finally:
        stop_group(server)
        log.close()
