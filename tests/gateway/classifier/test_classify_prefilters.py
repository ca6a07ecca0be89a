"""The classifier's substring prefilters never change a verdict: each rule gives what its
regexes give when run on everything (gateway/classifier/classify.py: `_FUNCTION_NEEDLES`,
`_TECH_NEEDLES`, `_ASK_VERBS`), on texts built from the words the regexes look for, near
misses, case changes, punctuation, line breaks and non-ASCII letters that case folding
maps onto ASCII ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.classifier import classify as c

WORDS = ["write", "Write", "WRITE", "implement", "give me", "show me", "send", "make",
         "build", "code", "send me the code", "show us some code", "the following", "this", "my", "below", "class", "function",
         "método", "función", "funktion", "fonction", "funcao", "script", "ſcript",
         "query", "snippet", "regex", "test", "program", "python", "Python", "PYTHON",
         "pythoN", "javascript", "c++", "c#", "sql", "SQL", "git", "digit", "pip", "jq",
         "node.js", "docker", "terminal", "command line", "how", "How do I", "how to",
         "explain", "Explain what this does:", "what", "does:", "example", "examples",
         "show me an example", "with a small example", "函数", "用", "写", "一个", "metodo",
         "consulta", "en", "una", "escribe", "K", "ΚΑΙ", "İ", "hello", "the", "a", "in",
         ".", "?", "!", ":", "\n", "  "]
texts = st.lists(st.sampled_from(WORDS), max_size=40).map(" ".join)


def code_ask_intl_unfiltered(text: str) -> str | None:
    if text.isascii() and len(text) > c.INTL_CHARS:
        return None
    match = c._CODE_ASK_INTL.search(text, 0, c.INTL_CHARS)
    return f"asks for code: {match.group(0)[:60]!r}" if match else None


def tech_howto_unfiltered(text: str) -> str | None:
    head = text[:c.INTL_CHARS]
    if not any(cue in head.lower() for cue in c._HOWTO_CUES):
        return None
    match = c._TECH_HOWTO.search(head)
    return f"programming question: {match.group(0)[:60]!r}" if match else None


def code_ask_unfiltered(text: str, lower: str) -> str | None:
    asked = pasted = None
    for piece in c.code_word_windows(text, lower):
        asked = asked or c._CODE_ASK.search(piece)
        pasted = pasted or c._PASTED_CODE.search(piece)
    if asked:
        return f"asks for code: {asked.group(0)[:60]!r}"
    if pasted:
        return f"refers to pasted code: {pasted.group(0).strip()[:60]!r}"
    return None


@settings(max_examples=1500, deadline=None)
@given(text=texts)
def test_prefilters_change_no_verdict(text: str) -> None:
    assert c._code_ask_intl(text) == code_ask_intl_unfiltered(text)
    assert c._tech_howto(text) == tech_howto_unfiltered(text)
    assert c._code_ask(text, text.lower()) == code_ask_unfiltered(text, text.lower())


def test_each_rule_still_fires() -> None:
    """The prefilters let the asks they guard through."""
    assert c._code_ask_intl("escribe una función en Python que sume dos números")
    assert c._code_ask_intl("用Python写一个函数")
    assert c._tech_howto("how do I undo the last commit in git?")
    assert c._tech_howto("Explain what this does: ls -la | wc -l")
    assert c._code_ask("Write a Python function that reverses a list",
                       "write a python function that reverses a list")
    text = "Why does this code fail?\nx = [1, 2\n"
    assert c._code_ask(text, text.lower())
