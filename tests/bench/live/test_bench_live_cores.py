"""One core per worker in `bench live` (bench/live/cores.py, issue 42): a concurrency
above 1 runs only where every worker of a fleet gets a core of its own, and a stack's
processes, found by parent (each in a session of its own), are pinned, every thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.live import run as run_module
from bench.live.cores import cores_needed, descendant_pids, is_worker, pin
from bench.live.fleets import Config, Fleet, Stack
from bench.live.prompts import Item
from bench.live.run import Settings, fair_concurrency
from workers.models import BUNDLED_MODEL_DIR


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


def test_a_stacks_worker_is_found_below_it_and_pinned_thread_by_thread() -> None:
    cores = sorted(os.sched_getaffinity(0))
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); " \
           "time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "specroute.cli", "worker"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in descendant_pids(os.getpid()) and is_worker(proc.pid)
        assert descendant_pids(proc.pid) == [proc.pid]
        assert not is_worker(os.getpid())
        pin(proc.pid, {cores[-1]})
        tasks = os.listdir(f"/proc/{proc.pid}/task")
        assert len(tasks) >= 2
        assert all(os.sched_getaffinity(int(t)) == {cores[-1]} for t in tasks)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").exists(), reason="no bundled model")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core")
def test_a_real_stacks_worker_gets_a_core_and_the_rest_the_others(tmp_path: Path) -> None:
    """`specroute up` of one embedded worker: pinned, the worker (every thread) runs on
    the first core alone, the gateway and Redis on the rest, and it still answers."""
    cores = sorted(os.sched_getaffinity(0))
    stack = Stack(Fleet("1xplain", ("plain",), (Config("plain", "embedded-plain"),)),
                  "embedded", str(BUNDLED_MODEL_DIR), tmp_path)
    try:
        stack.start(300.0)
        placed = stack.pin(cores)
        (worker, core), = placed.items()
        assert core == cores[0] and is_worker(worker)
        for task in os.listdir(f"/proc/{worker}/task"):
            assert os.sched_getaffinity(int(task)) == {cores[0]}
        others = [p for p in descendant_pids(stack.proc.pid) if p != worker]
        assert others and all(os.sched_getaffinity(p) == set(cores[1:]) for p in others)
        item = Item("code/t0", {"messages": [{"role": "user", "content": "def f():"}],
                                "max_tokens": 4, "temperature": 0}, 0, 0)
        record = stack.send(Config("plain", "embedded-plain"), item, 0, 1)
        assert not record.error and record.tokens > 0
    finally:
        stack.stop()
