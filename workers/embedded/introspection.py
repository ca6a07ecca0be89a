"""What the worker says about itself: SGLang's /server_info, /model_info, /v1/models,
/v1/loads and /metrics bodies (docs/WORKER.md cites file and line), plus what it measured
about itself (`measured.json`, policies/prior.py) for the gateway's policy."""

from __future__ import annotations

import functools
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from policies.methods import SGLANG_ALGORITHM
from policies.prior import MEASURED_FILE, Measured, MeasuredError
from workers.embedded.api import NO_DRAFT, PLAIN_BRANCH
from workers.embedded.context import WorkerState
from workers.models import weights_dir

log = logging.getLogger(__name__)

VERSION = "specroute-embedded"
HYBRID_BRANCHES = ("eagle", "ngram", PLAIN_BRANCH, NO_DRAFT)  # workers.embedded.speculative.hybrid


def speculative_algorithm(method: str) -> str | None:
    """SGLang's `speculative_algorithm` name for the worker's method (policies.methods);
    SGLang has no Medusa or lookahead, which report their own names upper-cased."""
    if method == "plain":
        return None
    return SGLANG_ALGORITHM.get(method) or method.upper()



@functools.cache
def load_measured(model_path: str) -> dict[str, Any] | None:
    """The model's `measured.json` (`specroute bench engine --write-measured`): in the
    model folder, else in the repository's weights folder of that name (where the
    drafters of a fetched model live); None if absent or off-schema (logged once)."""
    for folder in (Path(model_path), weights_dir(Path(model_path).name)):
        path = folder / MEASURED_FILE
        if not path.is_file():
            continue
        try:
            return Measured.from_dict(json.loads(path.read_text())).to_dict()
        except (OSError, ValueError, MeasuredError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            return None
    return None


def server_info(state: WorkerState) -> dict[str, Any]:
    """SGLang /server_info: flat server args + `internal_states` (http_server.py server_info)."""
    config, scheduler = state.config, state.scheduler
    k, speculative = state.k, state.speculative
    internal: dict[str, Any] = {
        "effective_max_running_requests_per_dp": scheduler.max_running,
        "num_running_reqs": scheduler.num_running,
        "num_waiting_reqs": scheduler.num_queued,
    }
    if speculative and scheduler.stats.recent:
        internal["avg_spec_accept_length"] = scheduler.stats.recent_accept_length()
    return {
        "model_path": config.model_path,
        "tokenizer_path": config.model_path,
        "served_model_name": config.served_model_name,
        "context_length": state.engine.max_context,
        "max_running_requests": scheduler.max_running,
        "max_queued_requests": scheduler.max_queue,
        "speculative_algorithm": speculative_algorithm(config.method)
        if speculative else None,
        "speculative_num_steps": k if speculative else None,
        "speculative_eagle_topk": 1 if speculative else None,
        "speculative_num_draft_tokens": k + 1 if speculative else None,
        "incremental_streaming_output": False,
        "grammar_backend": "llguidance",  # one of SGLang's (arg_groups/choices.py)
        "weight_version": "default",
        "internal_states": [internal],
        "version": VERSION,
        "frontend": "python",
        # specroute additions: the embedded method, every loaded method, and the load signal
        "specroute_method": config.method,
        "specroute_methods": list(state.engine.methods),
        "num_speculative_tokens": k,
        "specroute_measured": load_measured(config.model_path),
        "load": {"num_running_reqs": scheduler.num_running,
                 "num_queue_reqs": scheduler.num_queued},
    }


def model_info(state: WorkerState) -> dict[str, Any]:
    """SGLang /model_info (http_server.py get_model_info)."""
    return {
        "model_path": state.config.model_path,
        "served_model_name": state.config.served_model_name,
        "tokenizer_path": state.config.model_path,
        "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
        "load_format": "safetensors", "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "has_image_understanding": False, "has_audio_understanding": False,
    }


def loads(state: WorkerState) -> dict[str, Any]:
    """SGLang /v1/loads (managers/load_snapshot.py)."""
    scheduler = state.scheduler
    return {
        "timestamp": datetime.now(UTC).isoformat(), "version": VERSION,
        "accelerator": None, "num_accelerators": 0,
        "loads": [{"dp_rank": 0, "num_running_reqs": scheduler.num_running,
                   "num_waiting_reqs": scheduler.num_queued,
                   "max_running_requests": scheduler.max_running}],
    }


def model_card(state: WorkerState) -> dict[str, Any]:
    """SGLang ModelCard (entrypoints/openai/protocol.py)."""
    name = state.config.served_model_name
    return {"id": name, "object": "model", "created": int(state.started), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": state.engine.max_context}


def metrics_text(state: WorkerState) -> str:
    """Prometheus text with SGLang's metric names (observability/metrics_collector.py)."""
    scheduler, stats = state.scheduler, state.scheduler.stats
    name = state.config.served_model_name.replace("\\", "\\\\").replace('"', '\\"')
    label = f'{{model_name="{name}"}}'
    k, speculative = state.k, state.speculative
    gauges = {
        "num_running_reqs": scheduler.num_running,
        "num_queue_reqs": scheduler.num_queued,
        "spec_accept_length": stats.recent_accept_length(),
        "spec_accept_rate": stats.recent_accept_rate(),
        "spec_num_steps": k if speculative else 0,
        "spec_num_draft_tokens": k + 1 if speculative else 0,
    }
    counters = {
        "prompt_tokens": stats.prompt_tokens,
        "generation_tokens": stats.generation_tokens,
        "num_requests": stats.requests_finished,
        "num_aborted_requests": stats.requests_aborted,
        "spec_verify_calls": stats.verify_steps,
    }
    lines = []
    for metric, value in gauges.items():
        lines += [f"# TYPE sglang:{metric} gauge", f"sglang:{metric}{label} {float(value)}"]
    for metric, value in counters.items():
        lines += [f"# TYPE sglang:{metric}_total counter",
                  f"sglang:{metric}_total{label} {float(value)}"]
    return "\n".join(lines + _branch_lines(state, name)) + "\n"


def _branch_lines(state: WorkerState, name: str) -> list[str]:
    """Our counters of a hybrid's branches (`GenerationStats.branches`): decode steps each
    drafted, and draft tokens accepted from each. A hybrid worker has every branch from
    the start; another worker, those of the hybrid requests it served (`custom_params`)."""
    seen = state.scheduler.stats.draft_branches
    hybrid = HYBRID_BRANCHES if state.config.method == "hybrid" else ()
    branches = {b: seen.get(b, [0, 0]) for b in sorted({*hybrid, *seen})}
    if not branches:
        return []
    lines = []
    for i, metric in enumerate(("steps", "accepted_tokens")):
        family = f"specroute_draft_branch_{metric}_total"
        lines.append(f"# TYPE {family} counter")
        lines += [f'{family}{{model_name="{name}",branch="{b}"}} {float(counts[i])}'
                  for b, counts in branches.items()]
    return lines
