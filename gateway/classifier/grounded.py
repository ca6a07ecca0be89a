"""Copy-heavy requests: rewrite, or answer from, material the request itself provides.

Why: when the answer copies the input (proofread a paragraph, rename a variable in a
function, fix the indentation), prompt-lookup drafting proposes the input's own next
tokens and most of them are accepted; on open-ended requests of the same topic it
rarely is. Measured on SmolLM2-135M-Instruct (CPU, greedy, 43-64 tokens): fixing the
spelling of a paragraph, n-gram k 6 accepted 3.31 tokens per step and ran 1.7x plain,
EAGLE 0.56x; a CSV-to-JSON ask and a "write a function" ask, n-gram 1.05-1.26 tokens
per step, below plain (docs/POLICY.md, "Edit requests").

The rule: an edit instruction (an edit verb near the start or the end of the last user
message) and provided material — a fenced block, or text after the instruction's line
or colon — that is most of the message and long enough to copy from. Answers grounded in
a provided passage count too (`grounded_evidence`): a summary, an extraction, an answer
"from the following context" reuses the passage's words, and on public prompts
(docs/TRACES.md: XSum, DialogSum, AdversarialQA, Quoref on SmolLM2) prompt lookup beat
EAGLE's tokens per step on 83-90% of such requests. Translation is not: its output
does not copy the input. Scans are bounded: the verbs are looked for in the first and
last `EDGE_CHARS` only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

EDGE_CHARS = 300
MIN_MATERIAL_CHARS = 120  # ~30 tokens
MIN_MATERIAL_SHARE = 0.5

_EDIT = re.compile(
    r"\b(?:fix|correct|proofread|rewrite|re-write|rephrase|reword|edit|revise|refactor|rename|"
    r"modify|update|change|replace|"
    r"reformat|re-indent|reindent|polish|tidy|clean\s+up|improve\s+the\s+(?:grammar|wording|"
    r"style|formatting)|add\s+(?:type\s+hints|docstrings?|comments)|convert\s+(?:it|this|the\s+"
    r"\w+)\s+to\s+(?:f-strings|snake_case|camelcase|a\s+list\s+comprehension))\w*\b",
    re.IGNORECASE)
# What every `_EDIT` alternative starts with: in ASCII text a match needs one of them in
# the lowercased text, a few substring searches where the case-blind regex pays for
# every character of both windows. Non-ASCII text goes to
# the regex directly: Unicode case folding matches more than `str.lower` shows.
_EDIT_STEMS = ("fix", "correct", "proofread", "rewrite", "re-write", "rephrase", "reword",
               "edit", "revise", "refactor", "rename", "reformat", "re-indent", "reindent",
               "polish", "tidy", "clean", "improve", "add", "convert", "modify", "update",
               "change", "replace")
# An answer taken from a passage the message provides: summarize it, extract from it,
# answer a question from (or based on) it.
_GROUNDED = re.compile(
    r"\b(?:summari[sz]e|summary\s+of|tl;?dr|extract|"
    r"(?:answer|respond)\w*\b[^.?!\n]{0,40}?\b(?:from|based\s+on|using|according\s+to)\s+"
    r"(?:the|this|that)\s+(?:following|given|above|below|provided)?\s*"
    r"(?:context|passage|paragraph|text|article|document|story|email|dialogue|conversation)|"
    r"(?:based\s+on|according\s+to|from)\s+(?:the|this)\s+(?:following|given|above|below|"
    r"provided)\s+(?:context|passage|paragraph|text|article|document|story|dialogue|"
    r"conversation)|"
    r"(?:based\s+on|according\s+to|from)\s+(?:the|this)\s+(?:context|passage|paragraph|text|"
    r"article|document|story|dialogue|conversation)\s+(?:above|below))\w*",
    re.IGNORECASE)
_GROUNDED_STEMS = ("summar", "tl;dr", "tldr", "extract", "answer", "respond", "based on",
                   "according to", "from the", "from this")
MIN_PASSAGE_CHARS = 200  # ~50 tokens: a passage worth drafting from


def _may_hold(edge: str, stems: tuple[str, ...]) -> bool:
    if not edge.isascii():
        return True
    lower = edge.lower()
    for stem in stems:  # a plain loop: a generator's frame per stem costs more here
        if stem in lower:
            return True
    return False


def _edge_match(user: str, pattern: re.Pattern, stems: tuple[str, ...]) -> re.Match | None:
    """`pattern` in the first or the last `EDGE_CHARS` of `user`, outside fenced blocks
    (a word in the provided code is not the instruction)."""
    head, tail = EDGE_CHARS, max(len(user) - EDGE_CHARS, 0)
    if "```" in user:
        head = min(head, user.find("```"))
        tail = max(tail, user.rfind("```") + 3)
    found = pattern.search(user, 0, head) if _may_hold(user[:head], stems) else None
    if found is None and tail < len(user) and _may_hold(user[tail:], stems):
        found = pattern.search(user, tail)
    return found


class CopyCues(NamedTuple):
    """What `copy_cues` found: the edit verb and the material it acts on, the grounded
    ask and the passage it reads (characters; 0 where no verb or ask)."""

    verb: str | None
    material: int
    ask: str | None
    passage: int

    @property
    def edit(self) -> bool:
        """An edit verb with at least `MIN_MATERIAL_CHARS` to act on."""
        return self.verb is not None and self.material >= MIN_MATERIAL_CHARS

    @property
    def grounded(self) -> bool:
        """A grounded ask with a passage of at least `MIN_PASSAGE_CHARS`."""
        return self.ask is not None and self.passage >= MIN_PASSAGE_CHARS


NO_CUES = CopyCues(None, 0, None, 0)


def copy_cues(user: str) -> CopyCues:
    """The edit verb and the grounded ask at the message's edges, with what they act on:
    read once per request by the classifier (`edit_evidence`) and the drafter
    predictor's features (gateway/classifier/features.py)."""
    if len(user) < MIN_MATERIAL_CHARS:
        return NO_CUES
    verb = _edge_match(user, _EDIT, _EDIT_STEMS)
    material = _material(user, verb.start(), verb.end()) if verb is not None else 0
    ask = (_edge_match(user, _GROUNDED, _GROUNDED_STEMS) if len(user) >= MIN_PASSAGE_CHARS
           else None)
    passage = _material(user, ask.start(), ask.end()) if ask is not None else 0
    return CopyCues(verb.group(0).lower() if verb is not None else None, material,
                    ask.group(0).lower() if ask is not None else None, passage)


