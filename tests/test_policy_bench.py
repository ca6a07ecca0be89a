"""`specroute bench policy --quick --json` runs the simulator and ends with the summary JSON."""

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
    assert lines[0].startswith("policy")  # the table comes first
    summary = json.loads(lines[-1])  # one JSON object, last
    assert KEYS <= summary.keys()
    assert 0 < summary["adaptive_vs_oracle"] <= 1.2
    assert summary["adaptive_explored_fraction"] <= 0.05
    assert {row["policy"] for row in summary["table"]} >= {"adaptive", "oracle", "plain",
                                                          "per-server-ema", "static-rules"}
