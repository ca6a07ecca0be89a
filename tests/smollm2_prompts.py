"""Chat prompts for the SmolLM2 engine tests, rendered with the model's own template."""

from __future__ import annotations

from collections.abc import Iterable

from workers.embedded.chat_template import apply_chat_template
from workers.embedded.engine import Engine
from workers.embedded.fetch_model import ensure_smollm2


def chat_prompts(engine: Engine, questions: Iterable[str]) -> list[list[int]]:
    template = (ensure_smollm2() / "chat_template.jinja").read_text()
    return [engine.tokenizer.encode(apply_chat_template(template, [{"role": "user", "content": q}]))
            for q in questions]
