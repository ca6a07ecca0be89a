"""Drafters on int8 codes (`layers.Int8Linear`): products close to the parameters',
every linear of a drafter swapped, the switch, and output still exactly the target's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import half_agreeing_drafters_dir
from torch import nn

from workers.embedded.drafter_models import load_drafter
from workers.embedded.engine import Engine, SamplingParams
from workers.embedded.layers import Int8Linear, int8_linears

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 300


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return half_agreeing_drafters_dir(tmp_path_factory.mktemp("model"), V)


def test_int8_products_match_the_parameters_within_the_codes_step() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40).to(torch.bfloat16)
    quantized = Int8Linear(linear)
    x = torch.randn(5, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        got, want = quantized(x).float(), linear(x).float()
    step = linear.weight.float().abs().amax(1) / 127  # (N,) one code's worth per row
    bound = 0.5 * step[None] * x.float().abs().sum(1, keepdim=True) + 0.05 * want.abs() + 0.02
    assert got.dtype == torch.float32 and (got - want).abs().le(bound).all()
    assert not torch.equal(got, want)  # it really ran on the codes
    assert quantized.weight.numel() == 0 and quantized.weight.dtype == torch.bfloat16
    with torch.enable_grad(), pytest.raises(RuntimeError, match="inference"):
        quantized(x)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_every_linear_of_a_drafter_runs_on_codes(model_dir: Path, kind: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    drafter = load_drafter(model_dir / kind, int8=True)
    linears = [m for m in drafter.modules() if isinstance(m, nn.Linear)]
    assert not linears and any(isinstance(m, Int8Linear) for m in drafter.modules())
    monkeypatch.setenv("SPECROUTE_INT8_DRAFTERS", "0")
    plain = load_drafter(model_dir / kind, int8=True)
    assert not any(isinstance(m, Int8Linear) for m in plain.modules())
    assert int8_linears(plain) is plain


def test_int8_drafters_leave_greedy_output_the_targets(model_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model is float32, so its drafters stay float32 unless asked: swap them by
    hand and decode; every method's greedy output equals plain's."""
    engine = Engine(model_dir, dtype=torch.float32)
    for method in ("eagle", "eagle2", "medusa"):
        drafter = engine._methods[method].new_drafter()
        int8_linears(drafter._eagle.head if method != "medusa" else drafter._heads)
    prompt = list(range(5, 40))
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = engine.start(prompt, params, "plain", 0)
    expected = []
    while not plain.finished:
        expected += plain.step().token_ids
    for method in ("eagle", "eagle2", "medusa"):
        gen = engine.start(prompt, params, method, 4)
        ids = []
        while not gen.finished:
            ids += gen.step().token_ids
        assert ids == expected, method
        assert gen.stats.num_proposed_drafts > 0
