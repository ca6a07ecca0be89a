"""A worker's memory after the build (docs/WORKER.md, "Memory"): `load_model` hands back
the mapped pages of the float32 layer weights its 4-bit copies replace, and the values
stay readable; `pages.release_mapped` leaves a copy outside the file alone; building
the model on the meta device does not import torch's compiler stack."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_engine_int4 import four_bit_model
from tiny_models import near_bigram_llama

from workers.embedded.checkpoint import load_model, save_model
from workers.embedded.layers import Embedding
from workers.embedded.pages import mapped_ranges, release_mapped

pytestmark = pytest.mark.usefixtures("one_torch_thread")
linux = pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs Linux /proc")
ROOT = Path(__file__).resolve().parents[2]
PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_pages(tensor: torch.Tensor) -> int:
    """How many of the whole pages inside the tensor's data are in this process's memory
    (bit 63 of each page's /proc/self/pagemap entry)."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // PAGE), end // PAGE
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read((last - first) * 8)
    return sum(struct.unpack_from("<Q", entries, 8 * i)[0] >> 63 for i in range(last - first))


@linux
def test_load_model_hands_back_the_pages_its_4bit_copies_replace(tmp_path: Path) -> None:
    reference, fused = four_bit_model()
    save_model(reference, tmp_path, dtype=torch.float32)
    loaded = load_model(tmp_path, dtype=torch.float32)
    unread = loaded.unread_weights()
    assert loaded.four_bit and len(unread) == 7 * reference.config.num_hidden_layers
    assert all(resident_pages(w) == 0 for w in unread)
    assert resident_pages(loaded.lm_head.weight) > 0  # the head is read: left alone
    tokens = torch.tensor([list(range(5, 25))])
    with torch.inference_mode():  # the 4-bit copies, built before the pages went
        assert torch.equal(loaded(tokens).logits, fused(tokens).logits)
    with torch.enable_grad():  # autograd on: the weights themselves, read from the file again
        assert torch.equal(loaded(tokens).logits, reference(tokens).logits)


@linux
def test_a_float32_model_keeps_its_pages_and_a_cast_copy_is_left_alone(tmp_path: Path) -> None:
    model = near_bigram_llama(300)  # not on a 4-bit grid: the packed copies, no codes
    save_model(model, tmp_path, dtype=torch.bfloat16)
    cast = load_model(tmp_path, dtype=torch.float32)  # a bf16 file served float32: copies
    assert cast.unread_weights() == []
    weight = cast.model.layers[0].mlp.up_proj.weight.detach()
    before = weight.clone()
    assert release_mapped([weight], tmp_path / "model.safetensors") == 0  # not in the file
    assert torch.equal(weight, before)
    assert mapped_ranges(tmp_path / "absent.safetensors") == []


def in_fresh_process(code: str) -> str:
    """What `code` prints, run by a new interpreter (this one's imports and heap would
    blur what is measured)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout


def test_building_the_model_on_meta_skips_torch_compile_imports() -> None:
    """A meta `nn.Embedding` initialises through `torch._refs.normal_`, whose first call
    imports torch._dynamo and sympy (68 MB a worker); `layers.Embedding` skips it."""
    code = ("import sys, torch\n"
            "from workers.embedded.model import LlamaForCausalLM, ModelConfig\n"
            "with torch.device('meta'):\n"
            "    model = LlamaForCausalLM(ModelConfig())\n"
            "assert model.model.embed_tokens.weight.is_meta\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    assert in_fresh_process(code).split() == ["False", "False"]
    torch.manual_seed(0)
    assert 0.9 < float(Embedding(1000, 64).weight.detach().std()) < 1.1  # off meta: N(0, 1) as before


@linux
def test_trim_heap_returns_freed_heap_pages() -> None:
    """Freed blocks between live ones stay resident heap until `trim_heap` (a fresh
    process: the test run's own heap would blur the count)."""
    code = ("import torch\n"
            "from workers.embedded.pages import trim_heap\n"
            "def anonymous():\n"
            "    rollup = open('/proc/self/smaps_rollup').read().splitlines()\n"
            "    return next(int(line.split()[1]) for line in rollup if line.startswith('Anonymous:'))\n"
            "blocks = [torch.ones(16 * 1024) for _ in range(2000)]  # 64 KB each: heap, not mmap\n"
            "kept = blocks[::20]\n"
            "del blocks\n"
            "before = anonymous()\n"
            "assert trim_heap()\n"
            "print((before - anonymous()) // 1024)\n")
    assert int(in_fresh_process(code)) > 100  # MB of the 125 freed
