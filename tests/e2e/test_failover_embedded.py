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
        yield {"gateway": gateway, "worker": url, "log": tmp / "worker.log"}
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


@pytest.mark.parametrize("path", ["/v1/completions", "/generate"])
def test_client_leaving_a_non_streamed_request_is_a_clean_cancel(stack: dict,
                                                                  path: str) -> None:
    """The client of a non-streamed request hangs up mid-generation (through the gateway
    and straight to the worker): the worker cancels it and frees the slot, logging one
    line at info, no traceback (it used to log "Exception in ASGI application")."""
    worker = stack["worker"]
    base = stack["gateway"] if path == "/v1/completions" else worker
    body = ({"model": "tiny", "prompt": "def", "temperature": 0, "max_tokens": CONTEXT - 16}
            if path == "/v1/completions" else
            {"text": "def", "sampling_params": {"max_new_tokens": CONTEXT - 16,
                                                "temperature": 0}})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + path, json=body, timeout=1.0)
    deadline = time.monotonic() + 10
    while httpx.get(worker + "/server_info").json()["internal_states"][0][
            "num_running_reqs"]:
        assert time.monotonic() < deadline, "the worker kept the slot"
        time.sleep(0.05)
    log = stack["log"].read_text()
    assert "cancelled after" in log
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
