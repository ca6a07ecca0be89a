"""`specroute bench policy --quick --json` runs every fleet scenario (deployable first) and ends with one JSON
object: the primary scenario's headline keys on top, each scenario's under `scenarios`."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.policy import main

KEYS = {"adaptive_vs_oracle", "adaptive_vs_best_fixed", "adaptive_vs_plain_at_saturation",
        "requests_to_recover_after_drift"}


def test_quick_json_has_the_headline_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(json=True, quick=True, plot=None, seed=0)
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("== scenario sglang-pools (primary)")  # primary's table first
    assert lines[1].startswith("policy")
    summary = json.loads(lines[-1])  # one JSON object, last
    assert KEYS <= summary.keys()
    assert summary["primary_scenario"] == summary["scenario"] == "sglang-pools"
    assert 0 < summary["adaptive_vs_oracle"] <= 1.2
    assert summary["adaptive_explored_fraction"] <= 0.05
    assert {row["policy"] for row in summary["table"]} >= {
        "adaptive", "adaptive-flat-prior", "oracle", "plain", "sglang-ema", "vllm-table", "rules"}
    scenarios = summary["scenarios"]
    assert set(scenarios) == {"sglang-pools", "embedded", "vllm", "sglang-shared"}
    assert not scenarios["sglang-shared"]["deployable"]
    for name, figures in scenarios.items():
        assert KEYS <= figures.keys() and figures["scenario"] == name
    assert scenarios["sglang-pools"]["adaptive_vs_oracle"] == summary["adaptive_vs_oracle"]
    vllm_rows = {row["policy"] for row in scenarios["vllm"]["table"]}
    assert "adaptive-no-relaunch" in vllm_rows
    assert not any("eagle3" in row["policy"] for row in scenarios["embedded"]["table"])
