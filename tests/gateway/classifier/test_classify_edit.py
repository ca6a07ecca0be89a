"""Edit requests (rewrite material the message provides) are their own task: the answer
copies the input, which n-gram drafting accepts best (gateway/classifier/grounded.py)."""

from __future__ import annotations

import pytest

from bench.workload import TASKS, prompts
from gateway.classifier.classify import classify
from gateway.schemas import parse_request

PARAGRAPH = ("The quick brown fox jumpd over the lazy dog. It was a sunny day and the fox was "
             "verry happy. The dog did not care becuase it was sleeping under a big tree.")
FUNCTION = ("def total(values):\n    result = 0\n    for value in values:\n        result += value\n"
            "    return result\n\n\ndef mean(values):\n    return total(values) / len(values)\n")


def task_of(text: str) -> str:
    return classify(parse_request({"model": "m", "messages": [{"role": "user", "content": text}]},
                                  "chat")).task


@pytest.mark.parametrize("text", [
    f"Fix the spelling mistakes in this paragraph and return it:\n{PARAGRAPH}",
    f"Proofread this: {PARAGRAPH}",
    f"{PARAGRAPH}\n\nCorrect the typos in the text above.",
    f"Rename `values` to `numbers` in this code:\n```python\n{FUNCTION}```",
    f"Add type hints to this module:\n```python\n{FUNCTION}```",
])
def test_edits_of_provided_material_are_edit(text: str) -> None:
    assert task_of(text) == "edit"


@pytest.mark.parametrize(("text", "task"), [
    # the same verbs with nothing provided to copy from
    ("Write a Python function that fixes common spelling mistakes in a text using a "
     "dictionary of typos, keeping punctuation and capitalization.", "code"),
    ("How do I fix a flat tire on a bicycle? I have a patch kit and a pump but I have never "
     "done it before and I am not sure which steps come first.", "chat"),
    # provided material whose answer does not copy it
    (f"Translate this paragraph to French:\n{PARAGRAPH}", "chat"),
    # a passage too short to draft from
    (f"Summarize this paragraph in one sentence:\n{PARAGRAPH}", "chat"),
    # a requested output format still decides
    (f"Fix the typos and return the result as JSON with a field text:\n{PARAGRAPH}",
     "structured"),
])
def test_not_edits(text: str, task: str) -> None:
    assert task_of(text) == task


def test_benchmark_edit_prompts_classify_as_edit_and_no_other_class_does() -> None:
    for task in TASKS:
        for prompt in prompts(task, 40, seed=3):
            got = classify(parse_request(prompt.chat_body("m", 32, 0.0), "chat")).task
            assert (got == "edit") == (task == "edit"), (task, got, prompt.messages)


ARTICLE = ("The town council met on Tuesday to discuss the new library. Members agreed that "
           "the old building on Mill Street was too small for the growing number of readers, "
           "and that a site near the station would serve commuters best. The mayor said the "
           "work could start next spring if the budget is approved in March. Several residents "
           "asked for longer opening hours and a room for children's reading groups.")


@pytest.mark.parametrize("text", [
    f"Summarize the following article in two sentences.\n\n{ARTICLE}",
    f"Extract the answer to the question from the following context.\nQuestion: When could "
    f"the work start?\nContext: {ARTICLE}",
    f"{ARTICLE}\n\nBased on the text above, answer: where will the new library be?",
    f"Modify the following code so that it returns the median too.\n\n{FUNCTION}",
])
def test_answers_grounded_in_a_provided_passage_are_copy_heavy(text: str) -> None:
    """A summary, an extraction or an answer from a passage the message provides reuses
    its words: on public prompts prompt lookup beat EAGLE on most such requests
    (docs/TRACES.md). So does a modify/update/replace of provided code."""
    assert task_of(text) == "edit"


@pytest.mark.parametrize("text", [
    "Translate this French text into English.\n\nJe t'assure que ce n'est pas qu'une "
    "question d'argent.",
    "Give a grammar tip on how to end a German verb.",
    "Extract the main idea: people like parks.",  # an ask, but no passage to draft from
])
def test_prose_is_not_code_or_edit(text: str) -> None:
    """`code` means code: quotes, line breaks and "how to" are not code."""
    assert task_of(text) == "chat"


