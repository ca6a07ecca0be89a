"""SmolLM2's tokenizer built from the GGUF: special tokens are single ids, digits split one
per token (llama.cpp's `smollm` pre-tokenizer), ids match the GGUF vocabulary, text
round-trips, and the ChatML template renders as the model expects."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.embedded.chat_template import apply_chat_template
from workers.embedded.fetch_model import GGUF_MEMBER, ensure_smollm2
from workers.embedded.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    return ensure_smollm2()


@pytest.fixture(scope="module")
def vocab(smollm2_dir: Path) -> dict[str, int]:
    """token -> id as listed in the GGUF itself (`tokenizer.ggml.tokens`)."""
    from gguf import GGUFReader

    gguf = smollm2_dir.parent / Path(GGUF_MEMBER).name  # ensure_smollm2 keeps it beside
    tokens = GGUFReader(str(gguf)).fields["tokenizer.ggml.tokens"].contents()
    return {t: i for i, t in enumerate(tokens)}


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> TextTokenizer:
    return TextTokenizer(smollm2_dir / "tokenizer.json")


def test_special_tokens_are_single_ids(tok: TextTokenizer, vocab: dict[str, int]) -> None:
    assert vocab["<|im_start|>"] == 1 and vocab["<|im_end|>"] == 2 and vocab["<|endoftext|>"] == 0
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids == [1, vocab["user"], vocab["Ċ"], vocab["Hi"], 2]
    assert tok.encode("<file_sep><|endoftext|>") == [vocab["<file_sep>"], 0]
    assert tok.decode(ids) == "user\nHi"  # special tokens are skipped in text


def test_words_and_digits_split_as_the_model_was_trained(tok: TextTokenizer, vocab: dict[str, int]) -> None:
    assert tok.encode("Hello world") == [vocab["Hello"], vocab["Ġworld"]]
    assert tok.encode(" world") == [vocab["Ġworld"]]
    assert tok.encode("12345") == [vocab[d] for d in "12345"]
    assert tok.encode("in 2024") == [vocab["in"], vocab["Ġ"], *(vocab[d] for d in "2024")]
    assert tok.encode("x=10.5") == [vocab["x"], vocab["="], vocab["1"], vocab["0"], vocab["."], vocab["5"]]
    assert tok.encode("def f(x):\n    return x") == [
        vocab["def"], vocab["Ġf"], vocab["("], vocab["x"], vocab["):"], vocab["ĊĠĠĠ"],
        vocab["Ġreturn"], vocab["Ġx"]]


@pytest.mark.parametrize("text", [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'const xs = [1, 2, 3].map((x) => x * 2);\n\tconsole.log(`${xs}`);',
    '{"id": 42, "name": "Zoë", "tags": ["a", "b"], "price": 19.99, "ok": true}',
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "emoji 😀👍🏽 and CJK 日本語のテキスト, 中文, 한국어 — “quotes” ½ café",
    "  leading and trailing spaces  \n\n\nnewlines\r\n",
])
def test_round_trip(tok: TextTokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


def test_chatml_template_with_the_default_system_prompt(smollm2_dir: Path, tok: TextTokenizer) -> None:
    template = (smollm2_dir / "chat_template.jinja").read_text()
    messages = [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}]
    text = apply_chat_template(template, messages, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n")
    ids = tok.encode(text)
    assert ids.count(1) == 3 and ids.count(2) == 3 and ids[0] == 1
    own = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    assert apply_chat_template(template, own) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n")
