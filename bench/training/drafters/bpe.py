"""Training the byte-level BPE tokenizer the bundled model uses."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from workers.embedded.chat_template import SPECIAL_TOKENS


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A BPE over bytes whose first ids are `SPECIAL_TOKENS`, in order."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok
