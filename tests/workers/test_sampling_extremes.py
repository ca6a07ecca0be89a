"""Every sampling setting the worker accepts samples (issue 24: `top_p` 5e-324 made every
token -inf, the sampler raised "probability tensor contains inf, nan or < 0", a 500):
the target distribution p is finite, non-negative and sums to one, and the chosen
tokens' logprobs are finite, for extreme top_p, top_k, temperature, penalties and
logit_bias, with and without a grammar-like mask."""

from __future__ import annotations

import pytest
import torch

from workers.embedded.api import SamplingParams
from workers.embedded.speculative import Sampler
from workers.embedded.speculative.processors import build_processors
from workers.embedded.speculative.sampling import token_logprobs

V = 64
TINY = 5e-324  # the smallest double: 0 as a float32


def logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(3, V, generator=torch.Generator().manual_seed(seed)) * 30  # (3, V)


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [
    (1.0, TINY, 0), (1.0, 1e-300, 0), (1.0, 1e-45, 0), (1.0, 1.0 - 1e-16, 0),
    (TINY, 1.0, 0), (1e-300, 0.5, 0), (1e-5, 1.0, 0), (2.0, TINY, V - 1), (1.0, 1.0, 1),
    (1.0, 1.0, 2**30), (1e308, 1.0, 0), (1e308, TINY, 5)])
def test_p_is_a_distribution_and_samples(temperature: float, top_p: float, top_k: int) -> None:
    sampler = Sampler(temperature, top_p, top_k, torch.Generator().manual_seed(1))
    p = sampler.probs(logits())
    assert torch.isfinite(p).all() and (p >= 0).all()
    assert torch.allclose(p.sum(-1), torch.ones(3))
    for row in p:
        assert 0 <= sampler.sample(row) < V
    if top_p <= 1e-45:  # no mass but the best token's: greedy
        assert (p.argmax(-1) == logits().argmax(-1)).all() and (p.max(-1).values == 1).all()
    lp = token_logprobs([0, 1, 2], logits(), sampler, top=4)
    assert all(abs(t.logprob) < float("inf") for t in lp)
    assert all(abs(v) < float("inf") for t in lp for _, v in t.top)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, logit_bias={i: -100.0 for i in range(V)}),
    SamplingParams(temperature=1.0, logit_bias={i: 100.0 for i in range(V)}),
    SamplingParams(temperature=TINY, presence_penalty=2.0, frequency_penalty=2.0,
                   logit_bias={3: 100.0}),
    SamplingParams(temperature=1.0, top_p=TINY, presence_penalty=-2.0,
                   frequency_penalty=-2.0)])
def test_processed_logits_still_sample(params: SamplingParams) -> None:
    processors = build_processors(params, V, torch.device("cpu"), None)
    assert processors is not None
    sampler = Sampler(params.temperature, params.top_p, params.top_k,
                      torch.Generator().manual_seed(2))
    row = logits()[0]
    for _ in range(50):  # penalties grow with every committed token
        p = sampler.probs(processors.apply(row))
        assert torch.isfinite(p).all() and torch.isclose(p.sum(), torch.tensor(1.0))
        token = sampler.sample(p)
        processors.advance(token)
