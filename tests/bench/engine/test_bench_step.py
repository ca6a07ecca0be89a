"""`specroute bench step`: a profiled decode step per method, its ops and drafts counted."""

from __future__ import annotations

import json

from bench.engine.methods import _load_engine
from bench.engine.step_profile import format_profile, profile_method
from specroute.cli import main
from workers.models import resolve_model


def test_a_profile_counts_the_steps_tokens_and_ops() -> None:
    engine = _load_engine(resolve_model("tiny"))
    result = profile_method(engine, "eagle:3", steps=3, warmup=1)
    assert result.steps == 3 and result.ms_per_step > 0
    assert result.proposed_drafts == 9  # k 3 a step, a chain
    assert 3 <= result.tokens <= 12 and result.tokens == 3 + result.correct_drafts
    assert 0 < sum(op.share for op in result.ops) <= 1.0001
    assert result.ops == sorted(result.ops, key=lambda op: op.share, reverse=True)
    assert "drafts accepted" in format_profile(result)


def test_the_command_prints_a_table_per_method(capsys) -> None:
    assert main(["bench", "step", "--model", "tiny", "--methods", "plain,medusa:2",
                 "--quick", "--json"]) == 0
    out = capsys.readouterr().out
    assert "| op | calls a step | self CPU share |" in out
    rows = json.loads(out.strip().splitlines()[-1])
    assert [r["label"] for r in rows] == ["plain", "medusa:2"]
    assert rows[0]["tokens"] == 4 and rows[0]["proposed_drafts"] == 0
