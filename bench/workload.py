"""Deterministic benchmark prompts per request class, shared by the engine and live benchmarks.

- code: ask for a standard-library function by name, or continue a real function header;
- structured: ask for JSON records (with and without `response_format`);
- chat: ask what a standard-library function or class does;
- edit: fix the spelling of a standard-library docstring with typos put in, or rename a
  parameter in a short standard-library function (the answer copies the input);
- extract (not in `TASKS`: only the live bench asks for it): pull named fields out of a
  short note into JSON (the answer copies values from the prompt).
Names and texts come from the standard library's own modules, so every prompt set is
reproducible on any Python 3.11 install without downloads. `Exclusion` leaves modules and
texts out (the live bench: the documents the drafters were trained on); without one the
draws are those every earlier prior and table was measured on.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

TASKS = ("code", "structured", "chat", "edit")
EXTRACT = "extract"
_MODULES = ("json/decoder.py", "textwrap.py", "string.py", "shlex.py", "fractions.py", "heapq.py",
            "bisect.py", "calendar.py", "colorsys.py", "difflib.py", "csv.py", "glob.py",
            "fnmatch.py", "statistics.py", "random.py", "ipaddress.py", "base64.py", "html/__init__.py")
_FIELDS = ["id", "name", "email", "age", "city", "active", "tags", "order_id", "status", "total"]
_PEOPLE = ["Ada Lind", "Bo Sato", "Cyra Moss", "Dov Hale", "Eun Park", "Femi Cole", "Gus Oyelaran",
           "Hana Ruiz", "Ivo Stark", "Jo Dunne", "Kai Varga", "Lena Brandt", "Milo Ferris"]
_PLACES = ["Ghent", "Porto", "Turku", "Graz", "Cork", "Brno", "Bergen", "Lyon", "Kyoto", "Perth"]
_ITEMS = ["a standing desk", "two monitors", "a USB hub", "a keyboard", "noise-cancelling headphones",
          "a webcam", "an ergonomic chair", "a laptop stand"]


@dataclass(frozen=True)
class Exclusion:
    """What a prompt set must not be built from: stdlib modules (relative paths as in
    `_MODULES`) and texts (docstring paragraphs and function sources, whitespace-normalised)."""

    modules: frozenset[str] = frozenset()
    texts: frozenset[str] = frozenset()

    def keeps(self, text: str) -> bool:
        return " ".join(text.split()) not in self.texts


@dataclass(frozen=True)
class Prompt:
    task: str
    messages: tuple[dict, ...]
    response_format: dict | None = None

    def chat_body(self, model: str, max_tokens: int, temperature: float) -> dict:
        body = {"model": model, "messages": list(self.messages), "max_tokens": max_tokens,
                "temperature": temperature}
        if self.response_format:
            body["response_format"] = self.response_format
        return body


def modules(exclusion: Exclusion | None = None) -> tuple[str, ...]:
    return tuple(m for m in _MODULES if exclusion is None or m not in exclusion.modules)


@lru_cache(maxsize=8)
def _stdlib_functions(exclusion: Exclusion | None = None) -> list[tuple[str, str]]:
    """(name, first docstring line) of public functions in a fixed list of stdlib modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for rel in modules(exclusion):
        path = root / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n")[0]
                found.append((node.name, doc))
    return found


@lru_cache(maxsize=8)
def _stdlib_texts(exclusion: Exclusion | None = None) -> tuple[list[str], list[str]]:
    """(docstring paragraphs of 150-500 characters, sources of 4-14 line functions with
    parameters) from the same modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, sources = [], []
    for rel in modules(exclusion):
        path = root / rel
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef):
                for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
                    paragraph = " ".join(paragraph.split())
                    if (150 <= len(paragraph) <= 500 and paragraph[0].isalpha()
                            and (exclusion is None or exclusion.keeps(paragraph))):
                        docs.append(paragraph)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            source = ast.get_source_segment(text, node) or ""
            if (isinstance(node, ast.FunctionDef) and node.args.args
                    and 4 <= source.count("\n") <= 14
                    and (exclusion is None or exclusion.keeps(source))):
                sources.append(source)
    return list(docs), list(sources)


def _typos(text: str, rng: random.Random) -> str:
    """Swap two inner letters in about one word of six of five letters or more."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if len(word) >= 5 and word.isalpha() and rng.random() < 1 / 6:
            j = rng.randrange(1, len(word) - 2)
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2:]
    return " ".join(words)


