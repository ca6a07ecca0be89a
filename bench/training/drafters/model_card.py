"""Write MODEL_CARD.md for a trained model folder from its training records and a live run.

    python -m bench.training.drafters.model_card [--model DIR] [--bench bench.json]

Reads `training.json` (base) and `drafters.json` (drafters) written by the training
scripts, generates sample outputs with the engine, and, given the JSON that
`specroute bench engine --json` printed, adds measured acceptance per class.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workers.embedded.chat_template import render_chat
from workers.embedded.engine import BUNDLED_MODEL_DIR

SAMPLES = [
    ("code", [{"role": "user", "content": "Write a Python function dedent."}]),
    ("structured", [{"role": "user", "content": "Return a JSON object with the fields id, name, email."}]),
    ("chat", [{"role": "user", "content": "What does shlex.split do?"}]),
]


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors")) / 1e6


def _samples(model_dir: Path) -> list[tuple[str, str, str]]:
    from workers.embedded.engine import Engine, SamplingParams

    engine = Engine(model_dir=model_dir)
    out = []
    for task, messages in SAMPLES:
        ids = engine.tokenizer.encode(render_chat(messages))
        gen = engine.start(ids, SamplingParams(max_new_tokens=80), method="plain")
        text = ""
        while not gen.finished:
            text += gen.step().text
        out.append((task, messages[0]["content"], text))
    return out


def render(model_dir: Path, bench: dict | None, note: str = "") -> str:
    base = json.loads((model_dir / "training.json").read_text())
    config = json.loads((model_dir / "config.json").read_text())
    drafters_path = model_dir / "drafters.json"
    drafters = json.loads(drafters_path.read_text()) if drafters_path.exists() else None
    tc = base["train_config"]
    last = base["history"][-1]
    lines = [
        f"# Model card: {model_dir.name}",
        "",
        "A small Llama-family decoder trained from scratch on this repository's corpus, with its",
        "drafters, so that every speculative-decoding method runs on a CPU with no downloads.",
        "Not a useful assistant: a realistic *workload* for speculation (code, JSON and chat",
        "that a model predicts with very different confidence).",
        "",
        "## Base model",
        "",
        f"- Architecture: Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention), "
        f"{config['num_hidden_layers']} layers, hidden {config['hidden_size']}, "
        f"{config['num_attention_heads']} heads / {config['num_key_value_heads']} KV heads, "
        f"FFN {config['intermediate_size']}, context {config['max_position_embeddings']}, "
        f"tied embeddings; {base['parameters'] / 1e6:.2f} M parameters; bf16 safetensors.",
        f"- Tokenizer: byte-level BPE, {config['vocab_size']} tokens, trained with `tokenizers` "
        "on the same corpus; chat template `<|role|>\\n...\\n`, assistant turns end `<|eos|>`.",
        f"- Corpus ({base['corpus_tokens'] / 1e6:.2f} M tokens): the Python standard library's "
        "source (code), its docstrings and `pydoc_data.topics` (prose), seeded JSON records "
        "(structured), chat turns built from docstrings, functions and records "
        "(`bench/training/drafters/corpus.py`).",
        f"- Training: {tc['steps']} steps x {tc['batch_size']} x {tc['seq_len']} tokens "
        f"({base['train_tokens'] / 1e6:.1f} M tokens), AdamW, cosine LR {tc['lr']} -> "
        f"{tc['min_lr']}, bf16 autocast where the CPU computes bf16 natively, else float32 (`python -m bench.training.drafters.train`).",
        f"- Final loss: train {last['train_loss']:.3f}, held-out {last['val_loss']:.3f} "
        f"(step {last['step']}). Held-out loss by step: "
        + ", ".join(f"{h['step']}: {h['val_loss']:.2f}" for h in base["history"]) + ".",
    ]
    if note:
        lines += ["", note]
    if drafters:
        dc, dl = drafters["train_config"], drafters["history"][-1]
        params = drafters["parameters"]
        lines += [
            "",
            "## Drafters (`python -m bench.training.drafters.train_drafters`)",
            "",
            f"Distilled from the frozen base in one loop, {dc['steps']} steps x "
            f"{dc['batch_size']} x {dc['seq_len']} tokens. Agreement = share of positions "
            "where the drafter's top token equals the base's (teacher-forced, last step).",
            "",
            "| drafter | parameters | what it predicts | agreement |",
            "|---|---|---|---|",
            f"| Medusa heads ({dc['medusa_heads']}) | {params['medusa'] / 1e6:.2f} M | head i: "
            "token t+2+i from f_t | " + ", ".join(f"{dl[f'medusa{i}']:.2f}"
                                                   for i in range(dc["medusa_heads"])) + " |",
            f"| EAGLE head | {params['eagle'] / 1e6:.2f} M | f_(t+1) from (f_t, x_(t+1)) | "
            f"{dl['eagle']:.2f} |",
            f"| draft model | {params['draft'] / 1e6:.2f} M | next token | {dl['draft']:.2f} |",
        ]
    lines += ["", f"Shipped weights: {_size_mb(model_dir):.1f} MB in all.", ""]
    if bench:
        lines += ["## Measured acceptance and speed (`specroute bench engine`)", "",
                  f"float32 (the engine's CPU default), {bench['threads']} threads, "
                  f"{bench['prompts_per_cell']} prompts x "
                  f"{bench['max_tokens']} tokens per cell.", "",
                  "| method | class | T | accept length | tokens/s | speedup |", "|---|---|---|---|---|---|"]
        for r in bench["rows"]:
            lines.append(f"| {r['method']} | {r['task']} | {r['temperature']:g} | "
                         f"{r['accept_length']:.2f} | {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x |")
        lines.append("")
    lines += ["## Sample outputs (greedy, 80 tokens)", ""]
    for task, prompt, text in _samples(model_dir):
        lines += [f"**{task}** — {prompt}", "", "````text", text.strip(), "````", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=BUNDLED_MODEL_DIR)
    p.add_argument("--bench", type=Path, default=None, help="JSON from `specroute bench engine --json`")
    p.add_argument("--note", default="", help="a paragraph to add under the base model")
    args = p.parse_args(argv)
    bench = json.loads(args.bench.read_text().strip().splitlines()[-1]) if args.bench else None
    (args.model / "MODEL_CARD.md").write_text(render(args.model, bench, args.note))
    print(f"wrote {args.model / 'MODEL_CARD.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
