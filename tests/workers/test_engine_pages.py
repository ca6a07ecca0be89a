"""Building the model on the meta device (what `load_model` does) does not import
torch's compiler stack (docs/WORKER.md, "Memory")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from workers.embedded.layers import Embedding

ROOT = Path(__file__).resolve().parents[2]


def test_building_the_model_on_meta_skips_torch_compile_imports() -> None:
    """A meta `nn.Embedding` initialises through `torch._refs.normal_`, whose first call
    imports torch._dynamo and sympy (68 MB a worker); `layers.Embedding` skips it."""
    code = ("import sys, torch\n"
            "from workers.embedded.model import LlamaForCausalLM, ModelConfig\n"
            "with torch.device('meta'):\n"
            "    model = LlamaForCausalLM(ModelConfig())\n"
            "assert model.model.embed_tokens.weight.is_meta\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["False", "False"]
    torch.manual_seed(0)
    assert 0.9 < float(Embedding(1000, 64).weight.detach().std()) < 1.1  # off meta: N(0, 1) as before
