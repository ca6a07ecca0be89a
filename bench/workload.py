"""Deterministic benchmark prompts per request class, shared by the engine and live benchmarks.

- code: ask for a standard-library function by name, or continue a real function header;
- structured: ask for JSON records (with and without `response_format`);
- chat: ask what a standard-library function or class does;
- edit: fix the spelling of a standard-library docstring with typos put in, or rename a
  parameter in a short standard-library function (the answer copies the input).
Names and texts come from the standard library's own modules, so every prompt set is
reproducible on any Python 3.11 install without downloads.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TASKS = ("code", "structured", "chat", "edit")
_MODULES = ("json/decoder.py", "textwrap.py", "string.py", "shlex.py", "fractions.py", "heapq.py",
            "bisect.py", "calendar.py", "colorsys.py", "difflib.py", "csv.py", "glob.py",
            "fnmatch.py", "statistics.py", "random.py", "ipaddress.py", "base64.py", "html/__init__.py")
_FIELDS = ["id", "name", "email", "age", "city", "active", "tags", "order_id", "status", "total"]


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


def _stdlib_functions() -> list[tuple[str, str]]:
    """(name, first docstring line) of public functions in a fixed list of stdlib modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for rel in _MODULES:
        path = root / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().split("\n")[0]
                found.append((node.name, doc))
    return found


def _stdlib_texts() -> tuple[list[str], list[str]]:
    """(docstring paragraphs of 150-500 characters, sources of 4-14 line functions with
    parameters) from the same modules."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs, sources = [], []
    for rel in _MODULES:
        path = root / rel
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef):
                for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
                    paragraph = " ".join(paragraph.split())
                    if 150 <= len(paragraph) <= 500 and paragraph[0].isalpha():
                        docs.append(paragraph)
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.ClassDef) or node.name.startswith("_"):
                continue
            source = ast.get_source_segment(text, node) or ""
            if (isinstance(node, ast.FunctionDef) and node.args.args
                    and 4 <= source.count("\n") <= 14):
                sources.append(source)
    return docs, sources


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


def prompts(task: str, n: int, seed: int = 0) -> list[Prompt]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    rng = random.Random(f"{task}-{seed}")
    functions = _stdlib_functions()
    docs, sources = _stdlib_texts() if task == "edit" else ([], [])
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
