"""The live bench's arithmetic: mix rates, the held-out oracle, the best homogeneous fleet,
and bootstrap intervals over prompts.

Inputs are per prompt: for every configuration, the completion tokens and the seconds the
request took (a *configuration* is one homogeneous fleet pinned to one (pool, k), or the
adaptive gateway's fleet). Every configuration served every prompt, so comparisons are
paired.

- **Mix rate** of a configuration: `sum_c w_c * tokens_c / sum_c w_c * seconds_c` with
  `tokens_c`, `seconds_c` its per-request means on class c and `w_c` the mix's share of
  requests of class c: the tokens per second of a stream with those shares.
- **Best homogeneous fleet**: the pinned configuration with the highest mix rate (an
  in-sample maximum: it leans high, against the adaptive gateway).
- **Held-out oracle**: each class's prompts are cut in two folds; on each fold the
  oracle serves the class with the configuration that had the best rate on the *other*
  fold (two-fold cross-fitting, both ways), so it is never an in-sample maximum.
- **Ceiling** of routing among the pinned configurations: held-out oracle / best
  homogeneous fleet. Where its interval lies below a target, no per-class choice among
  these pools reaches that target on this workload (the adaptive fleet can still differ
  from both, since its servers of different methods run side by side).
- **Intervals**: a two-stage bootstrap clustered by replicate: each draw resamples the
  replicates (whole rounds, with replacement), then the prompts within each drawn
  replicate's classes and folds (so the shares and fold sizes stay), every choice above
  made again in each draw; the 2.5% and 97.5% percentiles of the draws' ratios. A
  replicate is a round of fleets started afresh, in its own order, on fresh prompts: what
  differs between rounds (the machine's state, what the adaptive gateway learned in its
  warm-up) shows in the interval, which a bootstrap over prompts alone hides (per-replicate
  ratios of 0.79-1.26 at c = 4 under a prompt-only interval a third as wide, issue 42).
  With one replicate only the prompt stage is left (`RESAMPLED` names what was).
- **Failures**: a request a configuration failed counts against that configuration as
  zero tokens over at least the time a served request of that prompt took (report.py
  `prompt_rows`), so a configuration that fails is slow, not excused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DRAWS = 2000
RESAMPLED = {  # what an interval's draws resample, as --json names it
    True: "replicates, then prompts within each drawn replicate's class and fold",
    False: "prompts within class and fold (replicates pooled)",
}


@dataclass(frozen=True, slots=True)
class Prompts:
    """Per prompt p: its class index, fold, replicate, and per configuration j tokens[p, j]
    and seconds[p, j]; `adaptive` is one of `configs`, the others are pinned."""

    classes: tuple[str, ...]
    configs: tuple[str, ...]
    adaptive: str
    cls: np.ndarray  # (P,) int: index into classes
    fold: np.ndarray  # (P,) int: 0 or 1
    tokens: np.ndarray  # (P, J)
    seconds: np.ndarray  # (P, J)
    replicate: np.ndarray  # (P,) int

    @property
    def pinned(self) -> list[int]:
        return [j for j, c in enumerate(self.configs) if c != self.adaptive]


def from_rows(rows: list[dict], adaptive: str) -> Prompts:
    """`rows`: one per prompt, {"cls", "fold", "cells": {config: (tokens, seconds)}} and
    optionally "replicate" (default 0); only the configurations every row has are kept."""
    common = set.intersection(*(set(r["cells"]) for r in rows)) if rows else set()
    if adaptive not in common:
        raise ValueError(f"{adaptive} did not serve every prompt")
    configs = tuple(sorted(common, key=lambda c: (c != adaptive, c)))
    classes = tuple(sorted({r["cls"] for r in rows}))
    return Prompts(classes, configs, adaptive,
                   np.array([classes.index(r["cls"]) for r in rows]),
                   np.array([r["fold"] for r in rows]),
                   np.array([[r["cells"][c][0] for c in configs] for r in rows], dtype=float),
                   np.array([[r["cells"][c][1] for c in configs] for r in rows], dtype=float),
                   np.array([r.get("replicate", 0) for r in rows]))


def _mix(tokens: np.ndarray, seconds: np.ndarray, counts: np.ndarray,
         weights: np.ndarray) -> np.ndarray:
    """Mix rate per column from per-class sums (C, J) and counts (C,)."""
    w = (weights / counts)[:, None]
    return (w * tokens).sum(0) / (w * seconds).sum(0)


@dataclass(frozen=True, slots=True)
class Estimate:
    adaptive: float  # tokens/s on the mix
    best: float
    best_name: str
    oracle: float
    oracle_picks: dict[str, tuple[str, str]]  # class -> (config serving fold 0, fold 1)
    rates: dict[str, float]  # every configuration's mix rate

    @property
    def vs_best(self) -> float:
        return self.adaptive / self.best

    @property
    def vs_oracle(self) -> float:
        return self.adaptive / self.oracle

    @property
    def ceiling(self) -> float:
        return self.oracle / self.best


def estimate(data: Prompts, shares: dict[str, float], index: np.ndarray | None = None) -> Estimate:
    """The mix's rates on the prompts `index` (default: all; repeats allowed)."""
    idx = np.arange(len(data.cls)) if index is None else index
    weights = np.array([shares[c] for c in data.classes])
    cls, fold = data.cls[idx], data.fold[idx]
    tok, sec = data.tokens[idx], data.seconds[idx]
    n_cls, n_cfg = len(data.classes), len(data.configs)
    sums_t = np.zeros((n_cls, 2, n_cfg))
    sums_s = np.zeros((n_cls, 2, n_cfg))
    np.add.at(sums_t, (cls, fold), tok)
    np.add.at(sums_s, (cls, fold), sec)
    counts = np.bincount(cls, minlength=n_cls).astype(float)
    rates = _mix(sums_t.sum(1), sums_s.sum(1), counts, weights)
    pinned = data.pinned
    best = pinned[int(np.argmax(rates[pinned]))]
    # the oracle: fold f of class c served by the pinned configuration best on fold 1 - f
    oracle_t, oracle_s = np.zeros(n_cls), np.zeros(n_cls)
    picks = {}
    for c in range(n_cls):
        chosen = []
        for f in (0, 1):
            other_t, other_s = sums_t[c, 1 - f, pinned], sums_s[c, 1 - f, pinned]
            if not other_s.any():
                raise ValueError(f"{data.classes[c]}: a fold without prompts; the held-out "
                                 f"oracle needs at least 2 prompts per class")
            j = pinned[int(np.argmax(other_t / other_s))]
            chosen.append(data.configs[j])
            oracle_t[c] += sums_t[c, f, j]
            oracle_s[c] += sums_s[c, f, j]
        picks[data.classes[c]] = (chosen[0], chosen[1])
    oracle = float(_mix(oracle_t[:, None], oracle_s[:, None], counts, weights)[0])
    a = data.configs.index(data.adaptive)
    return Estimate(float(rates[a]), float(rates[best]), data.configs[best], oracle, picks,
                    {c: float(r) for c, r in zip(data.configs, rates, strict=True)})


