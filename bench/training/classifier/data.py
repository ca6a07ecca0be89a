"""The labelled prompt set the request classifier is trained and tested on.

Built offline and deterministically from templates x vocabulary (plus Python stdlib
source read with `inspect`): no downloads, same seed -> same set. Every template list is
cut in two: templates at index % 4 == 3 (and the last snippet of each language, and a
quarter of the stdlib modules) form the held-out test split, the rest the training
split, and each split has its own seed. So the test set measures phrasings and code
shapes the model never saw, not memorised ones.

Labels follow `gateway.classifier.classify`: `structured` = asks for JSON/YAML/CSV/XML output;
`code` = code in the prompt or code asked for; `chat` = everything else, including
tricky negatives (Java the island, python the snake, questions *about* JSON).
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bench.training.classifier.snippets import SNIPPETS, STDLIB_MODULES, TRACES
from bench.training.classifier.vocab import (
    CHAT_TEMPLATES,
    CODE_TEMPLATES,
    SENTENCES,
    STRUCTURED_TEMPLATES,
    TRICKY_CHAT,
    V,
)
from policies.types import Task

Split = Literal["train", "test"]
SEEDS: dict[Split, int] = {"train": 20240601, "test": 777013}
_SLOT_RE = re.compile(r"@(\w+)@")


@dataclass(frozen=True, slots=True)
class Example:
    text: str
    label: Task
    source: str  # "<label>/<template index>", to trace a misclassification back


class _Slots(dict):
    """Fills `@slot@` placeholders; a slot keeps one value within one example."""

    def __init__(self, rng: random.Random, split: Split) -> None:
        super().__init__()
        self.rng, self.split = rng, split

    def __missing__(self, key: str) -> str:
        value = _DYNAMIC[key](self) if key in _DYNAMIC else self.rng.choice(V[key])
        self[key] = value
        return value


def _fill(template: str, slots: _Slots) -> str:
    return _SLOT_RE.sub(lambda m: slots[m.group(1)], template)


_WORDS = ("user", "order", "item", "value", "record", "node", "config", "price", "token", "cache")
_VERBS = ("get", "load", "parse", "compute", "update", "find", "build", "merge", "check", "send")


def _ident(s: _Slots, style: str) -> str:
    verb, noun = s.rng.choice(_VERBS), s.rng.choice(_WORDS)
    if style == "snake":
        return f"{verb}_{noun}"
    if style == "camel":
        return verb + noun.capitalize()
    return verb.capitalize() + noun.capitalize()


def _snippet(s: _Slots) -> str:
    """A code snippet for this split, in the language slot `lang` (or a random one)."""
    rng = s.rng
    if rng.random() < 0.25:
        body = _stdlib_source(rng, s.split)
        tag = "python"
    else:
        tag = rng.choice(sorted(SNIPPETS))
        shapes = SNIPPETS[tag]
        pool = shapes[-1:] if s.split == "test" else shapes[:-1]
        body = _fill(rng.choice(pool), s)
    roll = rng.random()
    if roll < 0.35:
        return f"```{tag}\n{body}\n```"
    if roll < 0.45:
        return f"```\n{body}\n```"
    return body


_STDLIB_CACHE: dict[Split, list[str]] = {}


def _stdlib_source(rng: random.Random, split: Split) -> str:
    """The first lines of a stdlib function's source (modules split between train/test)."""
    if split not in _STDLIB_CACHE:
        mods = [m for i, m in enumerate(STDLIB_MODULES) if (i % 4 == 3) == (split == "test")]
        sources = []
        for name in mods:
            module = importlib.import_module(name)
            for _, obj in sorted(vars(module).items()):
                if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                    try:
                        sources.append(inspect.getsource(obj))
                    except (OSError, TypeError):
                        continue
        _STDLIB_CACHE[split] = sources
    lines = rng.choice(_STDLIB_CACHE[split]).splitlines()
    return "\n".join(lines[: rng.randint(4, 25)])


