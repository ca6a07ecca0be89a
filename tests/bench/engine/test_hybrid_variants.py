"""`bench.engine.hybrid_variants`: variant fields parsed by type, the drafted token's cost
from the shipped SmolLM2 measured.json, and the modelled speedup it implies, per drafted
token or on the cost curve by positions (`bench.engine.verify_cost`)."""

from __future__ import annotations

import json

import pytest

from bench.engine.hybrid_variants import draft_token_cost, modelled, parse_variant
from bench.engine.verify_cost import cost_rows, curve, step_cost
from workers.models import SMOLLM2_MODEL_NAME, weights_dir


def test_variant_fields_parse_by_type() -> None:
    assert parse_variant("g25=eagle_min_rate=0.25,short_k=2") == \
        ("g25", {"eagle_min_rate": 0.25, "short_k": 2})
    assert parse_variant("b4=miss_backoff=4") == ("b4", {"miss_backoff": 4})


def test_a_drafted_token_costs_a_quarter_of_a_plain_step_on_smollm2() -> None:
    """The shipped batch-1 EAGLE rows: (step - plain) / (tokens x plain), averaged."""
    measured = json.loads((weights_dir(SMOLLM2_MODEL_NAME) / "measured.json").read_text())
    assert draft_token_cost(measured) == pytest.approx(0.240, abs=0.005)
    toy = {"costs": [{"method": "plain", "batch": 1, "step_s": 0.04, "draft_tokens": 0.0},
                     {"method": "eagle", "batch": 1, "step_s": 0.05, "draft_tokens": 1.0},
                     {"method": "eagle", "batch": 1, "step_s": 0.08, "draft_tokens": 2.0},
                     {"method": "eagle", "batch": 4, "step_s": 0.2, "draft_tokens": 4.0}]}
    assert draft_token_cost(toy) == pytest.approx((0.25 + 0.5) / 2)


def test_the_modelled_speedup_is_accept_length_over_the_step_cost() -> None:
    rows = [{"label": "plain", "accept_length": 1.0, "draft_tokens": 0.0},
            {"label": "eagle:3", "accept_length": 1.5, "draft_tokens": 2.5}]
    out = modelled(rows, 0.2)
    assert [r["modelled"] for r in out] == [1.0, 1.0]
    assert out[1]["label"] == "eagle:3"


CURVE = cost_rows({1: 0.040, 2: 0.044, 3: 0.048, 4: 0.056, 5: 0.072})  # ratios 1 .. 1.8


def test_a_step_costs_its_draft_lengths_point_on_the_curve() -> None:
    assert [r["ratio"] for r in CURVE] == [1.0, 1.1, 1.2, 1.4, 1.8]
    assert step_cost(CURVE, 0) == 1.0 and step_cost(CURVE, 3) == 1.4
    assert step_cost(CURVE, 6) == pytest.approx(1.8 + 2 * 0.4)  # the last slope, on
    # two rows with the same mean draft length: short steps and a cliff-crossing mix
    even = {"accept_length": 2.0, "draft_tokens": 2.0, "draft_histogram": [0, 0, 4]}
    mixed = {"accept_length": 2.0, "draft_tokens": 2.0, "draft_histogram": [2, 0, 0, 0, 2]}
    out = modelled([even, mixed], 0.2, CURVE)
    assert out[0]["modelled"] == pytest.approx(2.0 / 1.2, abs=1e-3)
    assert out[1]["modelled"] == pytest.approx(2.0 / ((1.0 + 1.8) / 2), abs=1e-3)
    assert modelled([even], 0.2)[0]["modelled"] == pytest.approx(2.0 / 1.4, abs=1e-3)
    assert modelled([{**even, "draft_histogram": []}], 0.2, CURVE)[0]["modelled"] == \
        pytest.approx(2.0 / 1.4, abs=1e-3)  # no histogram: per drafted token


def test_the_curve_times_each_length_after_the_same_prefix() -> None:
    """On the bundled tiny model: one median per length, the cache back at the prefix."""
    from workers.embedded.engine import Engine

    model = Engine().model
    seconds = curve(model, 3, 2, 8)
    assert sorted(seconds) == [1, 2, 3] and all(s > 0 for s in seconds.values())


def test_the_curve_is_written_beside_every_other_key(tmp_path, capsys) -> None:
    """`--write` adds `verify_costs` and its source to a measured.json, keeping the rest
    (checked against the prior's schema before writing)."""
    from bench.engine.verify_cost import main

    shipped = weights_dir("specroute-tiny") / "measured.json"
    path = tmp_path / "measured.json"
    path.write_text(shipped.read_text())
    assert main(["--model", "tiny", "--max-positions", "3", "--rounds", "1", "--prefix", "8",
                 "--write", str(path)]) == 0
    before, after = json.loads(shipped.read_text()), json.loads(path.read_text())
    assert [r["positions"] for r in after["verify_costs"]] == [1, 2, 3]
    assert after["verify_costs"][0]["ratio"] == 1.0
    assert "--max-positions 3" in after["verify_costs_source"]
    assert {k: v for k, v in after.items() if not k.startswith("verify_costs")} == before
    assert "| 3 |" in capsys.readouterr().out
