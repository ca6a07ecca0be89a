"""The text model behind `gateway.classifier.classify`: one featurizer, one linear scorer.

Training (`bench.training.classifier.train`, scikit-learn) calls `features()`; inference
(here) computes the same set of known features without building their strings, so the
two cannot drift apart (a test compares the scores with sklearn's). The shipped model is
a vocabulary plus a weight matrix in a `.npz` file (no pickle); at load the weights
become one number per row, so scoring a prompt is a dict lookup per feature and one
C-speed sum: one sparse dot product, no array and no Python loop per token
(docs/CLASSIFIER.md, "Latency"; docs/PERFORMANCE.md).

Features are binary: lowercased words (ASCII punctuation turned into spaces, then split
on whitespace), their bigrams, and punctuation/layout markers found by substring tests
(indented lines, `;`/`{` at end of line, ` = `, `()`, `=>`, brackets, ...). Rows are
L2-normalised (1/sqrt(number of known features)), matching sklearn's
`CountVectorizer(binary=True)` + `normalize()` used in training. Only a bounded window
of the text is read: the first `HEAD_CHARS` and the last `TAIL_CHARS` characters.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HEAD_CHARS = 512
TAIL_CHARS = 192
FORMAT_VERSION = 4

# Words: the lowercased text with ASCII punctuation turned into spaces, split on
# whitespace (`str.translate` + `str.split`: two C passes over the text, where a
# tokenizing regex was the largest part of a long prompt's classification). Punctuation
# that tells code from prose becomes presence markers instead (substring tests), so the
# words stay clean.
_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"
_PUNCT_TO_SPACE = str.maketrans(dict.fromkeys(_PUNCTUATION, " "))
# ASCII text takes a bytes path: `bytes.translate` is a table lookup per byte in C,
# `str.translate` a dict lookup per character.
# One table lowercases and blanks punctuation; it also blanks the separators \x1c-\x1f,
# which `str.split` splits on and `bytes.split` does not.
_WORD_BYTES = bytes.maketrans(
    string.ascii_uppercase.encode() + _PUNCTUATION.encode() + bytes(range(0x1C, 0x20)),
    string.ascii_lowercase.encode() + b" " * (len(_PUNCTUATION) + 4))
# (name, needles): present when any needle occurs. Single characters are looked up in
# the text's character set; longer needles are searched only when their first
# character occurs at all, so prose pays a set build and a few lookups.
_MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("<indent>", ("\n    ", "\n\t")),
    ("<semi_eol>", (";\n",)),
    ("<brace_eol>", ("{\n", ":\n", "(\n")),
    ("<assign>", (" = ",)),
    ("<call>", ("()", "):")),
    ("<arrow>", ("=>", "->")),
    ("<compare>", ("==", "!=", "<=", ">=")),
    ("<scope>", ("::",)),
    ("<tag>", ("</", "/>")),
    ("<paren>", ("(",)),
    ("<brace>", ("{", "}")),
    ("<bracket>", ("[", "]")),
    ("<semi>", (";",)),
    ("<backtick>", ("`",)),
    ("<dollar>", ("$",)),
    ("<hash>", ("#",)),
    ("<underscore>", ("_",)),
    ("<question>", ("?",)),
    ("<exclaim>", ("!",)),
    ("<colon>", (":",)),
    ("<quote>", ('"', "'")),
    ("<newline>", ("\n",)),
)


_CHAR_NEEDLES = tuple((n, name) for name, needles in _MARKS for n in needles if len(n) == 1)
_LONG_NEEDLES = tuple((n, name) for name, needles in _MARKS for n in needles if len(n) > 1)
# Every byte but the characters the markers look for (the single-character needles and
# the first character of the longer ones): deleting them leaves what a marker can see.
_NOT_MARK_BYTES = bytes(sorted(set(range(256)) - {
    ord(n[0]) for _, needles in _MARKS for n in needles}))


def window(text: str) -> str:
    """The part of the text the model reads: head and tail of long prompts."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def words(text: str) -> list[str]:
    """Lowercased words of an already windowed text."""
    if text.isascii():
        return text.encode().translate(_WORD_BYTES).decode().split()
    return text.lower().translate(_PUNCT_TO_SPACE).split()


def marks(text: str) -> list[str]:
    """Names of the punctuation and layout markers present in an already windowed text."""
    # ASCII: the set of the few marker characters left once the rest is deleted (a set
    # of the whole window costs several times the deletion)
    chars = set(text.encode().translate(None, _NOT_MARK_BYTES).decode()) \
        if text.isascii() else set(text)
    found = [name for char, name in _CHAR_NEEDLES if char in chars]
    found += [name for needle, name in _LONG_NEEDLES if needle[0] in chars and needle in text]
    return list(dict.fromkeys(found))


def features(text: str) -> list[str]:
    """Feature strings of `text` (with repeats); the only featurizer, train and serve."""
    text = window(text)
    tokens = words(text)
    out = tokens + list(map(" ".join, zip(tokens, tokens[1:], strict=False)))
    out.extend(marks(text))
    return out


@dataclass(frozen=True, slots=True)
class Prediction:
    label: str
    probability: float
    top_features: tuple[str, ...]  # known features that pushed hardest towards `label`
    probabilities: tuple[float, ...] = ()  # every class's, in the model's class order


