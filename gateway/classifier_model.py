"""The text model behind `gateway.classify`: one featurizer, one linear scorer.

Training (`gateway.train_classifier`, scikit-learn) and inference (here, numpy) call the
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEAD_CHARS = 1024
TAIL_CHARS = 512
FORMAT_VERSION = 2

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
    vocabulary: dict[str, int]
    weights: np.ndarray  # (V, C) float32
    bias: np.ndarray  # (C,) float32

    def predict(self, text: str, explain: int = 3) -> Prediction:
        """Most likely class, its probability and the features that argued for it."""
        vocab = self.vocabulary
        known = set(map(vocab.get, features(text)))
        known.discard(None)
        idx: list[int] = list(known)  # type: ignore[arg-type]
        if idx:
            rows = self.weights[idx]  # (n, C)
            logits = rows.sum(axis=0) / math.sqrt(len(idx)) + self.bias
        else:
            rows = self.weights[:0]
            logits = self.bias.astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = int(probs.argmax())
        top: tuple[str, ...] = ()
        if explain and idx:
            order = np.argsort(-rows[:, best])[:explain]
            names = self._names()
            top = tuple(names[idx[int(j)]] for j in order)
        return Prediction(self.classes[best], float(probs[best]), top)

    def _names(self) -> list[str]:
        names = self.__dict__.get("_names_cache")
        if names is None:
            names = [""] * len(self.vocabulary)
            for name, i in self.vocabulary.items():
                names[i] = name
            object.__setattr__(self, "_names_cache", names)
        return names

    def save(self, path: Path) -> None:
        """Write the model as a compressed `.npz` of plain arrays (loadable without pickle)."""
        names = self._names() if self.vocabulary else []
        np.savez_compressed(
            path,
            format_version=np.array([FORMAT_VERSION, HEAD_CHARS, TAIL_CHARS], dtype=np.int64),
            classes=_blob(self.classes),
            vocabulary=_blob(names),
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
            names = _unblob(data["vocabulary"])
            weights = np.ascontiguousarray(data["weights"], dtype=np.float32)
            bias = np.asarray(data["bias"], dtype=np.float32)
        if weights.shape != (len(names), len(classes)) or bias.shape != (len(classes),):
            raise ValueError(f"{path}: weight shapes do not match vocabulary and classes")
        return cls(classes, {name: i for i, name in enumerate(names)}, weights, bias)


def _blob(strings: tuple[str, ...] | list[str]) -> np.ndarray:
    """Strings as one NUL-separated UTF-8 byte array (features never contain NUL)."""
    return np.frombuffer("\0".join(strings).encode("utf-8"), dtype=np.uint8)


def _unblob(array: np.ndarray) -> list[str]:
    text = array.tobytes().decode("utf-8")
    return text.split("\0") if text else []
