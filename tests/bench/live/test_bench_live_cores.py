"""One core per worker in `bench live` (bench/live/cores.py, issue 42): a concurrency
above 1 runs only where every worker of a fleet gets a core of its own, and a stack's
processes are pinned, every thread, by their session."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.live import run as run_module
from bench.live.cores import cores_needed, is_worker, pin, session_pids
from bench.live.run import Settings, fair_concurrency


def settings(concurrency: tuple[int, ...], engine: str = "embedded") -> Settings:
    return Settings(engine=engine, methods=("plain", "ngram", "eagle", "eagle2"),
                    homogeneous=("plain", "ngram"), per_class=2, warmup=0, max_tokens=8,
                    concurrency=concurrency, replicates=1, seed=0)


def test_concurrency_above_one_needs_a_core_per_worker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert cores_needed(4, "embedded") == 5 and cores_needed(2, "vllm") == 2
    monkeypatch.setattr(run_module, "available_cores", lambda: [0, 1])
    kept, dropped = fair_concurrency(settings((1, 4)))
    assert kept.concurrency == (1,) and set(dropped) == {"4"}
    assert "5 cores needed" in dropped["4"] and "2 available" in dropped["4"]
    monkeypatch.setattr(run_module, "available_cores", lambda: list(range(5)))
    kept, dropped = fair_concurrency(settings((1, 4)))
    assert kept.concurrency == (1, 4) and dropped == {}


def test_a_stacks_worker_is_found_by_its_session_and_pinned_thread_by_thread() -> None:
    cores = sorted(os.sched_getaffinity(0))
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); " \
           "time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "specroute.cli", "worker"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_pids(proc.pid) == [proc.pid] and is_worker(proc.pid)
        assert not is_worker(os.getpid())
        pin(proc.pid, {cores[-1]})
        tasks = os.listdir(f"/proc/{proc.pid}/task")
        assert len(tasks) >= 2
        assert all(os.sched_getaffinity(int(t)) == {cores[-1]} for t in tasks)
    finally:
        proc.kill()
        proc.wait()