@dataclass(frozen=True)
class LinearTextModel:
    """Multinomial logistic regression over binary, L2-normalised `features()`."""

    classes: tuple[str, ...]
    names: tuple[str, ...]  # feature strings; row i of `weights` belongs to names[i]
    weights: np.ndarray  # (V, C) float32
    bias: np.ndarray  # (C,) float32
    vocabulary: dict[str, int] = field(init=False, repr=False)  # name -> row, for lookup
    # The scorer's precomputed form (plain Python, so scoring a prompt allocates no
    # arrays): word -> row, word -> {next word -> row} for bigrams (no joined string or
    # pair per bigram), the marker needles with their rows, and each row's weights as one
    # number (`_rows`).
    _unigrams: dict[str, int] = field(init=False, repr=False)
    _followers: dict[str, dict[str, int]] = field(init=False, repr=False)
    _char_rows: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    _long_rows: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    _rows: list[complex] = field(init=False, repr=False)
    _columns: tuple[list[float], ...] = field(init=False, repr=False)
    _bias: tuple[float, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.weights.shape != (len(self.names), len(self.classes)):
            raise ValueError("weights must be (len(names), len(classes))")
        if self.bias.shape != (len(self.classes),):
            raise ValueError("bias must be (len(classes),)")
        vocabulary = {n: i for i, n in enumerate(self.names)}
        unigrams = {n: i for n, i in vocabulary.items() if " " not in n}
        followers: dict[str, dict[str, int]] = {}
        for name, i in vocabulary.items():
            pair = name.split(" ")
            if len(pair) == 2:
                followers.setdefault(pair[0], {})[pair[1]] = i
        weights = self.weights.astype(float)
        # Softmax reads only differences of logits, so with up to three classes a row's
        # weights are one complex number, (w1 - w0) + (w2 - w0)j: one `sum` over the
        # known rows scores every class (more classes: one sum per class, `_columns`).
        rows: list[complex] = []
        if len(self.classes) <= 3:
            spread = np.zeros((len(self.names), 3))
            spread[:, 1:len(self.classes)] = weights[:, 1:] - weights[:, :1]
            rows = (spread[:, 1] + 1j * spread[:, 2]).tolist()
        set_ = object.__setattr__
        set_(self, "vocabulary", vocabulary)
        set_(self, "_unigrams", unigrams)
        set_(self, "_followers", followers)
        set_(self, "_char_rows", tuple((c, vocabulary[name]) for c, name in _CHAR_NEEDLES
                                       if name in vocabulary))
        set_(self, "_long_rows", tuple((n, vocabulary[name]) for n, name in _LONG_NEEDLES
                                       if name in vocabulary))
        set_(self, "_rows", rows)
        set_(self, "_columns", tuple(weights.T.tolist()))
        set_(self, "_bias", tuple(self.bias.astype(float).tolist()))

    def known_rows(self, text: str) -> set[int]:
        """Rows of the distinct known features of `text`: the same set as looking up
        every `features(text)` string in `vocabulary`, without building bigram strings
        or marker names."""
        text = window(text)
        tokens = words(text)
        rows: set[int | None] = set(map(self._unigrams.get, tokens))
        # Bigrams: a loop over the pairs with a word -> {next word -> row} table (compiled,
        # ~7% less than pairing the tokens into tuples for a `map` over a (word, word)
        # table; `in` and `[]`, not `.get`: as Python no call per token). It adds the new
        # rows, and None for the first unknown pair, in the order that `map` did: the
        # set's layout, so the order `logits` sums the rows in and `predict` breaks ties
        # in, is that one.
        unknown = None in rows
        followers = self._followers
        after = followers[tokens[0]] if tokens and tokens[0] in followers else None
        for i in range(1, len(tokens)):
            token = tokens[i]
            if after is not None and token in after:
                rows.add(after[token])
            elif not unknown:
                rows.add(None)
                unknown = True
            after = followers[token] if token in followers else None
        rows.discard(None)
        chars = set(text.encode().translate(None, _NOT_MARK_BYTES).decode()) \
            if text.isascii() else set(text)  # as in `marks`
        rows.update([row for char, row in self._char_rows if char in chars])
        rows.update([row for needle, row in self._long_rows
                     if needle[0] in chars and needle in text])
        return rows  # type: ignore[return-value]

    def logits(self, rows: set[int]) -> list[float]:
        """Class scores of a row set, up to a constant shared by every class (what
        softmax ignores): bias + the rows' weights summed, times 1/sqrt(len(rows))."""
        if not rows:
            return list(self._bias)
        scale = 1.0 / math.sqrt(len(rows))
        if self._rows:
            total = sum(map(self._rows.__getitem__, rows))
            diff = (0.0, total.real * scale, total.imag * scale)
            return [b - self._bias[0] + d for b, d in zip(self._bias, diff, strict=False)]
        return [sum(map(col.__getitem__, rows)) * scale + b
                for col, b in zip(self._columns, self._bias, strict=True)]

    def predict(self, text: str, explain: int = 3) -> Prediction:
        """Most likely class, its probability and the features that argued for it."""
        rows = self.known_rows(text)
        logits = self.logits(rows)
        top_logit = max(logits)
        scores = [math.exp(x - top_logit) for x in logits]
        best = scores.index(1.0) if 1.0 in scores else scores.index(max(scores))
        top: tuple[str, ...] = ()
        if explain and rows:
            column = self._columns[best]
            strongest = sorted(rows, key=column.__getitem__, reverse=True)[:explain]
            top = tuple(self.names[i] for i in strongest)
        total = sum(scores)
        return Prediction(self.classes[best], scores[best] / total, top,
                          tuple(score / total for score in scores))

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
