"""`bench.engine.hybrid_variants`: variant fields parsed by type, the drafted token's cost
from the shipped SmolLM2 measured.json, and the modelled speedup it implies."""

from __future__ import annotations

import json

import pytest

from bench.engine.hybrid_variants import draft_token_cost, modelled, parse_variant
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
