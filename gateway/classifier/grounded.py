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

Code edits (issue 41): an instruction that opens its sentence ("Use a list comprehension
in the following code", "Please add a docstring to the given function", "Debug the code
above") with code after (or before) it is an edit even when the snippet is short
(`MIN_CODE_CHARS`, a quarter of the message): the answer is the code again, changed. The
verbs that also open asks for new work (add, use, create, implement, make, ...) count
only with code to change and a pointer to it in the same sentence; a port to another
language ("convert this to Rust") is not an edit (the answer shares names, not text).
Developed on the training prompts only (bench/traces/data/prompts.jsonl: Code Alpaca's
and DebugBench's code edits against its other categories), never on a judging set.
"""

from __future__ import annotations

import re
import string
from typing import NamedTuple

from gateway.classifier.code_edit import PORT, code_edit_cue, fenced, imperative, program_like

EDGE_CHARS = 300
MIN_MATERIAL_CHARS = 120  # ~30 tokens
MIN_MATERIAL_SHARE = 0.5
# Code to edit: a short snippet is still what the answer copies (an edited function is
# the function again), so less of it, and less of the message, suffices.
MIN_CODE_CHARS = 24
MIN_CODE_SHARE = 0.25

_EDIT = re.compile(
    r"\b(?:fix|correct|proofread|rewrite|re-write|rephrase|reword|edit|revise|refactor|rename|"
    r"modify|update|change|replace|"
    r"reformat|re-indent|reindent|polish|tidy|clean\s+up|improve\s+the\s+(?:grammar|wording|"
    r"style|formatting)|add\s+(?:type\s+hints|docstrings?|comments)|convert\s+(?:it|this|the\s+"
    r"\w+)\s+to\s+(?:f-strings|snake_case|camelcase|a\s+list\s+comprehension))\w*\b",
    re.IGNORECASE)
# Edit verbs that also open asks for new work ("create a function that..."): an edit of
# code only with code after the instruction and a pointer to it in the same sentence
# ("add a comment to the following code", "use a list comprehension in this loop").
_CODE_EDIT = re.compile(
    r"\b(?:add|use|create|implement|make|include|insert|remove|delete|extend|convert|"
    r"optimi[sz]e|improve|debug|adjust|alter|amend|port|migrate|wrap|simplify|handle|"
    r"transform|restructure|reorganize|rework|enhance|apply)\w*\b[^.?!\n]{0,80}?\b"
    r"(?:following|this|these|given|above|below|provided|existing|attached|my|the\s+(?:code|"
    r"function|class|method|script|program|query|snippet|loop|module|component|file|"
    r"statement|expression|line))\b",
    re.IGNORECASE)
_CODE_EDIT_STEMS = ("add", "use", "creat", "implement", "make", "includ", "insert", "remov",
                    "delet", "extend", "convert", "optimi", "improv", "debug", "adjust",
                    "alter", "amend", "port", "migrat", "wrap", "simplif", "handl",
                    "transform", "restructur", "reorgani", "rework", "enhanc", "appl")
# Edits that add new code (the answer copies less of the material) against edits that
# keep most of it: a feature of the drafter predictor (features.py).
ADDITIVE_STEMS = ("add", "creat", "implement", "includ", "insert", "extend", "make", "use",
                  "handl", "wrap", "enhanc", "appl", "improv")
_CODE_SIGNS = ("(", "{", ";", "=", "<", "[", "\n    ", "\n\t", "def ", "return")
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


# Word starts: the edges lowercased, with line breaks and opening marks as spaces, behind
# one space, so a stem behind a space is a word start (" use" is not in "because").
_SPACE_CHARS = "\n\t\r([{\"'`*_/<>.:,!?"
# ASCII only (non-ASCII edges go to the regexes): one table lookup per byte lowercases
# and blanks, where `str.lower` then `str.translate` took two passes, the second a dict
# lookup per character.
_LOWER_SPACES = bytes.maketrans(
    string.ascii_uppercase.encode() + _SPACE_CHARS.encode(),
    string.ascii_lowercase.encode() + b" " * len(_SPACE_CHARS))


class _Edges:
    """The first and the last `EDGE_CHARS` of a message, outside fenced blocks (a word
    in the provided code is not the instruction), and which patterns' stems start a word
    in each (one scan of each edge for every pattern; None: not ASCII, where only the
    regex can tell)."""

    def __init__(self, user: str) -> None:
        head, tail = EDGE_CHARS, max(len(user) - EDGE_CHARS, 0)
        if fenced(user):
            head = min(head, user.find("```"))
            tail = max(tail, user.rfind("```") + 3)
        self.head: int = head
        self.tail: int = tail
        self.head_kinds: frozenset[str] | None = _kinds(user[:head])
        self.tail_kinds: frozenset[str] | None = (_kinds(user[tail:]) if tail < len(user)
                                                  else frozenset())

    def match(self, user: str, pattern: re.Pattern, kind: str) -> re.Match | None:
        """`pattern` (of `kind`) in the head, else in the tail, where its stem starts a
        word."""
        kinds = self.head_kinds
        found = pattern.search(user, 0, self.head) if kinds is None or kind in kinds else None
        kinds = self.tail_kinds
        if found is None and self.tail < len(user) and (kinds is None or kind in kinds):
            found = pattern.search(user, self.tail)
        return found


_KIND_STEMS = {"edit": _EDIT_STEMS, "code_edit": _CODE_EDIT_STEMS, "grounded": _GROUNDED_STEMS}
_ALL_STEMS = sorted({stem for stems in _KIND_STEMS.values() for stem in stems}, key=len)
# the shortest stem wins at a position: it stands for every stem it prefixes or extends
_STEM_KINDS = {stem: frozenset(kind for kind, stems in _KIND_STEMS.items()
                               if any(s.startswith(stem) or stem.startswith(s) for s in stems))
               for stem in _ALL_STEMS}


def _trie(stems: list[str]) -> str:
    """An alternation of `stems` as a trie (a branch per first letter, a stem that ends
    before the others continue tried first): at a position it matches the shortest stem
    there, as the flat alternation shortest first does, where that one tried every stem
    at every space."""
    if "" in stems:
        rest = [stem for stem in stems if stem]
        return f"(?:|{_trie(rest)})" if rest else ""
    by_first: dict[str, list[str]] = {}
    for stem in stems:
        by_first.setdefault(stem[0], []).append(stem[1:])
    branches = [re.escape(first) + _trie(sorted(tails, key=len))
                for first, tails in by_first.items()]
    return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"


_STEM = re.compile(f" ({_trie(_ALL_STEMS)})")


def _kinds(edge: str) -> frozenset[str] | None:
    if not edge.isascii():
        return None
    words = " " + edge.encode().translate(_LOWER_SPACES).decode()
    found: frozenset[str] = frozenset()
    for stem in _STEM.findall(words):
        found |= _STEM_KINDS[stem]
    return found


class CopyCues(NamedTuple):
    """What `copy_cues` found: the edit verb and the material it acts on, the grounded
    ask and the passage it reads (characters; 0 where no verb or ask), whether the
    material is code, and the instruction's words that name something in it (of how
    many it has)."""

    verb: str | None
    material: int
    ask: str | None
    passage: int
    code: bool = False
    named: int = 0
    words: int = 0

    @property
    def edit(self) -> bool:
        """An edit verb with enough material to act on: `MIN_MATERIAL_CHARS`, or
        `MIN_CODE_CHARS` of code."""
        return self.verb is not None and (
            self.material >= MIN_MATERIAL_CHARS or (self.code and self.material >= MIN_CODE_CHARS))

    @property
    def grounded(self) -> bool:
        """A grounded ask with a passage of at least `MIN_PASSAGE_CHARS`."""
        return self.ask is not None and self.passage >= MIN_PASSAGE_CHARS


NO_CUES = CopyCues(None, 0, None, 0)


def copy_cues(user: str) -> CopyCues:
    """The edit verb and the grounded ask at the message's edges, with what they act on:
    read once per request by the classifier (`edit_evidence`) and the drafter
    predictor's features (gateway/classifier/features.py)."""
    if len(user) < MIN_CODE_CHARS:
        return NO_CUES
    edges = _Edges(user)
    verb = edges.match(user, _EDIT, "edit")
    generic = verb is None
    if generic:
        verb = edges.match(user, _CODE_EDIT, "code_edit")
    material, code, named, words = 0, False, 0, 0
    found: str | None = None
    if verb is not None:
        material, cut = _material(user, verb.start(), verb.end())
        code = (imperative(user, verb.start()) and _looks_like_code(user, cut, material)
                and (not generic or program_like(_head(user, cut)))
                and not PORT.search(user, verb.start(), _sentence_end(user, verb.end())))
        if generic and not code:
            verb, material = None, 0
        elif code:
            named, words = _named(user, verb.start(), cut, material)
        found = verb.group(0).lower() if verb is not None else None
    if not code:  # an instruction phrased otherwise, on the program it gives
        cue = code_edit_cue(user, MIN_CODE_CHARS, MIN_CODE_SHARE, MIN_MATERIAL_CHARS)
        if cue is not None:
            found, code, material = cue[0], True, cue[2]
            named, words = _named(user, cue[1], cue[3], material)
    ask = (edges.match(user, _GROUNDED, "grounded") if len(user) >= MIN_PASSAGE_CHARS
           else None)
    passage = _material(user, ask.start(), ask.end())[0] if ask is not None else 0
    return CopyCues(found, material, ask.group(0).lower() if ask is not None else None,
                    passage, code, named, words)


def edit_evidence(user: str, cues: CopyCues | None = None) -> str | None:
    """Why `user` is a copy-heavy request (an edit, or an answer grounded in a passage
    it provides, that is most of the message), or None (see the module docstring).
    `cues`: `copy_cues(user)`, where the caller has it."""
    cues = copy_cues(user) if cues is None else cues
    share = (MIN_CODE_SHARE if cues.code else MIN_MATERIAL_SHARE) * len(user)
    if cues.edit and cues.material >= share:
        kind = "code" if cues.code else "provided"
        return f"edit: {cues.verb!r} on {cues.material} {kind} characters"
    if cues.grounded and cues.passage >= MIN_MATERIAL_SHARE * len(user):
        return f"grounded: {cues.ask[:40]!r} on {cues.passage} provided characters"  # type: ignore[index]
    return None


def _sentence_end(user: str, start: int) -> int:
    """Where the sentence around `start` ends (at most 120 characters on)."""
    stop = min(start + 120, len(user))
    for mark in ".?!\n:":
        found = user.find(mark, start, stop)
        if found >= 0:
            stop = found
    return stop


def _looks_like_code(user: str, cut: int, material: int) -> bool:
    """Whether the material (from `cut`, or the fenced blocks) shows a sign of code."""
    if material <= 0:
        return False
    if fenced(user):
        return True  # fenced: code or data the answer reproduces
    piece = _head(user, cut)
    for sign in _CODE_SIGNS:  # a plain loop: a generator's frame per sign costs more
        if sign in piece:
            return True
    return False


def _head(user: str, cut: int) -> str:
    """The material's first 512 characters (`cut` -1: the message's)."""
    return user[cut: cut + 512] if cut >= 0 else user[:512]


def _named(user: str, start: int, cut: int, material: int) -> tuple[int, int]:
    """Of the instruction's words (at most 12, 2+ characters), how many occur in the
    material's first 2 KB: a targeted edit ("rename total in add_tax") names what it
    changes, and its answer is the material again."""
    if 0 <= start < cut:
        instruction, body = user[start: cut][:EDGE_CHARS], user[cut: cut + 2048]
    else:  # the instruction follows the material
        instruction, body = user[start: start + EDGE_CHARS], user[max(start - 2048, 0): start]
    words = [w.strip("`'\"()[]{}:;,.?!") for w in instruction.split()[1:13]]
    words = [w for w in words if len(w) >= 2 and w.lower() not in _COMMON]
    return sum(1 for w in words if w in body), len(words)


_COMMON = frozenset({"the", "this", "that", "these", "to", "in", "of", "a", "an", "and", "or",
                     "it", "so", "for", "is", "be", "with", "following", "given", "below",
                     "above", "code", "function", "program", "snippet", "script", "from",
                     "by", "on", "as", "into", "instead", "using", "use", "make", "sure",
                     "provided", "existing", "should", "can", "will", "which", "its"})


def _material(user: str, start: int, end: int) -> tuple[int, int]:
    """Characters of provided material, and where it starts (-1: it ends where the
    instruction's line starts): inside fenced blocks if any; else, with the instruction
    on the first line, the text after the colon or line break that ends it; otherwise
    the text before the instruction's line."""
    if fenced(user):
        first = user.find("```")
        return sum(len(part) for part in user.split("```")[1::2]), first
    first_break = user.find("\n")
    if first_break < 0 or start < first_break:  # the instruction opens the message
        cuts = [i for i in (user.find("\n", end), user.find(": ", end)) if i >= 0]
        return (len(user) - min(cuts) - 1, min(cuts) + 1) if cuts else (0, len(user))
    return max(user.rfind("\n", 0, start), 0), -1