def _edit(rng: random.Random, docs: list[str], sources: list[str]) -> str:
    if rng.random() < 0.5:
        text = _typos(rng.choice(docs), rng)
        return rng.choice([
            f"Fix the spelling mistakes in this text and return the corrected text only:\n{text}",
            f"Proofread the following paragraph and give back the corrected version:\n{text}",
            f"{text}\n\nCorrect the typos in the text above."])
    source = rng.choice(sources)
    old = ast.parse(source).body[0].args.args[0].arg  # type: ignore[attr-defined]
    new = f"{old}_value" if old != "self" else "this"
    return (f"Rename the parameter `{old}` to `{new}` in this function and return the whole "
            f"function:\n```python\n{source}\n```")


def _extract(rng: random.Random) -> Prompt:
    """A note with a person, a place, an order and a date; asks for some of them as JSON."""
    person, place, item = rng.choice(_PEOPLE), rng.choice(_PLACES), rng.choice(_ITEMS)
    email = person.lower().replace(" ", ".") + "@example.org"
    order, day = f"{rng.choice('ABCDEFGH')}{rng.randint(10000, 99999)}", rng.randint(1, 28)
    note = rng.choice([
        f"Hi, this is {person} from {place} ({email}). My order {order} for {item} placed on "
        f"March {day} has not arrived yet.",
        f"Order {order} ({item}) was shipped to {person} in {place} on March {day}; contact: "
        f"{email}.",
        f"{person} <{email}> wrote from {place} on March {day} asking to cancel order {order} "
        f"({item})."])
    fields = ", ".join(rng.sample(["name", "email", "city", "order_id", "item", "date"],
                                  rng.randint(3, 5)))
    ask = rng.choice([f"Extract {fields} from this message as a JSON object:\n{note}",
                      f"{note}\n\nReturn the fields {fields} of the message above as JSON."])
    fmt = {"type": "json_object"} if rng.random() < 0.5 else None
    return Prompt(EXTRACT, ({"role": "user", "content": ask},), fmt)


def prompts(task: str, n: int, seed: int = 0,
            exclusion: Exclusion | None = None) -> list[Prompt]:
    """`n` prompts of `task`, drawn with replacement (a text may repeat): the same ones for
    the same arguments."""
    if task not in (*TASKS, EXTRACT):
        raise ValueError(f"unknown task {task!r}; expected one of {(*TASKS, EXTRACT)}")
    rng = random.Random(f"{task}-{seed}")
    if task == EXTRACT:
        return [_extract(rng) for _ in range(n)]
    functions = _stdlib_functions(exclusion)
    docs, sources = _stdlib_texts(exclusion) if task == "edit" else ([], [])
    out = []
    for _ in range(n):
        name, _doc = rng.choice(functions)
        if task == "code":
            ask = rng.choice([f"Write a Python function {name}.", f"Implement {name} in Python.",
                              f"Show me the code for {name}."])
            out.append(Prompt(task, ({"role": "user", "content": ask},)))
        elif task == "structured":
            fields = ", ".join(rng.sample(_FIELDS, rng.randint(3, 6)))
            ask = rng.choice([f"Return a JSON object with the fields {fields}.",
                              f"Respond only with JSON. Fields: {fields}.",
                              "Generate one JSON record for the test database."])
            fmt = {"type": "json_object"} if rng.random() < 0.5 else None
            out.append(Prompt(task, ({"role": "user", "content": ask},), fmt))
        elif task == "edit":
            out.append(Prompt(task, ({"role": "user", "content": _edit(rng, docs, sources)},)))
        else:
            ask = rng.choice([f"What does {name} do?", f"Explain {name} briefly.",
                              f"Tell me about {name}.", f"Can you describe {name}?"])
            out.append(Prompt(task, ({"role": "user", "content": ask},)))
    return out
