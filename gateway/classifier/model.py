"""The text model behind `gateway.classifier.classify`: one featurizer, one linear scorer.

Training (`gateway.classifier.training.train`, scikit-learn) and inference (here, numpy) call the
same `features()` function, so the two cannot drift apart. The shipped model is a
vocabulary plus a weight matrix in a `.npz` file (no pickle): scoring a prompt is a
dict lookup per feature and one gather-and-sum, which keeps a 4 KB prompt well under
200 µs where sklearn's own `transform` + `predict_proba` costs milliseconds.

Features are binary: lowercased word and punctuation-run tokens, their bigrams, and a
few code-shape markers found by substring tests (indented lines, `;`/`{` at end of
line, ` = `, `()`). Rows are L2-normalised (1/sqrt(number of known features)),
matching sklearn's `CountVectorizer(binary=True)` + `normalize()` used in training.
Only a bounded window of the text is read: the first `HEAD_CHARS` and the last
`TAIL_CHARS` characters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HEAD_CHARS = 768
TAIL_CHARS = 256
FORMAT_VERSION = 3

_TOKEN_RE = re.compile(r"\w+|[^\w\s]{1,3}")
# Cheap code-shape markers (substring tests, no regex scan): name -> any of these.
_SHAPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("<indent>", ("\n    ", "\n\t")),
    ("<semi_eol>", (";\n",)),
    ("<brace_eol>", ("{\n", ":\n", "(\n")),
    ("<assign>", (" = ",)),
    ("<call>", ("()", "):")),
)


def window(text: str) -> str:
    """The part of the text the model reads: head and tail of long prompts."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def features(text: str) -> list[str]:
    """Feature strings of `text` (with repeats); the only featurizer, train and serve."""
    text = window(text)
    tokens = _TOKEN_RE.findall(text.lower())
    out = tokens + list(map(" ".join, zip(tokens, tokens[1:], strict=False)))
    out.extend(name for name, needles in _SHAPES if any(n in text for n in needles))
    return out


@dataclass(frozen=True, slots=True)
class Prediction:
    label: str
    probability: float
    top_features: tuple[str, ...]  # known features that pushed hardest towards `label`


@dataclass(frozen=True)
class LinearTextModel:
    """Multinomial logistic regression over binary, L2-normalised `features()`."""

    classes: tuple[str, ...]
    names: tuple[str, ...]  # feature strings; row i of `weights` belongs to names[i]
    weights: np.ndarray  # (V, C) float32
    bias: np.ndarray  # (C,) float32
    vocabulary: dict[str, int] = field(init=False, repr=False)  # name -> row, for lookup

    def __post_init__(self) -> None:
        if self.weights.shape != (len(self.names), len(self.classes)):
            raise ValueError("weights must be (len(names), len(classes))")
        if self.bias.shape != (len(self.classes),):
            raise ValueError("bias must be (len(classes),)")
        object.__setattr__(self, "vocabulary", {n: i for i, n in enumerate(self.names)})

    def predict(self, text: str, explain: int = 3) -> Prediction:
        """Most likely class, its probability and the features that argued for it."""
        known = set(map(self.vocabulary.get, features(text)))
        known.discard(None)
        if known:
            idx = np.fromiter(known, dtype=np.intp, count=len(known))
            rows = self.weights.take(idx, axis=0)  # (n, C)
            logits = rows.sum(axis=0) * (1.0 / math.sqrt(len(idx))) + self.bias
        else:
            idx, rows, logits = np.empty(0, dtype=np.intp), self.weights[:0], self.bias
        scores = [math.exp(x) for x in (logits - logits.max()).tolist()]
        best = scores.index(max(scores))
        top: tuple[str, ...] = ()
        if explain and len(idx):
            order = np.argsort(-rows[:, best])[:explain]
            top = tuple(self.names[int(idx[j])] for j in order)
        return Prediction(self.classes[best], scores[best] / sum(scores), top)

    def save(self, path: Path) -> None:
        """Write the model as a compressed `.npz` of plain arrays (loadable without pickle)."""
        np.savez_compressed(
            path,
            format_version=np.array([FORMAT_VERSION, HEAD_CHARS, TAIL_CHARS], dtype=np.int64),
            classes=_blob(self.classes),
            vocabulary=_blob(self.names),
            weights=self.weights.astype(np.float32),
            bias=self.bias.astype(np.float32),
        )

    @classmethod
    def load(cls, path: Path) -> LinearTextModel:
        """Read a model written by `save`; refuses files from another featurizer version."""
        with np.load(path, allow_pickle=False) as data:
            version = tuple(int(v) for v in data["format_version"])
            if version != (FORMAT_VERSION, HEAD_CHARS, TAIL_CHARS):
                raise ValueError(f"{path}: featurizer version {version} does not match this code")
            classes = tuple(_unblob(data["classes"]))
            names = tuple(_unblob(data["vocabulary"]))
            weights = np.ascontiguousarray(data["weights"], dtype=np.float32)
            bias = np.asarray(data["bias"], dtype=np.float32)
        return cls(classes, names, weights, bias)


def _blob(strings: tuple[str, ...]) -> np.ndarray:
    """Strings as one NUL-separated UTF-8 byte array."""
    if any("\0" in item for item in strings):
        raise ValueError("feature or class names must not contain NUL")
    return np.frombuffer("\0".join(strings).encode("utf-8"), dtype=np.uint8)


def _unblob(array: np.ndarray) -> list[str]:
    text = array.tobytes().decode("utf-8")
    return text.split("\0") if text else []
