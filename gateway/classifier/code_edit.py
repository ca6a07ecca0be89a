"""Code-edit instructions by their shape: a short instruction and the program it acts on.

Why: an edit of code (fix it, add error handling to it, make it thread-safe) is answered
with the code again, changed, so prompt-lookup drafting copies most of the answer from
the prompt. The edge verbs of gateway/classifier/grounded.py find "Fix the following
code" but not an instruction phrased otherwise: "Given this Java code, detect the syntax
error and correct it", "How would you rewrite this snippet to check for NULL?",
"Introduce a cache in the 'fetch' function", "The function should return 0 for an empty
list", "Make it thread-safe". Here the message is cut into its instruction (the first
line, or the last, at most `MAX_INSTRUCTION_CHARS`) and the material (the rest, or the
fenced blocks); the material must read as a program (`program_like`: a definition, a
block, a statement's end, an indented line, not a bare data literal such as
`xs = [1, 2]`, for which "create a function that sorts the given list" asks for new
code) and be a quarter of the message; the instruction must hold an edit cue in an
instruction position (`imperative`): an edit verb at the start of any of its clauses,
or a description of what the code should do or does wrong ("should", "so that",
"instead of", "fails", "bug", "error", "a patch"). Ports to another language, asks to
explain, and asks for tests or new code with no cue are not edits. Developed on the
training prompts (bench/traces/data/prompts.jsonl) and on Code Alpaca's rows that are
not in them, labelled by whether the dataset's answer copies its input
(docs/CLASSIFIER.md), never on a judging set.
"""

from __future__ import annotations

import re

MAX_INSTRUCTION_CHARS = 400
# The edit verbs of code in an instruction: the edge verbs' (fix, rewrite, ...), the
# verbs that open asks for new work too (add, use, implement, ...) and the words of
# refactoring ("introduce", "extract", "encapsulate", "move"), each only at a clause's
# start (`imperative`).
_VERB = re.compile(
    r"\b(?:fix|correct|rewrite|re-write|refactor|rename|modify|update|change|replace|edit|"
    r"revise|reformat|re-indent|reindent|polish|tidy|clean|improve|add|use|implement|make|create|"
    r"include|insert|remove|delete|extend|convert|optimi[sz]e|debug|adjust|alter|amend|wrap|"
    r"simplify|handle|transform|restructure|reorgani[sz]e|rework|enhance|apply|introduce|"
    r"incorporate|integrate|ensure|encapsulate|extract|move|split|separate|merge|combine|"
    r"consolidate|reorder|rearrange|annotate|document|initiali[sz]e|set|pass|raise|throw|"
    r"log|cache|memoi[sz]e|validate|sanitize|store|avoid|eliminate|reduce|parallelize|"
    r"vectorize|decorate|normali[sz]e|override|append|prepend|swap|switch|turn|allow|"
    r"enable|disable|support|define|declare|limit|restrict|abstract|generali[sz]e|"
    r"parameteri[sz]e|expose|catch|patch|resolve|repair|complete)(?:e?[sd]|ing)?\b",
    re.IGNORECASE)
# Not verbs of an edit at a clause's start when nothing else says so: "Complete this
# function" (HumanEval's ask) writes the body anew.
_WEAK = frozenset({"complete", "set", "pass", "turn", "switch", "log", "store", "define",
                   "declare", "support", "allow", "limit"})
_BUG = re.compile(
    r"\b(?:should|shouldn't|so\s+that|so\s+it|make\s+(?:it|sure|the)|instead\s+of|fails?|"
    r"failing|error|errors|bugs?|buggy|wrong|incorrect(?:ly)?|doesn't\s+work|does\s+not\s+work|"
    r"not\s+working|broken|crash\w*|exceptions?|a\s+patch|diff|corrected|faulty)\b",
    re.IGNORECASE)
# Asks whose answer is prose or new code, not the code again.
_NOT_EDIT = re.compile(
    r"^\s*(?:explain|describe|what\s+(?:does|is\s+the\s+output|will|would\s+be\s+the\s+output)|"
    r"why|predict|summari[sz]e|write\s+(?:a\s+)?(?:unit\s+)?tests?|translate)\b",
    re.IGNORECASE)
# A port to another language ("convert this to Rust", "port this to Kotlin") writes the
# program anew: its answer shares the names, not the text.
PORT = re.compile(
    r"\b(?:to|into|in|as)\s+(?:idiomatic\s+|modern\s+|equivalent\s+)?(?:python|java|"
    r"javascript|js|typescript|ts|go|golang|rust|c\+\+|c#|c|kotlin|swift|ruby|php|scala|bash|"
    r"shell|sql|haskell|lua|perl|r|dart|elixir|julia|matlab|powershell|objective-c)"
    r"(?![\w+#])", re.IGNORECASE)
# Signs of a program, not a data literal: a definition, a block, a statement's end, an
# indented line, a query.
_PROGRAM = ("def ", "return", "function", "class ", "import ", "#include", "=>", "{\n",
            ";\n", "\n    ", "\n  ", "\n\t", "):", "print(", "console.", "public ", "SELECT ",
            "select ", " if ", "for (", "for ", "while ", "#!/", "<?php", "<div", "fn ",
            "func ", "let ", "const ", "var ", ")\n", "();", "()")


