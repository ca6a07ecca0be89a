"""Chat templates: the bundled model's own format, and a model's Jinja template.

The bundled model: runtime and training agree on its special tokens and format; the
tokenizer is trained with `SPECIAL_TOKENS` in this order (so their ids are fixed), the
corpus writes chat turns with `render_chat`, and the worker renders requests with it.

Any other model brings its template as `chat_template.jinja` in its folder (Hugging Face
layout; SmolLM2's ChatML, default system prompt included, see docs/SMOLLM2.md), rendered
by `apply_chat_template` in Jinja's immutable sandbox, as transformers does.

`ChatTemplate.pieces` renders a conversation as (text, is_message_content) pieces, so the
tokenizer can encode what a client wrote as plain text: "<|im_start|>" typed in a message
must not become the control token that opens a turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = 0, 1, 2
TEMPLATE_FILE = "chat_template.jinja"

Messages = Sequence[dict[str, str]]
# Private-use code points stand in for message contents while the template renders.
_HOLE = "\ue000{}\ue001"
_HOLES = re.compile("\ue000(\\d+)\ue001")


def render_chat(messages: Messages, add_generation_prompt: bool = True) -> str:
    """The bundled model's template: role tag line, content, then `<|eos|>` after assistant
    turns."""
    parts = []
    for m in messages:
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
        if m["role"] == "assistant":
            parts[-1] = parts[-1][:-1] + "<|eos|>\n"
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def apply_chat_template(template: str, messages: Messages,
                        add_generation_prompt: bool = True) -> str:
    """Apply a Hugging Face-style Jinja chat template (sandboxed, as transformers does)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=list(messages),
                                            add_generation_prompt=add_generation_prompt)


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template: Jinja source, or None for the bundled model's `render_chat`."""

    source: str | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> ChatTemplate:
        path = Path(folder) / TEMPLATE_FILE
        return cls(path.read_text(encoding="utf-8") if path.exists() else None)

    def render(self, messages: Messages, add_generation_prompt: bool = True) -> str:
        if self.source is None:
            return render_chat(messages, add_generation_prompt)
        return apply_chat_template(self.source, messages, add_generation_prompt)

    def pieces(self, messages: Messages,
               add_generation_prompt: bool = True) -> list[tuple[str, bool]]:
        """The rendered prompt as (text, is_message_content) pieces, in order."""
        holes = [{**m, "content": _HOLE.format(i)} for i, m in enumerate(messages)]
        rendered = self.render(holes, add_generation_prompt)
        out: list[tuple[str, bool]] = []
        at = 0
        for hole in _HOLES.finditer(rendered):
            out.append((rendered[at:hole.start()], False))
            out.append((messages[int(hole.group(1))]["content"], True))
            at = hole.end()
        out.append((rendered[at:], False))
        return [(text, content) for text, content in out if text]

