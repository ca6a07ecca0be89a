"""A Llama-family checkpoint on disk: a Hugging Face-layout folder (`config.json` +
`model.safetensors`) read into `model.LlamaForCausalLM` with no copy, written back, and the
GPT-2 style initialisation the project's own small models train from."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from workers.embedded.model import LlamaForCausalLM, ModelConfig
from workers.embedded.pages import release_mapped


def init_weights(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init; residual output projections scaled by 1/sqrt(2 * layers)."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", 1)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            scale = 1 / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1
            nn.init.normal_(p, mean=0.0, std=std * scale)


def load_config(model_dir: str | Path) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> LlamaForCausalLM:
    """The checkpoint's tensors become the parameters, with no copy when `dtype` is the
    stored one on the CPU: the model is built on the meta device (no random init) and
    `assign=True` adopts the tensors safetensors maps from the file, so workers serving
    the same folder share its pages in the page cache. Returned fused (`fuse()`), with
    the resident pages of the weights the fused copies replace handed back."""
    from safetensors.torch import load_file

    config = load_config(model_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:  # assign replaced embed_tokens.weight: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    model = model.to(device=device, dtype=dtype).eval().fuse()
    # The float32 layer weights the 4-bit copies replace were read once, to build them;
    # their pages leave this process (and its PSS) until something reads them again.
    release_mapped(model.unread_weights(), Path(model_dir) / "model.safetensors")
    return model


def save_model(model: LlamaForCausalLM, model_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
