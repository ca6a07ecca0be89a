"""scikit-learn is for offline training only: not a runtime dependency, never imported
by the gateway or the policy, not even at a refit (the Ridge prior it served earned
nothing: 0.975 / 1.032 with it, 0.974 / 1.031 without, and cost ~5 s of import)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_scikit_learn_is_an_extra_not_a_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {r.split(">")[0].split("=")[0].split("[")[0].strip() for r in requirements}

    assert "scikit-learn" not in names(project["dependencies"])
    assert "scikit-learn" in names(project["optional-dependencies"]["test"])  # tests train it
    offline = tomllib.loads((ROOT / "bench" / "pyproject.toml").read_text())["project"]
    assert "scikit-learn" in names(offline["optional-dependencies"]["train"])  # bench/training


def test_a_refit_imports_no_scikit_learn() -> None:
    code = """
import sys
from policies.decision import Policy
from policies.telemetry import LocalTelemetry
from policies.types import RequestRecord
policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0))
for method in ("eagle", "eagle2", "ngram", "medusa", "draft"):
    for task in ("code", "chat"):
        policy.observe(RequestRecord(model="m", pool=method, method=method, k=4, task=task,
            temperature_bucket="t0", prompt_tokens=10, output_tokens=60, verify_steps=30,
            accept_length=2.0, load=0, ttft_s=0.01, itl_s=0.01, e2e_s=0.3, timestamp=1.0))
policy.refit()
bad = [m for m in sys.modules if m.startswith(("sklearn", "scipy"))]
assert not bad, bad
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
