"""The fleet contract: the facts that the gateway, the policy and the worker supervisor
must agree on, in one place.

- the pool schema: the keys of one `pools:` entry in the YAML config (`FleetPool`) and
  how to read one pool and the top-level `redis_url` from a file (`load_pool`), with the
  pool's `measured.json` when it names one;
- the engines a pool may name (`ENGINES`);
- the key of the worker's batch report in its replies (`WORKER_BATCH_KEY`).

It lives in policies/ because every side may import policies/ (gateway -> policies,
workers -> policies) while policies/ imports neither. The Redis keys live in
`policies.keys`, method facts (default k, engine names) in `policies.methods`, and the
served models and their weights' folders in `workers.models`. It needs PyYAML and
nothing else from outside the standard library: the supervisor imports it inside the
SGLang image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

# gateway/routing still imports these keys from here; new code imports policies.keys.
from policies.prior import MeasuredError, read_measured

ENGINES = ("sglang", "vllm", "openai", "embedded")


# The embedded worker's report on its batch, in meta_info and in sglext (ours, not
# SGLang's): mean requests per forward, draft tokens per forward, decode seconds.
WORKER_BATCH_KEY = "specroute_batch"


class FleetConfigError(ValueError):
    """The config file is unreadable, has no such pool, or the pool entry is malformed."""


@dataclass(frozen=True, slots=True)
class FleetPool:
    """The keys of one `pools:` entry that every side reads, and their defaults (the one
    home of both). The gateway's `PoolConfig` extends it (capabilities); the supervisor
    ignores the rest.

    `launch` holds engine options for the supervisor's launch command (SGLang or vLLM).
    """

    name: str
    engine: str
    model: str
    method: str = "plain"
    k: int = 0
    model_path: str | None = None  # the weights a supervisor launches; default: `model`
    workers: tuple[str, ...] = ()
    launch: Mapping[str, Any] = field(default_factory=dict)
    # a measured.json (policies/prior.py): what this pool's servers measured about
    # themselves, published in their registry entries and read by the fleet planner
    measured: str | None = None

    def measured_document(self) -> dict | None:
        """The `measured` file's document (checked when the config was read); None
        without one, or when it can no longer be read."""
        try:
            return read_measured(self.measured) if self.measured else None
        except MeasuredError:
            return None


POOL_DEFAULTS = {f.name: f.default for f in fields(FleetPool)}


def load_pool(config_path: str, pool: str) -> tuple[FleetPool, str | None]:
    """Read pool `pool` and the top-level `redis_url` from the gateway's YAML config."""
    try:
        raw = yaml.safe_load(Path(config_path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FleetConfigError(f"cannot read config {config_path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("pools"), list):
        raise FleetConfigError(f"{config_path}: expected a mapping with a 'pools' list")
    for i, entry in enumerate(raw["pools"]):
        if isinstance(entry, dict) and entry.get("name") == pool:
            try:
                spec = FleetPool(
                    name=pool, engine=str(entry["engine"]),
                    method=str(entry.get("method", POOL_DEFAULTS["method"])),
                    k=int(entry.get("k", POOL_DEFAULTS["k"])),
                    model=str(entry["model"]), model_path=entry.get("model_path"),
                    workers=tuple(entry.get("workers") or ()),
                    launch=dict(entry.get("launch") or {}),
                    measured=str(entry["measured"]) if entry.get("measured") else None)
                if spec.measured:
                    read_measured(spec.measured)
            except (KeyError, TypeError, ValueError) as exc:
                raise FleetConfigError(
                    f"{config_path}: pools[{i}]: bad or missing {exc}") from exc
            return spec, raw.get("redis_url")
    raise FleetConfigError(f"{config_path}: no pool named {pool!r}")
