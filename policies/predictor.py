"""The per-request drafter predictor at runtime: pure Python over a JSON file.

What it predicts: per drafter family (`ngram`: prompt lookup; `eagle`: a learned draft
head or model), the mean accept length (tokens per verify step at the traces' k) a
request will see, from its feature vector (gateway/classifier/features.py). What the
policy reads (`Predictor.scales`): per family, the request's predicted extra tokens per
step (accept length - 1) over its class's mean in the training data, quantised to half
powers of two in [1/4, 4] so that decisions stay memoised per level. The policy scales
the acceptance it learned per (pool, class) by it (`scaled_accept`): the class's live
acceptance calibrates each pool, the prediction says how this request differs from its
class. `pooled_scales`: the same against the mean of every training request (`ANY_TASK`),
for a policy that learns one acceptance per pool (`PolicyConfig.learning_unit` "pool").

The model is a small gradient-boosted tree ensemble per family, fitted offline by
`python -m bench.training.predictor` (scikit-learn; docs/POLICY.md, "Per-request
predictor") and flattened into `policies/data/predictor.json`: each tree as parallel
arrays (`feature`, `threshold`, `left`, `right`, `value`; a leaf has `left` -1, the
learning rate is folded into `value`; unrolled at load, depth 2 at most), a prediction
being `exp(base + sum of leaves) x smearing` (Duan's factor: a mean, not a geometric
mean).
No numpy or scikit-learn here: the gateway stays light.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from policies.acceptance import invert_method_accept_length, method_accept_length
from policies.types import ANY_TASK

DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "predictor.json"
# Which family's prediction a pool's method reads: prompt lookup is n-gram's; drafters
# that learn from the target (heads, draft models) are EAGLE's. Lookahead's n-gram pool
# and the hybrid drafter have none (no traces of them yet): their scale stays 1.
FAMILY: Mapping[str, str] = {"ngram": "ngram", "eagle": "eagle", "eagle2": "eagle",
                             "eagle3": "eagle", "medusa": "eagle", "draft": "eagle"}
TRACE_K = 8  # the k of the traces the model is fitted on: its accept lengths are at this k
LEVEL_STEP = 0.5  # quantisation of log2(scale)
LEVEL_MAX = 2.0  # scales in [2**-2, 2**2]


# A tree of depth <= 2, unrolled: (root feature, threshold, then for its left and right
# child: feature, threshold, leaf if <=, leaf if >). A leaf higher up is a split that
# always goes left (threshold +inf) with equal leaves. Unrolled, a tree costs a few
# comparisons and no loop: 120 trees are most of a prediction's time.
Tree = tuple[int, float, int, float, float, float, int, float, float, float]
Scales = tuple[tuple[str, float], ...]
Fields = tuple[Scales, Scales, Scales]  # predicted accept, drafter scales, pooled scales
MAX_DEPTH = 2


def _subtree(arrays: Mapping[str, Sequence], node: int) -> tuple[int, float, float, float]:
    """A depth-1 subtree at `node`: (feature, threshold, leaf if <=, leaf if >)."""
    left, right = arrays["left"][node], arrays["right"][node]
    value = arrays["value"]
    if left < 0:
        return 0, math.inf, value[node], value[node]
    if arrays["left"][left] >= 0 or arrays["left"][right] >= 0:
        raise ValueError(f"a tree deeper than {MAX_DEPTH}: the runtime unrolls depth 2")
    return arrays["feature"][node], arrays["threshold"][node], value[left], value[right]


def _tree(arrays: Mapping[str, Sequence]) -> Tree:
    """Unroll one tree of the JSON's parallel arrays (`left`, `right`, `feature`,
    `threshold`, `value`; a leaf has `left` -1)."""
    left, right = arrays["left"][0], arrays["right"][0]
    if left < 0:
        return (0, math.inf, *_subtree(arrays, 0), *_subtree(arrays, 0))
    return (arrays["feature"][0], arrays["threshold"][0], *_subtree(arrays, left),
            *_subtree(arrays, right))


class Predictor:
    """A fitted predictor document (the JSON's content)."""

    def __init__(self, document: Mapping) -> None:
        self.features: tuple[str, ...] = tuple(document["features"])
        self.k: int = int(document["k"])
        self._families: dict[str, tuple[float, tuple[Tree, ...]]] = {
            family: (float(model["base"]) + math.log(float(model.get("smearing", 1.0))),
                     tuple(_tree(tree) for tree in model["trees"]))
            for family, model in document["families"].items()}
        self.class_mean: dict[str, dict[str, float]] = {
            family: dict(means) for family, means in document["class_mean"].items()}
        for means in self.class_mean.values():  # files fitted before the pooled mean
            means.setdefault(ANY_TASK, sum(means.values()) / len(means))

    @classmethod
    def load(cls, path: Path | str | None = None) -> Predictor:
        return cls(json.loads(Path(path or DEFAULT_PATH).read_text()))

    def accept_lengths(self, x: Sequence[float]) -> dict[str, float]:
        """Per family, the predicted mean accept length (tokens per step at `k`)."""
        if len(x) != len(self.features):
            raise ValueError(f"{len(x)} features, the model has {len(self.features)}")
        # a tuple: compiled, indexing it is a direct item read, where a `Sequence` is a
        # generic lookup behind a boxed index (240 of them a prediction)
        values: tuple[float, ...] = x if isinstance(x, tuple) else tuple(x)
        out = {}
        for family, (base, trees) in self._families.items():
            total = base
            for f0, t0, f1, t1, a, b, f2, t2, c, d in trees:  # inline: a call per tree
                if values[f0] <= t0:  # would be most of the cost
                    total += a if values[f1] <= t1 else b
                else:
                    total += c if values[f2] <= t2 else d
            out[family] = math.exp(total)
        return out

    def profile_fields(self, task: str, x: Sequence[float]) -> Fields:
        """A request's `RequestProfile.predicted_accept` (per family, rounded),
        `drafter_scales` and `pooled_scales`, in one call (the classifier's one step into
        policies)."""
        predicted = self.accept_lengths(x)
        return (tuple((family, round(value, 2)) for family, value in sorted(predicted.items())),
                self.scales(task, predicted), self.scales(ANY_TASK, predicted))

    def scales(self, task: str, predicted: Mapping[str, float]
               ) -> tuple[tuple[str, float], ...]:
        """Per family, the quantised scale of a request's extra tokens per step
        (`predicted`: `accept_lengths`) against its class's mean (module docstring; the
        mean of every request for `ANY_TASK`); sorted by family."""
        return tuple((family, quantise(ratio(predicted[family], self.class_mean[family][task])))
                     for family in sorted(predicted) if task in self.class_mean[family])


def ratio(accept_length: float, class_accept_length: float) -> float:
    """Extra tokens per step (accept length - 1) against the class's."""
    return max(accept_length - 1.0, 1e-3) / max(class_accept_length - 1.0, 1e-3)


def quantise(scale: float) -> float:
    """The nearest half power of two, clamped to [2**-LEVEL_MAX, 2**LEVEL_MAX]."""
    level = round(math.log2(max(scale, 1e-9)) / LEVEL_STEP) * LEVEL_STEP
    return 2.0 ** min(max(level, -LEVEL_MAX), LEVEL_MAX)


def method_scale(scales: Sequence[tuple[str, float]], method: str) -> float:
    """The scale a pool of `method` applies (1: no prediction for its family)."""
    family = FAMILY.get(method)
    for name, scale in scales:
        if name == family:
            return scale
    return 1.0


def scaled_accept(a: float, method: str, scale: float, k: int) -> float:
    """The per-token acceptance whose extra tokens per step at `k` (the predictor's, the
    method's depth capped) are `scale` times `a`'s: the class's learned acceptance moved
    by the request's prediction."""
    if scale == 1.0 or a <= 0.0:
        return a
    target = 1.0 + scale * (method_accept_length(a, method, k) - 1.0)
    return invert_method_accept_length(target, method, k)
