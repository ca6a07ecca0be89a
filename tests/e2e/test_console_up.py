"""`specroute up` prints the console's URL, and the console there shows the embedded
stack's own state: its pools, what the policy picks for each class on them, and the
traffic the official `openai` client sent (bundled model, plain and n-gram workers)."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import free_port, start_process, stop_process, wait_http

from workers.models import BUNDLED_MODEL_DIR

needs_model = pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").exists(),
                                 reason=f"no model at {BUNDLED_MODEL_DIR}")


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` with its start time, from /proc (the stack's children run
    in their own sessions, so a signal to the group would miss them)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(entry.name)] = (int(fields[1]), fields[19])
            except (OSError, ValueError, IndexError):
                continue
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        frontier = {child for child, (parent, _) in parents.items() if parent in frontier}
        found |= {child: parents[child][1] for child in frontier}
    return found


def kill_leftovers(started: dict[int, str]) -> None:
    """SIGKILL each process that still runs since the same start (its pid not reused)."""
    for pid, start in started.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            os.kill(pid, signal.SIGKILL)


@needs_model
def test_up_prints_the_console_and_it_shows_the_embedded_pools(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    proc = start_process(["-m", "specroute.cli", "up", "--port", str(port), "--workdir",
                          str(tmp_path / "work"), "--methods", "plain,ngram", "--model",
                          "tiny"], log, env={"REDIS_URL": ""})
    pids: dict[int, str] = {}
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/ready", 90, proc)
        pids = descendants(proc.pid)
        deadline = time.monotonic() + 10
        while f"console {base}/console" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert re.search(rf"^  console {re.escape(base)}/console$", log.read_text(), re.M)
        page = httpx.get(base + "/console", timeout=10)  # loopback, no admin key: open
        assert page.status_code == 200 and "/console/console.js" in page.text
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                               timeout=60)
        for content in ("def add(a, b):\n    return a + b\nRepeat that function.",
                        "Say hello."):
            client.chat.completions.create(model="specroute-tiny", max_tokens=12,
                                           temperature=0,
                                           messages=[{"role": "user", "content": content}])
        state = httpx.get(base + "/v1/console/state", timeout=10).json()
        pools = {p["pool"]: p for p in state["pools"]}
        assert set(pools) == {"embedded-plain", "embedded-ngram"}
        assert sum(s["requests"] for p in pools.values() for s in p["samples"]) == 2
        assert {r["pool"] for r in state["routing"]} <= set(pools)
        assert all(r["predicted_tokens_per_s"] > 0 for r in state["routing"])
        fleet = state["fleet"][0]["pools"]
        assert {p["pool"]: p["available"] for p in fleet} == {"embedded-plain": 1,
                                                               "embedded-ngram": 1}
        # the registry (the embedded Redis) says which k each worker runs
        assert all(p["running_k"] for p in fleet), fleet
        assert len(state["decisions"]) == 2
    finally:
        pids |= descendants(proc.pid)
        stop_process(proc, timeout=30)
        kill_leftovers(pids)