def test_a_verb_inside_provided_code_is_not_the_instruction() -> None:
    text = f"Complete this Python function.\n\n```python\nFIX = 'later'\n{FUNCTION}```"
    assert task_of(text) == "code"


SNIPPET = "def avg(xs):\n    return sum(xs) / len(xs)\n"


@pytest.mark.parametrize("text", [
    "Use a list comprehension in the following code.\n\nout = []\nfor x in xs:\n    out.append(x * 2)\n",
    f"Implement error handling in this function:\n```python\n{SNIPPET}```",
    f"Fix this bug:\n\n{SNIPPET}",
    f"Please add a docstring to the given function.\n\n{SNIPPET}",
    f"{SNIPPET}\nDebug the code above so that an empty list returns 0.",
])
def test_edit_instructions_on_provided_code_are_edit(text: str) -> None:
    """Issue 41: an edit instruction (add, use, implement, fix, debug, ...) on code the
    message gives is copy-heavy even when the snippet is short: the answer is the code
    again, changed."""
    assert task_of(text) == "edit"


@pytest.mark.parametrize(("text", "task"), [
    # the generic verbs ask for new code where nothing is given to change
    ("Create a function that returns the average of a list of numbers, or 0 when empty.",
     "code"),
    ("Implement a binary search over a sorted list in Python.", "code"),
    # a port writes the program anew in another language: it shares names, not text
    (f"Convert this Python function to Rust:\n\n{SNIPPET}", "code"),
    # the verb is not the instruction: a question about something else
    ("What is the code for a JavaScript function that replaces null values with zero in "
     "this object: {\"a\": null, \"b\": 2}", "code"),
])
def test_generic_verbs_without_code_to_change_are_not_edits(text: str, task: str) -> None:
    assert task_of(text) == task


PROGRAM = ("import os\n\n\ndef load_config(path):\n    with open(path) as handle:\n"
           "        return dict(line.split('=', 1) for line in handle)\n\n\n"
           "config = load_config('settings.ini')\nprint(config['name'])\n")


@pytest.mark.parametrize("text", [
    # an edit verb after a clause that finds what it changes, or after a question's lead
    f"Given the following code, detect the bug and correct it.\n\n{PROGRAM}",
    f"Find and fix the error in this program.\n\n{PROGRAM}",
    f"How would you rewrite this to read the path from the environment?\n\n{PROGRAM}",
    # verbs of refactoring, and generic verbs without a pointer word
    f"Introduce a default value for the missing 'name' key.\n\n{PROGRAM}",
    f"Add error handling for a missing file and a malformed line.\n\n{PROGRAM}",
    f"Use pathlib instead of the built-in open.\n\n{PROGRAM}",
    # what the code should do, or does wrong
    f"The program should print a default name when the key is absent.\n\n{PROGRAM}",
    f"load_config crashes when the file does not exist; make it return an empty dict.\n\n"
    f"{PROGRAM}",
    # the instruction after the program, and inside fences
    f"```python\n{PROGRAM}```\nMake it thread-safe.",
])
def test_code_edit_instructions_phrased_otherwise_are_edit(text: str) -> None:
    """Issue 41: an instruction to change the program the message gives, whatever its
    verb or phrasing, is answered with the program again (gateway/classifier/code_edit.py)."""
    assert task_of(text) == "edit"


@pytest.mark.parametrize(("text", "task"), [
    # a data literal is not a program to edit: the answer is new code
    ("Create a function that returns the longest word in the given list.\n\n"
     "words = ['apple', 'banana', 'cherry', 'kiwi']", "code"),
    # prose answers about the program, tests for it, a port of it
    (f"Explain what this program does.\n\n{PROGRAM}", "code"),
    (f"What is the output of the following code?\n\n{PROGRAM}", "code"),
    (f"Write unit tests for the following code.\n\n{PROGRAM}", "code"),
    (f"Translate this program into Go.\n\n{PROGRAM}", "code"),
    # a pasted error message is not an instruction
    ("ERROR: relation \"users\" does not exist\nLINE 1: SELECT * FROM users;\n\n"
     "what did I miss in Postgres?", "code"),
])
def test_asks_about_a_program_that_do_not_edit_it_are_not_edit(text: str, task: str) -> None:
    assert task_of(text) == task
