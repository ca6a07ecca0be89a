"""The thin tokenizer wrapper the engine uses (training it: `training/bpe.py`).

A model folder holds `tokenizer.json` and, in the Hugging Face layout, `tokenizer_config.json`
(bos/eos token text) and `chat_template.jinja`. The bundled model has neither of the last
two: its bos/eos ids and template are `chat_template`'s constants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from workers.embedded.chat_template import BOS, EOS, ChatTemplate, Messages

CONFIG_FILE = "tokenizer_config.json"
# Pretraining's end-of-document token: an instruct model may emit it instead of its
# end-of-turn eos, so it ends a generation too (SmolLM2: 0, with eos <|im_end|> = 2).
END_OF_TEXT = "<|endoftext|>"


def _token_text(value: Any) -> str:
    """A tokenizer_config token: "text" or {"content": "text", ...} (AddedToken form)."""
    return value["content"] if isinstance(value, dict) else str(value)


class TextTokenizer:
    """Encode/decode with the model's `tokenizer.json`; special tokens are real tokens in
    `encode`, plain text in message contents (`encode_chat`)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self.path = path
        self._tok = Tokenizer.from_file(str(path))
        # A second instance that reads special-token text as ordinary text.
        self._literal = Tokenizer.from_file(str(path))
        self._literal.encode_special_tokens = True
        self.vocab_size = self._tok.get_vocab_size()
        config_path = path.parent / CONFIG_FILE
        if config_path.exists():
            config = json.loads(config_path.read_text(encoding="utf-8"))
            self.bos_id = self._required_id(config, "bos_token")
            self.eos_id = self._required_id(config, "eos_token")
        else:
            self.bos_id, self.eos_id = BOS, EOS
        end_of_text = self._tok.token_to_id(END_OF_TEXT)
        self.stop_ids: tuple[int, ...] = (self.eos_id,) if end_of_text in (None, self.eos_id) \
            else (self.eos_id, end_of_text)
        self.chat_template = ChatTemplate.from_folder(path.parent)

    def _required_id(self, config: dict[str, Any], key: str) -> int:
        if config.get(key) is None:
            raise ValueError(f"{CONFIG_FILE}: {key} is missing")
        token = _token_text(config[key])
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"{CONFIG_FILE}: {key} {token!r} is not in the vocabulary")
        return token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_chat(self, messages: Messages, add_generation_prompt: bool = True) -> list[int]:
        """The model's chat prompt as ids; special-token text inside a message's content is
        encoded as the characters it is, so a client cannot open or close a turn."""
        ids: list[int] = []
        for text, is_content in self.chat_template.pieces(messages, add_generation_prompt):
            tok = self._literal if is_content else self._tok
            ids.extend(tok.encode(text, add_special_tokens=False).ids)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