def _paragraph(s: _Slots) -> str:
    return " ".join(s.rng.sample(SENTENCES, s.rng.randint(2, 4)))


_DYNAMIC: dict[str, Callable[[_Slots], str]] = {
    "code": _snippet,
    "tricky": lambda s: s.rng.choice(_split_pool(TRICKY_CHAT, s.split)),
    "trace": lambda s: _fill(s.rng.choice(_split_pool(TRACES, s.split)), s),
    "paragraph": _paragraph,
    "review": lambda s: s.rng.choice(("The food was cold and the waiter rude.",
                                      "Absolutely loved it, would come back!",
                                      "It was fine, nothing special.",
                                      "Battery died after two days. Disappointed.")),
    "items": lambda s: ", ".join(s.rng.sample(V["person"], 4)),
    "address": lambda s: f"{s.rng.randint(1, 999)} Main St, Springfield, IL {s.rng.randint(10000, 99999)}",
    "question_lc": lambda s: s.rng.choice(V["question"]).lower(),
    "n": lambda s: str(s.rng.randint(2, 20)),
    "n2": lambda s: str(s.rng.randint(21, 300)),
    "fn": lambda s: _ident(s, "snake"),
    "fnc": lambda s: _ident(s, "camel"),
    "Fnc": lambda s: _ident(s, "pascal"),
    "Type": lambda s: s.rng.choice(_WORDS).capitalize() + s.rng.choice(("", "Item", "Model", "Info")),
    "arg": lambda s: s.rng.choice(_WORDS) + "s",
    "arg2": lambda s: s.rng.choice(("default", "skip", "limit", "key")),
    "argc": lambda s: s.rng.choice(_WORDS) + s.rng.choice(("List", "Id", "Name", "")),
    "ARGU": lambda s: s.rng.choice(("1", "DIR", "TARGET", "SRC")),
    "doc": lambda s: s.rng.choice(("Return the scaled items.", "Filter and scale.", "Helper.")),
    "Title": lambda s: s.rng.choice(("Welcome", "Our Products", "Contact us", "Dashboard")),
    "hex": lambda s: f"{s.rng.randint(0, 0xFFFFFF):06x}",
    "path": lambda s: s.rng.choice(('"data.csv"', '"/tmp/out.txt"', "sys.argv[1]", "path")),
}


def _split_pool(items: tuple[str, ...], split: Split) -> list[str]:
    return [t for i, t in enumerate(items) if (i % 4 == 3) == (split == "test")]


_PREFIXES = ("", "", "", "", "Hi! ", "Please: ", "hello, ", "Quick one. ", "Hey there, ")
_SUFFIXES = ("", "", "", "", " Thanks!", " thx", "\n\nThank you in advance.", " :)")


def _vary(text: str, rng: random.Random) -> str:
    """Surface noise so the model keys on content, not on one exact phrasing."""
    text = rng.choice(_PREFIXES) + text + rng.choice(_SUFFIXES)
    return text.lower() if rng.random() < 0.12 else text


TEMPLATES: dict[Task, tuple[str, ...]] = {
    "code": CODE_TEMPLATES,
    "structured": STRUCTURED_TEMPLATES,
    "chat": CHAT_TEMPLATES,
}


def build_dataset(split: Split, per_class: int = 2000, seed: int | None = None) -> list[Example]:
    """`per_class` examples of each task for `split`, deterministic for a given seed."""
    rng = random.Random(SEEDS[split] if seed is None else seed)
    pools = {task: list(enumerate(t)) for task, t in TEMPLATES.items()}
    pools = {
        task: [(i, t) for i, t in items if (i % 4 == 3) == (split == "test")]
        for task, items in pools.items()
    }
    out: list[Example] = []
    for task, items in pools.items():
        for _ in range(per_class):
            index, template = rng.choice(items)
            text = _vary(_fill(template, _Slots(rng, split)), rng)
            out.append(Example(text, task, f"{task}/{index}"))
    rng.shuffle(out)
    return out
