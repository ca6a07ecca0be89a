"""Deterministic benchmark prompts per request class, shared by the engine and live benchmarks.

- code: ask for a standard-library function by name, or continue a real function header;
- structured: ask for JSON records (with and without `response_format`);
- chat: ask what a standard-library function or class does.
Names come from the standard library's own modules, so every prompt set is reproducible
on any Python 3.11 install without downloads.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

TASKS = ("code", "structured", "chat")
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


def prompts(task: str, n: int, seed: int = 0) -> list[Prompt]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
    rng = random.Random(f"{task}-{seed}")
    functions = _stdlib_functions()
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
        else:
            ask = rng.choice([f"What does {name} do?", f"Explain {name} briefly.",
                              f"Tell me about {name}.", f"Can you describe {name}?"])
            out.append(Prompt(task, ({"role": "user", "content": ask},)))
    return out