def bootstrap(data: Prompts, shares: dict[str, float], seed: int = 0,
              draws: int = DRAWS, by_replicate: bool = True,
              ) -> dict[str, tuple[float, float, float]]:
    """(estimate, 2.5%, 97.5%) of adaptive / best homogeneous, adaptive / oracle and the
    ceiling (oracle / best homogeneous). Each draw resamples the replicates, then prompts
    within each drawn replicate's (class, fold); `by_replicate=False`: prompts within
    (class, fold) across replicates pooled, the replicates' differences taken as fixed."""
    rng = np.random.default_rng(seed)
    point = estimate(data, shares)
    reps = np.unique(data.replicate) if by_replicate else np.zeros(1, dtype=int)
    clusters = [_strata(data, data.replicate == r if by_replicate else None) for r in reps]
    vs_best, vs_oracle, ceiling = np.empty(draws), np.empty(draws), np.empty(draws)
    for d in range(draws):
        drawn = rng.integers(len(clusters), size=len(clusters))
        index = np.concatenate([rng.choice(s, len(s)) for c in drawn for s in clusters[c]])
        e = estimate(data, shares, index)
        vs_best[d], vs_oracle[d], ceiling[d] = e.vs_best, e.vs_oracle, e.ceiling
    return {"vs_best_homogeneous": (point.vs_best, *_interval(vs_best)),
            "vs_oracle": (point.vs_oracle, *_interval(vs_oracle)),
            "oracle_vs_best_homogeneous": (point.ceiling, *_interval(ceiling))}


def _strata(data: Prompts, within: np.ndarray | None) -> list[np.ndarray]:
    """The prompts of each non-empty (class, fold), among `within` (default: all)."""
    keep = np.ones(len(data.cls), dtype=bool) if within is None else within
    strata = [np.flatnonzero(keep & (data.cls == c) & (data.fold == f))
              for c in range(len(data.classes)) for f in (0, 1)]
    return [s for s in strata if len(s)]


def _interval(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return float(low), float(high)
