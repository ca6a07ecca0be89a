"""The bundled model's special tokens and chat template.

Runtime and training agree on these: the tokenizer is trained with `SPECIAL_TOKENS` in
this order (so their ids are fixed), the corpus writes chat turns with `render_chat`,
and the worker's chat route renders requests with the same function.
"""

from __future__ import annotations

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
PAD, BOS, EOS = 0, 1, 2


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat template: role tag line, content, then `<|eos|>` after assistant turns."""
    parts = []
    for m in messages:
        parts.append(f"<|{m['role']}|>\n{m['content']}\n")
        if m["role"] == "assistant":
            parts[-1] = parts[-1][:-1] + "<|eos|>\n"
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
