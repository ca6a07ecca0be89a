"""Per-request features for the drafter predictor (policies/predictor.py), read off the
request alone: how much of the answer is likely to copy the input, how long the answer
is against the material it could copy, the task family, the prompt's size.

Why: prompt-lookup (n-gram) drafting proposes the prompt's own next tokens, so it pays
when the answer reuses the prompt's text (an edit, a summary or an extraction from a
provided passage, earlier turns) and hardly at all on an open-ended answer; a learned
head (EAGLE) pays on predictable free text (JSON, boilerplate). Which one wins differs
request by request within one class (docs/TRACES.md: n-gram beats EAGLE on 17-90% of a
category's requests), so the policy needs a prediction per request, not a class mean.

Every value is a float; `FEATURES` names them in vector order (the predictor's JSON
lists the names it was fitted on and is checked against these). Work is bounded: counts
and substring tests read only `window(user)` (head `HEAD_CHARS` + tail `TAIL_CHARS`); lengths are
taken whole (O(1)). The classifier's own verdict (`task`) and the copy cues of
gateway/classifier/grounded.py (an edit verb or a grounded ask at the message's edges,
with the material they act on) are reused, not recomputed differently.
"""

from __future__ import annotations

import math

from gateway.classifier.grounded import ADDITIVE_STEMS, NO_CUES, CopyCues
from policies.types import TASKS

HEAD_CHARS = 2048
TAIL_CHARS = 1024
EDGE_CHARS = 300  # where an instruction sits: the first or last few hundred characters

FEATURES: tuple[str, ...] = (
    *(f"task_{task}" for task in TASKS),
    "log_chars",  # the last user message, whole
    "log_context_chars",  # earlier turns and system messages: material too
    "log_longest_line",  # a passage or an article is one long line; code is many short
    "line_share",  # line breaks per 100 characters
    "material_share",  # provided material (grounded.py) over the message
    "edit_ask",  # an edit verb at an edge with material to act on
    "code_material",  # ... and that material is code (an imperative edit of a snippet)
    "log_material",  # the material or passage, whole: what an answer can copy
    "named_share",  # the edit's instruction words found in its code: a targeted edit
    "additive_edit",  # add / implement / create ...: the answer adds more than it copies
    "grounded_ask",  # summarize / extract / answer from a provided passage
    "extract_ask",  # extract / answer the question / "what is the name": span answers
    "summary_ask",
    "translate_ask",
    "complete_ask",  # complete / continue / extend the given text or code
    "question_tail",  # a question mark near the end
    "fenced",
    "code_marks",  # ; { } ( = per 100 characters
    "digit_share",
    "non_ascii",
    "distinct_words",  # distinct / all words: repetitive text is easy to look up
    "json_word",
)
_ONE_HOT: dict[str, tuple[float, ...]] = {task: tuple(float(task == other) for other in TASKS) for task in TASKS}
# Instruction cues, as substrings of the lowercased edges (a few `in` tests cost far
# less than a case-blind regex over both edges).
_EXTRACT = ("extract", "answer the question", "answer to the question", "what is the name",
            "what was the name", "what is the full name", "which ", "who ")
_SUMMARY = ("summar", "tl;dr", "tldr", "in one sentence", "in a sentence")
_TRANSLATE = ("translat", "into english", "into french", "into german", "into spanish",
              "into chinese", "into japanese", "to english", "to french", "to german")
_COMPLETE = ("complete", "continue", "finish", "extend", "fill in")
_DIGITS = "0123456789"
_CODE_MARKS = ";{}()="
# ASCII text counts a set of characters in one pass: delete every other byte, take the
# length (`str.count` per character is a pass each, 16 over the head).
_NOT_DIGIT_BYTES = bytes(sorted(set(range(256)) - set(_DIGITS.encode())))
_NOT_CODE_MARK_BYTES = bytes(sorted(set(range(256)) - set(_CODE_MARKS.encode())))
HEAD_SAMPLE_CHARS = 512  # distinct words, code marks, digits: the head of the message


def window(text: str) -> str:
    """The part of `text` the counts and cue tests read."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def request_features(task: str, user: str, context_chars: int,
                     cues: CopyCues = NO_CUES) -> tuple[float, ...]:
    """The feature vector (`FEATURES` order) of a request whose last user message is
    `user`, with `context_chars` characters of system messages and earlier turns and
    the copy cues `gateway.classifier.grounded.copy_cues` found in `user`."""
    text = window(user)
    size = max(len(text), 1)
    edges = (text[:EDGE_CHARS] + "\n" + text[-EDGE_CHARS:] if size > 2 * EDGE_CHARS
             else text).lower()
    plain = text.isascii()
    lines = text.splitlines() or [""]
    head = text[:HEAD_SAMPLE_CHARS]
    words = head.lower().split()
    tail = text[-EDGE_CHARS:]
    code_marks, digits = _head_counts(head, plain)
    return (
        *_ONE_HOT.get(task, _ONE_HOT["chat"]),
        math.log1p(len(user)),
        math.log1p(context_chars),
        math.log1p(max(map(len, lines))),
        100.0 * len(lines) / size,
        max(cues.material, cues.passage) / max(len(user), 1),
        float(cues.edit),
        float(cues.code),
        math.log1p(max(cues.material, cues.passage)),
        cues.named / cues.words if cues.words else 0.0,
        float(cues.verb is not None and cues.verb.startswith(ADDITIVE_STEMS)),
        float(cues.grounded),
        _holds(edges, _EXTRACT),
        _holds(edges, _SUMMARY),
        _holds(edges, _TRANSLATE),
        _holds(edges, _COMPLETE),
        float("?" in tail),
        float("```" in text),
        100.0 * code_marks / max(len(head), 1),
        digits / max(len(head), 1),
        float(not plain),
        len(set(words)) / len(words) if words else 1.0,
        float("json" in edges),
    )


def _head_counts(head: str, plain: bool) -> tuple[int, int]:
    """The code marks (`_CODE_MARKS`) and the digits in `head`, each character counted."""
    if plain:
        data = head.encode()
        return (len(data.translate(None, _NOT_CODE_MARK_BYTES)),
                len(data.translate(None, _NOT_DIGIT_BYTES)))
    return sum(map(head.count, _CODE_MARKS)), sum(map(head.count, _DIGITS))


def _holds(text: str, needles: tuple[str, ...]) -> float:
    for needle in needles:  # a plain loop: a generator's frame per needle costs more
        if needle in text:
            return 1.0
    return 0.0
