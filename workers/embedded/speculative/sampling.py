"""The target distribution p and the speculative rejection rule that preserves it.

Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318): a draft
token x ~ q is accepted with probability min(1, p(x) / q(x)); on rejection the output is
drawn from norm(max(0, p - q)). With a point-mass q the rule accepts with probability p(x)
and the residual is p with x removed. Applied sibling after sibling it is the recursive
rejection sampling of SpecInfer (arXiv 2305.09781) for token trees.

Legend: p target probabilities (after temperature, top-k, top-p), q draft probabilities.
"""

from __future__ import annotations

import torch

from workers.embedded.api import TokenLogprob

# Temperatures below this divide as this one: logits (float32) over a smaller one
# overflow to inf (5e-324 is 0 as a float32), and the softmax of inf is nan. At 1e-5
# logits ~100 scale to ~1e7: still finite, and already greedy in effect.
MIN_TEMPERATURE = 1e-5


class Sampler:
    """A request's logits processing plus its private torch.Generator (reproducible seeds)."""

    def __init__(
        self,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.greedy = temperature <= 0.0 or top_k == 1
        self.scale = max(temperature, MIN_TEMPERATURE)  # what the logits are divided by
        self.generator = generator if generator is not None else torch.Generator()

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """p for each row of logits (..., V): temperature, then top-k, then top-p.
        Numerically safe for every accepted setting: the most likely token always stays
        (5e-324 is 0 as a float32, and `before >= top_p` would drop every token), and
        the top-k / top-p cuts rank tokens by their unscaled logits, which a huge
        temperature would flatten to ties in float32 (the cuts are the same otherwise:
        dividing by a positive temperature keeps the order)."""
        raw = logits.float()
        x = raw / self.scale
        if 0 < self.top_k < x.shape[-1]:
            kth = torch.topk(raw, self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(raw < kth, float("-inf"))
        if self.top_p < 1.0:
            order = torch.argsort(raw.masked_fill(x == float("-inf"), float("-inf")),
                                  dim=-1, descending=True)
            sorted_p = x.gather(-1, order).softmax(-1)
            before = sorted_p.cumsum(-1) - sorted_p  # mass strictly ahead of each token
            drop_sorted = before >= self.top_p
            drop_sorted[..., 0] = False  # the first token always stays
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            x = x.masked_fill(drop, float("-inf"))
        return x.softmax(-1)

    def sample(self, p: torch.Tensor) -> int:
        return int(torch.multinomial(p, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def acceptance_probability(p: torch.Tensor, token: int, q: torch.Tensor | None) -> float:
    """min(1, p(x) / q(x)); a point mass (q None) gives p(x)."""
    px = float(p[token])
    if q is None:
        return px
    qx = float(q[token])
    return 1.0 if qx <= px else px / qx


def residual(p: torch.Tensor, token: int, q: torch.Tensor | None) -> torch.Tensor:
    """norm(max(0, p - q)); for a point mass, p with `token` removed."""
    if q is None:
        r = p.clone()
        r[token] = 0.0
    else:
        r = (p - q).clamp_min_(0.0)
    total = r.sum()
    if float(total) <= 1e-12:  # p <= q everywhere means a rejection had probability 0
        return p
    return r / total


def token_logprobs(tokens: list[int], rows: torch.Tensor, sampler: Sampler,
                   top: int) -> list[TokenLogprob]:
    """Committed tokens' log-probabilities from the target rows (t, V) that chose them, as
    SGLang defines them (layers/sampler.py): log-softmax of the processed logits (bias,
    penalties, grammar mask), over the temperature when sampling, before top-k / top-p.
    Speculation reports these, never the drafter's q."""
    if not tokens:
        return []
    x = rows[: len(tokens)].float()  # (t, V)
    if not sampler.greedy:
        x = x / sampler.scale
    logprobs = torch.log_softmax(x, -1).clamp_min_(torch.finfo(torch.float32).min)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()
    if not top:
        return [TokenLogprob(t, lp) for t, lp in zip(tokens, chosen, strict=True)]
    values, ids = logprobs.topk(top, -1)  # (t, top)
    return [TokenLogprob(t, lp, tuple(zip(i, v, strict=True)))
            for t, lp, i, v in zip(tokens, chosen, ids.tolist(), values.tolist(), strict=True)]
