"""`specroute bench memory`'s reading of a process tree: every process under the root,
its part in the stack, and PSS summed from /proc (a real parent and child here; the
whole stack runs in the bench itself)."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.engine.memory import format_report, memory_rows, process_tree, role


def test_a_process_tree_is_read_with_its_memory() -> None:
    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
              "print(child.pid, flush=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.2)
        assert set(process_tree(parent.pid)) == {parent.pid, child}
        rows = memory_rows(parent.pid)
        assert {row["pid"] for row in rows} == {parent.pid, child}
        for row in rows:
            assert 0 < row["Pss_mb"] <= row["Rss_mb"]
            assert row["Pss_Anon_mb"] + row["Pss_File_mb"] <= row["Pss_mb"] + 0.2
        report = format_report({"model": "m", "pools": ["a"], "ready": rows,
                                "after_requests": rows})
        total = round(sum(row["Pss_mb"] for row in rows))
        assert f"| **stack** | **{total}** | **{total}** |" in report
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_stack_processes_are_named_by_their_part() -> None:
    python = sys.executable
    assert role([python, "-m", "specroute.cli", "worker", "--method", "eagle", ""]) \
        == "worker-eagle"
    assert role([python, "-m", "specroute.cli", "gateway", "--config", "c.yaml", ""]) \
        == "gateway"
    assert role(["/x/redis-server", "127.0.0.1:6379", ""]) == "redis"
    assert role([python, "-m", "specroute.cli", "up", "--port", "1", ""]) == "up"
