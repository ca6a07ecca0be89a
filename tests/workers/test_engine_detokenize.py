"""Incremental detokenisation: characters split across byte-level BPE tokens are held back,
never emitted half; each push decodes only its new ids; stop strings still cut exactly."""

from __future__ import annotations

import pytest

from bench.training.drafters.bpe import train_tokenizer
from workers.embedded.detokenize import TextStream
from workers.embedded.tokenizer import TextTokenizer

TEXT = "naïve café 😀 世界 ok 🎉🎉 die Straße → 日本語のテキスト 👍🏽 end"


class CountingTokenizer:
    """The test tokenizer, counting how many ids each decode call is given."""

    def __init__(self, inner: TextTokenizer) -> None:
        self.inner = inner
        self.decoded_ids = 0

    def decode(self, ids: list[int]) -> str:
        self.decoded_ids += len(ids)
        return self.inner.decode(ids)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """Trained on ASCII only, so every non-ASCII character is several byte tokens."""
    texts = [f"the quick brown fox jumps over the lazy dog {i} times" for i in range(200)]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(texts, 300).save(str(path))
    return TextTokenizer(path)


def _stream(tokenizer: TextTokenizer, ids: list[int], chunk: int,
            stops: list[str] | None = None) -> tuple[list[str], CountingTokenizer, object]:
    counting = CountingTokenizer(tokenizer)
    stream = TextStream(counting, stops or [])  # type: ignore[arg-type]
    deltas: list[str] = []
    hit = None
    for start in range(0, len(ids), chunk):
        last = start + chunk >= len(ids)
        delta, hit = stream.push(ids[start : start + chunk], final=last)
        deltas.append(delta)
        if hit is not None:
            break
    return deltas, counting, hit


def test_the_tokenizer_splits_characters_across_tokens(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode(TEXT)
    assert tokenizer.decode(ids) == TEXT
    assert sum("\ufffd" in tokenizer.decode([i]) for i in ids) > 20


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_deltas_are_whole_characters_and_add_up(tokenizer: TextTokenizer, chunk: int) -> None:
    ids = tokenizer.encode(TEXT)
    deltas, _, _ = _stream(tokenizer, ids, chunk)
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d) > len(deltas) // 3  # text flows while it decodes


def test_each_push_decodes_only_its_new_ids(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode(TEXT * 8)
    _, counting, _ = _stream(tokenizer, ids, 1)
    # re-decoding the output every step would cost len(ids)**2 / 2 ids (~340 k here)
    assert counting.decoded_ids < 12 * len(ids)


@pytest.mark.parametrize("chunk", [1, 4])
def test_stop_string_after_split_characters(tokenizer: TextTokenizer, chunk: int) -> None:
    ids = tokenizer.encode(TEXT)
    deltas, _, hit = _stream(tokenizer, ids, chunk, stops=["世界 ok"])
    assert "".join(deltas) == "naïve café 😀 "
    assert hit is not None and hit[0] == "世界 ok"
    pushed = (len(deltas) - 1) * chunk
    kept = tokenizer.decode(ids[: pushed + hit[1]])
    assert kept.endswith("世界 ok") and "世界 ok" not in tokenizer.decode(ids[: pushed + hit[1] - 1])


def test_a_final_incomplete_character_is_flushed(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("ab 😀")
    cut = next(n for n in range(len(ids), 0, -1) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    stream = TextStream(tokenizer, [])
    assert stream.push(ids[:cut], final=False)[0] == "ab "
    assert stream.flush() == tokenizer.decode(ids[:cut])[3:]
