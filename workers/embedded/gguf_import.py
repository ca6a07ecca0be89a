"""Convert a llama.cpp GGUF checkpoint (Llama family) into the engine's Hugging Face layout.

`convert_gguf(gguf_path, out_dir)` writes `config.json`, `model.safetensors` (float32, the
file every worker memory-maps), `tokenizer.json`, `tokenizer_config.json` and
`chat_template.jinja`, all read from the GGUF: tensors with the `gguf` package and
dequantized (Q4_1, Q8_0, F32, ... whatever `gguf.dequantize` knows) to float32; the
tokenizer from `tokenizer.ggml.*`; the chat template from `tokenizer.chat_template`.

Two details decide whether the result is the model that was trained:
- llama.cpp's converter permutes the rows of every attention Q and K projection so that
  its interleaved-pair RoPE (rotate (x0, x1), (x2, x3), ...) equals the Hugging Face
  "rotate half" RoPE (rotate (x_i, x_{i+hs/2})). Per head the stored row 2i is original
  row i and row 2i+1 is original row i + hs/2; `unpermute_qk` puts them back, so model.py's
  rotate-half RoPE is correct (tests/workers/test_smollm2_model.py proves the equivalence).
- the pre-tokenizer: GGUF names it (`tokenizer.ggml.pre`), the regexes live in llama.cpp
  (src/llama-vocab.cpp). `smollm` (shared with starcoder, refact, command-r) first isolates
  every digit (`\\p{N}`), then applies the GPT-2 byte-level pattern.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workers.embedded.model import ModelConfig

# The model's trained context is served: a request's KV cache grows with what it holds
# (46 KB per position for SmolLM2, 30 layers x 3 heads x 64 x 2 x 4 bytes), so a long
# context costs only the requests that use it. A cap stays possible (`max_context`).
MAX_SERVED_CONTEXT = 8192

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_CONTROL = 3  # llama.cpp token type LLAMA_TOKEN_TYPE_CONTROL
_USER_DEFINED = 4
# The `smollm` pre-tokenizer of llama.cpp: each digit alone, then GPT-2's pattern.
DIGIT_PATTERN = r"\p{N}"


@dataclass
class GgufContents:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # HF names, float32
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre_tokenizer: str
    chat_template: str | None


def hf_name(gguf_name: str) -> str:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    blk, layer, kind, suffix = gguf_name.split(".")
    if blk != "blk" or kind not in _LAYER_NAMES:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"


def unpermute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation: (n_heads * hs, C) rows per head go from
    interleaved-pair order (i, i + hs/2 alternating) back to the HF halves order."""
    rows = weight.shape[0]
    hs = rows // n_heads
    w = weight.reshape(n_heads, hs // 2, 2, *weight.shape[1:])  # (nh, hs/2, pair, C)
    return w.transpose(1, 2).reshape(weight.shape)


def permute_qk(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's converter permutation (HF halves order -> interleaved pairs)."""
    rows = weight.shape[0]
    hs = rows // n_heads
    w = weight.reshape(n_heads, 2, hs // 2, *weight.shape[1:])  # (nh, half, hs/2, C)
    return w.transpose(1, 2).reshape(weight.shape)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_gguf(path: str | Path, max_context: int = MAX_SERVED_CONTEXT) -> GgufContents:
    """Metadata, float32 tensors in HF layout (Q/K unpermuted) and tokenizer data."""
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, only 'llama' is supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    n_head = _field(reader, "llama.attention.head_count")
    n_kv = _field(reader, "llama.attention.head_count_kv", n_head)
    names = {t.name for t in reader.tensors}
    config = ModelConfig(
        vocab_size=len(tokens),
        hidden_size=_field(reader, "llama.embedding_length"),
        intermediate_size=_field(reader, "llama.feed_forward_length"),
        num_hidden_layers=_field(reader, "llama.block_count"),
        num_attention_heads=n_head,
        num_key_value_heads=n_kv,
        max_position_embeddings=min(_field(reader, "llama.context_length"), max_context),
        rms_norm_eps=round(float(_field(reader, "llama.attention.layer_norm_rms_epsilon")), 9),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
    )
    tensors = {}
    for t in reader.tensors:
        array = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if not (array.flags.writeable and array.flags.c_contiguous):  # F32: a view of the file
            array = np.array(array, order="C")
        weight = torch.from_numpy(array)  # (out, in) as nn.Linear stores
        kind = t.name.split(".")[-2]
        if kind in ("attn_q", "attn_k"):
            weight = unpermute_qk(weight, n_head if kind == "attn_q" else n_kv)
        tensors[hf_name(t.name)] = weight.contiguous()
    return GgufContents(
        config=config,
        tensors=tensors,
        tokens=list(tokens),
        token_types=list(_field(reader, "tokenizer.ggml.token_type")),
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        pre_tokenizer=_field(reader, "tokenizer.ggml.pre", "gpt2"),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


def build_tokenizer(contents: GgufContents):
    """A `tokenizers.Tokenizer` equal to llama.cpp's for a byte-level BPE GGUF."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if contents.pre_tokenizer not in ("smollm", "starcoder", "refact", "command-r", "gpt2"):
        raise ValueError(f"pre-tokenizer {contents.pre_tokenizer!r} is not supported")
    vocab = {token: i for i, token in enumerate(contents.tokens)}
    merges = [(left, right) for left, _, right in (m.partition(" ") for m in contents.merges)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    steps: list[pre_tokenizers.PreTokenizer] = [
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if contents.pre_tokenizer != "gpt2":
        steps.insert(0, pre_tokenizers.Split(Regex(DIGIT_PATTERN), behavior="isolated"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(token, special=kind == _CONTROL, normalized=False)
        for token, kind in zip(contents.tokens, contents.token_types, strict=True)
        if kind in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_special_tokens([t for t in specials if t.special])
    tok.add_tokens([t for t in specials if not t.special])
    return tok


def _tokenizer_config(contents: GgufContents) -> dict:
    config = contents.config
    return {
        "bos_token": contents.tokens[config.bos_token_id],
        "eos_token": contents.tokens[config.eos_token_id],
        "add_bos_token": False,
        "chat_template": contents.chat_template,
        "model_max_length": config.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def convert_gguf(gguf_path: str | Path, out_dir: str | Path,
                 max_context: int = MAX_SERVED_CONTEXT) -> Path:
    """Write the HF-layout folder; built in a sibling temporary folder, then renamed, so a
    reader never sees a half-written model."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    contents = read_gguf(gguf_path, max_context)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    work.chmod(0o755)
    try:
        tensors = dict(contents.tensors)
        if contents.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
        (work / "model.safetensors").chmod(0o644)
        (work / "config.json").write_text(json.dumps(contents.config.to_hf_dict(), indent=2) + "\n")
        build_tokenizer(contents).save(str(work / "tokenizer.json"))
        (work / "tokenizer_config.json").write_text(
            json.dumps(_tokenizer_config(contents), indent=2) + "\n")
        if contents.chat_template:
            (work / "chat_template.jinja").write_text(contents.chat_template)
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return out

