"""The argv that launches one pool's server: SGLang's or vLLM's, built from the pool's
config (`workers.fleet.sglang_launch`, `workers.fleet.vllm_launch`), or an operator's
template.

With `SPECROUTE_WORKER_API_KEY` in the supervisor's environment (a Secret), SGLang and
vLLM start with `--api-key`: a pod that reaches the server around the gateway gets 401s
on everything but health and metrics; the gateway sends the key (a pool's `api_key`,
from the same variable).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from policies.fleet import FleetPool
from workers.fleet.sglang_launch import SGLangLaunch, build_sglang_args, extra_args_from_mapping
from workers.fleet.vllm_launch import VLLMLaunch, build_vllm_args

CommandBuilder = Callable[[int, int], list[str]]  # (port, k) -> argv

_BUILDER_SET = {"model_path", "method", "k", "port", "served_model_name", "python", "vllm",
                "extra_args", "api_key"}  # filled in by the supervisor, not by `launch:`
WORKER_API_KEY_ENV = "SPECROUTE_WORKER_API_KEY"


def launch_options(pool: FleetPool, builder: type) -> dict[str, Any]:
    """Split the pool's `launch:` into `builder`'s own fields and pass-through flags.

    Fields of SGLangLaunch (topk, num_draft_tokens, draft_model_path, tp_size,
    mem_fraction_static, max_running_requests, host) or VLLMLaunch are used as such, any
    other key becomes a flag (`context_length: 8192`).
    """
    own = {f.name for f in fields(builder)} - _BUILDER_SET
    known = {key: value for key, value in pool.launch.items() if key in own}
    rest = {key: value for key, value in pool.launch.items() if key not in own}
    return {**known, "extra_args": extra_args_from_mapping(rest)}


def command_builder(pool: FleetPool, template: str | None) -> CommandBuilder:
    """The template (`{port}`, `{k}`, `{method}`, `{model}`, `{python}` filled in) or,
    by default, the SGLang (or, for engine vllm, vLLM) launch built from the pool."""
    if template is not None:
        def from_template(port: int, k: int) -> list[str]:
            return shlex.split(template.format(port=port, k=k, method=pool.method,
                                               model=pool.model_path or pool.model,
                                               python=sys.executable))
        return from_template

    api_key = os.environ.get(WORKER_API_KEY_ENV) or None
    if pool.engine == "vllm":
        def vllm(port: int, k: int) -> list[str]:
            return build_vllm_args(VLLMLaunch(
                model_path=pool.model_path or pool.model, method=pool.method, k=k, port=port,
                served_model_name=pool.model, api_key=api_key,
                **launch_options(pool, VLLMLaunch)))
        return vllm

    def sglang(port: int, k: int) -> list[str]:
        return build_sglang_args(SGLangLaunch(
            model_path=pool.model_path or pool.model, method=pool.method, k=k, port=port,
            served_model_name=pool.model, python=sys.executable, api_key=api_key,
            **launch_options(pool, SGLangLaunch)))
    return sglang