def edit_evidence(user: str, cues: CopyCues | None = None) -> str | None:
    """Why `user` is a copy-heavy request (an edit, or an answer grounded in a passage
    it provides, that is most of the message), or None (see the module docstring).
    `cues`: `copy_cues(user)`, where the caller has it."""
    cues = copy_cues(user) if cues is None else cues
    share = MIN_MATERIAL_SHARE * len(user)
    if cues.edit and cues.material >= share:
        return f"edit: {cues.verb!r} on {cues.material} provided characters"
    if cues.grounded and cues.passage >= share:
        return f"grounded: {cues.ask[:40]!r} on {cues.passage} provided characters"  # type: ignore[index]
    return None


def _material(user: str, start: int, end: int) -> int:
    """Characters of provided material: inside fenced blocks if any; else, with the
    instruction on the first line, the text after the colon or line break that ends
    it; otherwise the text before the instruction's line."""
    if "```" in user:
        return sum(len(part) for part in user.split("```")[1::2])
    first_break = user.find("\n")
    if first_break < 0 or start < first_break:  # the instruction opens the message
        cuts = [i for i in (user.find("\n", end), user.find(": ", end)) if i >= 0]
        return len(user) - min(cuts) - 1 if cuts else 0
    return max(user.rfind("\n", 0, start), 0)