_QUICK = ("(", "=", ";", "{", "<", "\n ", "\n\t", "SELECT", "select ")


def fenced(text: str) -> bool:
    """Whether `text` holds a code fence: a one-character search first (memchr), as a
    three-character needle costs ~6 µs on a 4 KB prompt."""
    return "`" in text and "```" in text


def program_like(piece: str) -> bool:
    """Whether `piece` (the material's head) reads as a program rather than data."""
    if not any_of(piece, _QUICK):  # prose: a few one-character searches
        return False
    return any_of(piece, _PROGRAM)


def any_of(piece: str, needles: tuple[str, ...]) -> bool:
    for sign in needles:  # a plain loop: a generator's frame per sign costs more
        if sign in piece:
            return True
    return False


def imperative(user: str, start: int) -> bool:
    """Whether the verb at `start` opens its sentence, clause or line, or follows only a
    lead ("please", "can you", "how would you", "I need you to"), or a verb that finds
    what it changes ("find and fix", "detect the error and correct it"): an instruction,
    not a verb inside a question about something else."""
    lead = user[max(start - 60, 0): start]
    for mark in ".?!\n:;,":
        lead = lead[lead.rfind(mark) + 1:]
    words = lead.lower().split()
    if "and" in words:  # "identify the bug and fix it": the first clause finds it
        first = words.index("and")
        leading = [w for w in words[:first] if w not in _LEAD]
        if leading:
            return leading[0] in _FINDS and all(w in _LEAD for w in words[first + 1:])
    return all(word in _LEAD for word in words)


_LEAD = frozenset({"please", "can", "could", "would", "will", "you", "kindly", "i", "we",
                   "want", "need", "help", "me", "us", "to", "now", "then", "also", "and",
                   "just", "let's", "lets", "let", "should", "must", "first", "finally",
                   "next", "task:", "instruction:", "how", "do", "does", "one", "might",
                   "may", "shall", "your", "is", "it", "possible", "try"})
_FINDS = frozenset({"find", "identify", "detect", "spot", "locate", "review", "analyze",
                    "analyse", "check", "examine", "inspect", "read", "look", "debug",
                    "understand", "test", "run", "diagnose", "explain", "point"})
# "Create a function that sorts the given list": new work, an edit only of a program
# (`min_program_chars` of it) it extends.
_NEW_WORK = frozenset({"create", "implement", "make", "use"})
# A question about the code ("identify the errors", "what is wrong with it") is answered
# in prose, and a pasted error message is not an instruction: their bug words are not an
# edit ("why" asks for an explanation).
_ASKS = _FINDS | {"what", "which", "is", "are", "does", "do", "can", "could", "how", "where",
                  "when", "who", "tell", "list", "state", "give", "show"}
_NOT_INSTRUCTION = ("error[", "rror:", "RROR:", "Traceback", "Exception in", "panic:",
                    " --> ", "why", "Why")


def instruction_span(user: str) -> tuple[int, int, int, int]:
    """(start, end) of the instruction and (characters, start) of the material: the
    fenced blocks if any, with the text before the first fence (else after the last)
    as the instruction; otherwise the first line and the rest, or the last line and
    what precedes it. (0, 0, 0, 0) where no instruction of at most
    `MAX_INSTRUCTION_CHARS` sits at an end."""
    if fenced(user):
        first, last = user.find("```"), user.rfind("```") + 3
        material = sum(len(part) for part in user.split("```")[1::2])
        if 0 < len(user[:first].strip()) and first <= MAX_INSTRUCTION_CHARS:
            return 0, first, material, first
        if 0 < len(user) - last <= MAX_INSTRUCTION_CHARS:
            return last, len(user), material, first
        return 0, 0, 0, 0
    text = user.rstrip()
    head = text.find("\n")
    if 0 < head <= MAX_INSTRUCTION_CHARS:
        return 0, head, len(text) - head - 1, head + 1
    tail = text.rfind("\n")
    if 0 < tail and len(text) - tail <= MAX_INSTRUCTION_CHARS:
        return tail + 1, len(text), tail, 0
    return 0, 0, 0, 0


def code_edit_cue(user: str, min_chars: int, min_share: float, min_program_chars: int
                  ) -> tuple[str, int, int, int] | None:
    """(cue, its start, material characters, where the material starts) when `user` is
    an instruction to edit the program it provides (module docstring), else None."""
    start, end, material, cut = instruction_span(user)
    if material < min_chars or material < min_share * len(user) or end <= start:
        return None
    if not program_like(user[cut: cut + 512]):
        return None
    if _NOT_EDIT.match(user, start, end) or PORT.search(user, start, end):
        return None
    for found in _VERB.finditer(user, start, end):
        word = found.group(0).lower()
        if word in _WEAK or (word in _NEW_WORK and material < min_program_chars):
            continue
        if imperative(user, found.start()):
            return word, found.start(), material, cut
    instruction = user[start:end]
    first = instruction[:16].lower().split()[:1]
    asks = (bool(first) and first[0] in _ASKS) or any_of(instruction, _NOT_INSTRUCTION)
    bug = None if asks else _BUG.search(instruction)
    if bug is not None:
        return bug.group(0).lower(), start + bug.start(), material, cut
    return None

