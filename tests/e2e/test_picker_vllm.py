"""Real vLLM CPU pods behind a real Envoy and the picker, through the official `openai`
client: one plain pod and one n-gram pod (k 4), each pinned to one core, float32 on a
CPU without AVX-512 (`workers.fleet.vllm_cpu.cpu_dtype`), launched as `specroute bench
engine --compare vllm` launches them (`bench.engine.compare.start`). The picker's static
rules send edits to n-gram and hot chat to plain; Envoy (GAIE's ORIGINAL_DST listener,
full-duplex request body, the response read by the observer filter) carries the bytes.

Needs the vLLM environment (SPECROUTE_VLLM_VENV); skipped elsewhere unless
SPECROUTE_REQUIRE_VLLM is set, in which case it must run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from conftest import free_port, stop_process, wait_http

from tests.e2e.test_picker_envoy import endpoint, start_envoy, start_picker, wait_for

MODEL = "smollm2-135m-instruct"
EDIT = ("Repeat this sentence exactly, replacing 'cat' with 'dog': The cat sat on the mat "
        "and looked at the cat next door, and the cat next door looked back.")
CHAT = "Tell me something nice about autumn."


@pytest.fixture(scope="module")
def vllm_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    venv = os.environ.get("SPECROUTE_VLLM_VENV")
    if not (venv and (Path(venv) / "bin" / "python").exists()):
        if os.environ.get("SPECROUTE_REQUIRE_VLLM"):
            pytest.fail("SPECROUTE_REQUIRE_VLLM is set but SPECROUTE_VLLM_VENV names no vLLM")
        pytest.skip("no vLLM environment (SPECROUTE_VLLM_VENV; scripts/test.sh builds one)")
    from bench.engine.compare import start, stop
    from specroute.stack import prepare_model
    from workers.fleet.vllm_cpu import cpu_dtype
    from workers.models import resolve_model

    work = tmp_path_factory.mktemp("picker-vllm")
    model = prepare_model(resolve_model(None))
    pods: dict[str, tuple[subprocess.Popen, str]] = {}

    def launch(core: int, method: str, k: int) -> None:
        port = free_port()
        proc = start("vllm", method, k, model, port, work, str(core), 1, cpu_dtype())
        pods[method] = (proc, f"http://127.0.0.1:{port}")

    try:
        with ThreadPoolExecutor(2) as pool:  # both at once: each launch checks the venv
            list(pool.map(launch, (0, 1), ("plain", "ngram"), (0, 4)))
        for proc, url in pods.values():  # ~40 s each on an idle machine; minutes loaded
            wait_http(f"{url}/health", 600, proc)
        yield {"work": str(work), **{m: url for m, (_, url) in pods.items()}}
    finally:
        for proc, _ in pods.values():
            stop(proc)


def picker_config(pods: dict[str, str]) -> dict:
    return {"pools": [
        {"name": "vllm-plain", "engine": "vllm", "model": MODEL, "method": "plain", "k": 0,
         "workers": [pods["plain"]]},
        {"name": "vllm-ngram", "engine": "vllm", "model": MODEL, "method": "ngram", "k": 4,
         "workers": [pods["ngram"]]}],
        "server": {"health_interval_s": 1.0}}


@pytest.mark.timeout(1200)  # the pods' start included (pytest-timeout counts setup)
def test_vllm_pods_behind_envoy_and_the_picker(vllm_pods: dict[str, str]) -> None:
    tmp = Path(vllm_pods["work"])
    metrics = free_port()
    picker, port = start_picker(tmp, "picker", picker_config(vllm_pods), "static",
                                "--metrics-port", str(metrics))
    procs = [picker]
    try:
        envoy, bases, _ = start_envoy(tmp, "envoy", port, ["original_dst"],
                                      [endpoint(vllm_pods[m]) for m in ("plain", "ngram")],
                                      {"original_dst": "FULL_DUPLEX_STREAMED"})
        procs.append(envoy)
        client = openai.OpenAI(base_url=bases["original_dst"], api_key="none", max_retries=0,
                               timeout=120)
        edit = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": EDIT}], max_tokens=32,
            temperature=0)
        assert (edit.headers["x-specroute-pool"], edit.headers["x-specroute-k"]) == (
            "vllm-ngram", "4")
        assert edit.headers["x-gateway-destination-endpoint-served"] == endpoint(
            vllm_pods["ngram"])
        answer = edit.parse()
        assert answer.choices[0].message.content.strip()  # a 135 M model's own words
        # vLLM's per-request speculation summary passes through Envoy untouched
        assert answer.model_extra["metrics"]["speculative_decoding"][
            "mean_acceptance_length"] >= 1.0
        chat = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": CHAT}], max_tokens=16,
            temperature=1.0)
        assert chat.headers["x-specroute-pool"] == "vllm-plain"
        assert chat.headers["x-gateway-destination-endpoint-served"] == endpoint(
            vllm_pods["plain"])
        assert chat.parse().choices[0].message.content
        stream = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": EDIT}], max_tokens=24,
            temperature=0, stream=True)
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.headers["x-specroute-pool"] == "vllm-ngram"
        chunks = list(stream.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
        # the picker asked for the usage chunk (where vLLM puts its speculation metrics)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        # the observer read each response: three requests recorded ok, two on n-gram
        def served_ok() -> dict[str, float]:
            text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
            ok: dict[str, float] = {}
            for line in text.splitlines():
                if line.startswith("specroute_requests_total{") and 'ok="true"' in line:
                    pool = line.split('pool="')[1].split('"')[0]
                    ok[pool] = ok.get(pool, 0.0) + float(line.rsplit(" ", 1)[1])
            return ok

        wait_for(lambda: served_ok() == {"vllm-ngram": 2.0, "vllm-plain": 1.0}, 10,
                 "three requests recorded ok")
    finally:
        for proc in reversed(procs):
            stop_process(proc)
