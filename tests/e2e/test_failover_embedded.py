"""A client leaving a stream through the gateway frees the slot on a real embedded worker
(tiny random Llama built here, `specroute worker` and the gateway as subprocesses)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import stop_process
from gateway_harness import start_gateway, start_worker

TEXT = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the dog.\n"] * 20
CONTEXT = 8192  # long enough that generation outlasts the disconnect on a loaded CI box


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from tiny_models import tiny_model_dir

    tmp = tiny_model_dir(tmp_path_factory.mktemp("embedded"), TEXT, 300, CONTEXT)
    worker, url = start_worker(tmp, "plain", tmp)
    procs = [worker]
    try:
        gateway_proc, gateway = start_gateway(tmp, {"pools": [
            {"name": "e", "engine": "embedded", "model": "tiny", "workers": [url],
             "capabilities": {"max_context": CONTEXT}}]})
        procs.append(gateway_proc)
        yield {"gateway": gateway, "worker": url}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def aborted(worker: str) -> float:
    for line in httpx.get(worker + "/metrics").text.splitlines():
        if line.startswith("sglang:num_aborted_requests_total"):
            return float(line.split()[-1])
    raise AssertionError("no sglang:num_aborted_requests_total")


def test_client_leaving_the_gateway_frees_the_worker_slot(stack: dict) -> None:
    worker = stack["worker"]
    before = aborted(worker)
    body = {"model": "tiny", "prompt": "def", "stream": True, "temperature": 0,
            "max_tokens": CONTEXT - 16}
    with httpx.stream("POST", stack["gateway"] + "/v1/completions", json=body,
                      timeout=30) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    left = time.monotonic()
    while time.monotonic() < left + 10:
        state = httpx.get(worker + "/server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and aborted(worker) > before:
            return
        time.sleep(0.05)
    raise AssertionError("the worker kept the slot of a request whose client left")
