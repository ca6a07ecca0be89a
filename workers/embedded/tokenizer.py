"""The thin tokenizer wrapper the engine uses (training it: `training/bpe.py`)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from workers.embedded.chat_template import BOS, EOS


class TextTokenizer:
    """Encode/decode with the model's `tokenizer.json`; special tokens are real tokens."""

    def __init__(self, path: str | Path) -> None:
        self._tok = Tokenizer.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        self.bos_id = BOS
        self.eos_id = EOS

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)
