"""The training corpus, built from text found on every Python install.

Four sources, all deterministic for a given seed and Python version:
- code: the standard library's own `.py` sources;
- prose: docstrings pulled out of those sources with `ast`, and `pydoc_data.topics`;
- structured: JSON records from a seeded generator (also asked for inside chat turns);
- chat: chat-formatted question/answer turns built from docstrings and records.

Chat turns use `chat_template.render_chat`, shared with the worker's chat route.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.embedded.chat_template import render_chat


@dataclass
class Document:
    kind: str  # "code" | "prose" | "structured" | "chat"
    text: str


def stdlib_files(limit_bytes: int = 400_000) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__")
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in skip or part.startswith("test_") for part in rel):
            continue
        if path.stat().st_size <= limit_bytes:
            files.append(path)
    return files


def _docstrings(tree: ast.AST) -> Iterator[tuple[str, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 40:
                yield node.name, doc


_FIRST = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
          "mallory", "niaj", "olivia", "peggy", "rupert", "sybil", "trent", "victor", "walter"]
_LAST = ["smith", "jones", "garcia", "miller", "davis", "lopez", "wilson", "moore", "taylor",
         "anderson", "thomas", "jackson", "white", "harris", "martin", "thompson"]
_CITIES = ["Berlin", "Paris", "Lisbon", "Oslo", "Madrid", "Vienna", "Dublin", "Prague", "Rome",
           "Tokyo", "Seoul", "Toronto", "Austin", "Denver", "Boston", "Sydney"]
_TAGS = ["admin", "beta", "billing", "core", "edge", "growth", "infra", "ml", "ops", "search",
         "security", "support", "web"]
_PRODUCTS = ["keyboard", "monitor", "laptop", "cable", "router", "headset", "camera", "desk",
             "chair", "lamp", "speaker", "tablet"]


def json_record(rng: random.Random) -> dict:
    kind = rng.choice(["user", "order", "event"])
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    if kind == "user":
        return {
            "id": rng.randint(1, 99999),
            "name": f"{first.title()} {last.title()}",
            "email": f"{first}.{last}@example.com",
            "age": rng.randint(18, 90),
            "city": rng.choice(_CITIES),
            "active": rng.random() < 0.7,
            "tags": rng.sample(_TAGS, rng.randint(0, 3)),
        }
    if kind == "order":
        items: list[dict[str, Any]] = [
            {"product": rng.choice(_PRODUCTS), "quantity": rng.randint(1, 5),
             "price": round(rng.uniform(5, 900), 2)}
            for _ in range(rng.randint(1, 3))
        ]
        return {
            "order_id": f"ORD-{rng.randint(1000, 9999)}",
            "customer": f"{first}.{last}@example.com",
            "items": items,
            "total": round(sum(i["price"] * i["quantity"] for i in items), 2),
            "status": rng.choice(["pending", "shipped", "delivered", "cancelled"]),
        }
    return {
        "event": rng.choice(["login", "logout", "purchase", "signup", "error"]),
        "user_id": rng.randint(1, 99999),
        "timestamp": f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
        "source": rng.choice(["web", "ios", "android", "api"]),
        "ok": rng.random() < 0.9,
    }


def _json_text(record: dict, rng: random.Random) -> str:
    return json.dumps(record, indent=2 if rng.random() < 0.5 else None)


def _structured_turn(rng: random.Random) -> str:
    record = json_record(rng)
    keys = ", ".join(record)
    asks = [
        f"Return a JSON object with the fields {keys}.",
        f"Give me a sample {next(iter(record))} record as JSON.",
        "Generate one JSON record for the test database.",
        f"Respond only with JSON. Fields: {keys}.",
    ]
    return render_chat(
        [{"role": "user", "content": rng.choice(asks)},
         {"role": "assistant", "content": _json_text(record, rng)}],
        add_generation_prompt=False,
    )


def _chat_turn(name: str, doc: str, rng: random.Random) -> str:
    first_para = " ".join(doc.strip().split("\n\n")[:2]).replace("\n", " ")
    asks = [f"What does {name} do?", f"Explain {name} briefly.", f"Can you describe {name}?",
            f"Tell me about {name}.", f"How would you use {name}?"]
    return render_chat(
        [{"role": "user", "content": rng.choice(asks)},
         {"role": "assistant", "content": first_para}],
        add_generation_prompt=False,
    )


def _code_turn(name: str, source: str, rng: random.Random) -> str:
    asks = [f"Write a Python function {name}.", f"Show me the code for {name}.",
            f"Implement {name} in Python."]
    return render_chat(
        [{"role": "user", "content": rng.choice(asks)},
         {"role": "assistant", "content": f"```python\n{source}\n```"}],
        add_generation_prompt=False,
    )


def build_corpus(seed: int = 0) -> list[Document]:
    """Every document of the corpus, in a seeded order."""
    rng = random.Random(seed)
    docs: list[Document] = []
    for path in stdlib_files():
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        docs.append(Document("code", source))
        for name, doc in _docstrings(tree):
            docs.append(Document("prose", doc))
            docs.append(Document("chat", _chat_turn(name, doc, rng)))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and rng.random() < 0.3:
                segment = ast.get_source_segment(source, node)
                if segment and len(segment) < 1500:
                    docs.append(Document("chat", _code_turn(node.name, segment, rng)))
    topics: dict[str, str] = {}
    try:
        from pydoc_data.topics import topics as pydoc_topics

        topics = dict(pydoc_topics)
    except ImportError:  # some distributions strip pydoc_data
        pass
    for _, text in sorted(topics.items()):
        docs.append(Document("prose", text))
    n_code = sum(len(d.text) for d in docs if d.kind == "code")
    structured_chars = 0
    while structured_chars < 0.25 * n_code:
        if rng.random() < 0.5:
            text = "\n".join(_json_text(json_record(rng), rng) for _ in range(rng.randint(1, 4)))
        else:
            text = _structured_turn(rng)
        docs.append(Document("structured", text))
        structured_chars += len(text)
    rng.shuffle(docs)
    return docs
