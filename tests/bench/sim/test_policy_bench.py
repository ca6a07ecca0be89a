"""`specroute bench policy --quick --json` runs the three deployable fleets for each seed
and ends with one JSON object: per fleet and seed the ratios against every baseline
([overall, phase 1, ...]), recovery (null: never) and the best homogeneous fleets."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.sim.policy import main

RATIOS = ("vs_best_homogeneous", "vs_sglang_adaptive_homogeneous", "vs_oracle",
          "vs_static_split")


# two seeds x three fleets: ~150 s at a load average of 2, over 300 s at 8-10 (shared)
@pytest.mark.timeout(900)
def test_quick_json_has_the_keys_per_fleet_and_seed(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    args = argparse.Namespace(json=True, quick=True, plot=None, seed=0, seeds="0,7")
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("== fleet sglang (primary), seed 0")
    assert lines[1].startswith("policy")
    out = json.loads(lines[-1])  # one JSON object, last
    assert out["seeds"] == [0, 7] and set(out["fleets"]) == {"sglang", "vllm", "embedded"}
    for by_seed in out["fleets"].values():
        assert set(by_seed) == {"0", "7"}
        for figures in by_seed.values():
            for key in RATIOS:
                assert len(figures[key]) == 1 + 4  # overall and the four phases
                assert all(x > 0 for x in figures[key])
            recovery = figures["recovery_requests"]
            assert recovery is None or 0 <= recovery <= figures["requests"]
            assert all(name.startswith("fixed:") for name in figures["best_homogeneous"])
            assert "adaptive" in set(figures["strategies"])
            rows = {row["policy"] for row in figures["table"]}
            assert {"adaptive", "oracle", "sglang-adaptive", "vllm-table", "rules",
                    "plain"} <= rows
            assert figures["adaptive_explored_fraction"] <= 0.05
            assert len(figures["vs_ceiling"]) == 1 + 4
    assert out["vs_oracle"] == out["fleets"]["sglang"]["0"]["vs_oracle"]
    assert out["fleets"]["sglang"]["0"]["launched_fleet"].startswith("eagle3-k12")
    assert {"adaptive-no-relaunch", "adaptive-split", "shard-adaptive"} <= set(
        out["fleets"]["vllm"]["0"]["strategies"])
    assert not any("eagle3" in row["policy"]
                   for row in out["fleets"]["embedded"]["0"]["table"])
