"""`specroute up`: the whole local stack (Redis, embedded workers, the gateway with the
learned policy) comes up, answers the official `openai` client, and a signal stops every
process it started.

Uses the bundled model (skipped while it is absent); `SPECROUTE_TEST_MODEL` points the
test at another model folder.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import openai
import pytest
from conftest import free_port, start_process, stop_process, wait_http

from policies.fleet import BUNDLED_MODEL_DIR

MODEL = Path(os.environ.get("SPECROUTE_TEST_MODEL") or BUNDLED_MODEL_DIR)
pytestmark = pytest.mark.skipif(not (MODEL / "config.json").exists(),
                                reason=f"no model at {MODEL}")


def children_of(pid: int) -> set[int]:
    """Direct children, from /proc (the stack's processes run in their own sessions)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_up_serves_and_stops_everything(tmp_path: Path, stop_signal: signal.Signals) -> None:
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "up", "--port", str(port), "--workdir",
                          str(tmp_path / "work"), "--methods", "plain,ngram", "--model",
                          str(MODEL)], tmp_path / "up.log", env={"REDIS_URL": ""})
    pids: set[int] = set()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", 60, proc)
        pids = children_of(proc.pid)
        assert len(pids) == 4  # redis, two workers, the gateway
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=30)
        messages = [{"role": "user", "content": "Say hello."}]
        response = client.chat.completions.create(model="specroute-tiny", messages=messages,
                                                  max_tokens=12, temperature=0)
        facts = response.model_extra["specroute"]
        assert facts["pool"] in ("embedded-plain", "embedded-ngram")
        assert response.usage.completion_tokens > 0 and facts["accept_length"] >= 1.0
        # per-request k reaches the embedded worker: never more than k + 1 tokens a step
        raw = client.chat.completions.with_raw_response.create(
            model="specroute-tiny", messages=messages, max_tokens=12, temperature=0,
            extra_headers={"x-specroute-pool": "embedded-ngram", "x-specroute-k": "1"})
        facts = raw.parse().model_extra["specroute"]
        assert facts["k"] == 1 and facts["accept_length"] <= 2.0
        # JSON mode on engines without constrained decoding: served, with a warning
        raw = client.chat.completions.with_raw_response.create(
            model="specroute-tiny", messages=messages, max_tokens=8,
            response_format={"type": "json_object"})
        assert raw.headers["x-specroute-warning"].startswith(
            "response_format json_object not enforced by pool embedded-")
        proc.send_signal(stop_signal)
        assert proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        stop_process(proc)
