"""`specroute bench soak` end to end, briefly: the stack comes up (Redis, two stub
workers, the real gateway), the load runs, and the report has every figure; the figures
themselves are the bench's to print, not the test's to judge (the fault matrix asserts
behaviour under faults)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_soak_runs_and_reports() -> None:
    done = subprocess.run([sys.executable, "-m", "specroute.cli", "bench", "soak", "--minutes",
                           "0.2", "--concurrency", "8", "--faults", "none", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("soak: 0.2 min at concurrency 8")
    assert ("| minute | requests | req/s | errors | p50 ms | p99 ms | gateway RSS MB | "
            "telemetry backlog |") in lines
    summary = json.loads(lines[-1])
    assert summary["requests"] > 0 and summary["errors"] == {} and summary["lost"] == 0
    assert summary["faults"] == []
    assert summary["idle"]["tasks"] >= 1 and summary["after"]["fds"] > 0
    assert len(summary["rss_mb"]) == 1 and summary["rss_mb"][0] > 0
