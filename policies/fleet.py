"""The fleet contract: the facts that the gateway, the policy and the worker supervisor
must agree on, in one place.

- the pool schema: the keys of one `pools:` entry in the YAML config (`FleetPool`) and
  how to read one pool and the top-level `redis_url` from a file (`load_pool`), with the
  pool's `measured.json` when it names one;
- the Redis key through which the policy asks a fixed-k pool for another k
  (`desired_k_key`), and those of the fleet planner's desired fleet and of the one worker
  moving between pools (`desired_fleet_key`, `fleet_move_key`);
- the key of the worker's batch report in its replies (`WORKER_BATCH_KEY`);
- the models `specroute up` serves: their names, the bundled model's folder, and where
  the repository ships weights (drafters, measured figures) for a model (`weights_dir`).

It lives in policies/ because every side may import policies/ (gateway -> policies,
workers -> policies) while policies/ imports neither. Method facts (default k, engine
names) live in `policies.methods`. It needs
PyYAML and nothing else from outside the standard library: the supervisor imports it
inside the SGLang image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from policies.prior import MeasuredError, read_measured

ENGINES = ("sglang", "vllm", "openai", "embedded")


# A served model's name is its folder's name (the worker serves it under that name).
WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "workers" / "embedded" / "weights"
# The embedded worker's report on its batch, in meta_info and in sglext (ours, not
# SGLang's): mean requests per forward, draft tokens per forward, decode seconds.
WORKER_BATCH_KEY = "specroute_batch"

BUNDLED_MODEL_NAME = "specroute-tiny"  # the project's 5.5 M test model, in the repository
BUNDLED_MODEL_DIR = WEIGHTS_DIR / BUNDLED_MODEL_NAME
# SmolLM2-135M-Instruct, fetched and converted into a cache on first use
# (workers/embedded/fetch_model.py); what `specroute up` serves by default.
SMOLLM2_MODEL_NAME = "smollm2-135m-instruct"
DEFAULT_MODEL_NAME = SMOLLM2_MODEL_NAME
# Short names `--model` takes besides full names and folders.
MODEL_ALIASES: Mapping[str, str] = {"tiny": BUNDLED_MODEL_NAME, "smollm2": SMOLLM2_MODEL_NAME}


DRAFTER_FOLDERS: Mapping[str, tuple[str, ...]] = {
    "medusa": ("medusa",), "eagle": ("eagle", "eagle2", "hybrid"), "draft": ("draft",)}


def weights_dir(model_name: str) -> Path:
    """Where the repository ships weights for a model: drafters, MODEL_CARD.md and
    measured.json (`specroute bench engine --write-measured`)."""
    return WEIGHTS_DIR / model_name


def drafter_dir_for(model_dir: str | Path) -> Path | None:
    """The folder with the drafters trained for the model in `model_dir`: the folder itself
    when it has a drafter subfolder (the bundled model), else `weights_dir(<its name>)`
    when that has one (SmolLM2: base in the user's cache, drafters in the repository)."""
    for folder in (Path(model_dir), weights_dir(Path(model_dir).name)):
        if any((folder / name / "config.json").exists() for name in DRAFTER_FOLDERS):
            return folder
    return None


class ModelNotFound(RuntimeError):
    """`--model` names no known model and no model folder, or fetching it failed."""


@dataclass(frozen=True)
class ModelChoice:
    """What `--model` resolved to: the served name, and its folder (None: SmolLM2, fetched
    and converted on first use by workers/embedded/fetch_model.py)."""

    name: str
    folder: Path | None


def resolve_model(spec: str | None) -> ModelChoice:
    """`--model`: unset -> the default model; an alias or full name (`tiny`,
    `specroute-tiny`, `smollm2`, `smollm2-135m-instruct`); else a model folder."""
    name = MODEL_ALIASES.get(spec, spec) if spec else DEFAULT_MODEL_NAME
    if name == BUNDLED_MODEL_NAME:
        return ModelChoice(name, BUNDLED_MODEL_DIR)
    if name == SMOLLM2_MODEL_NAME:
        return ModelChoice(name, None)
    folder = Path(name).expanduser().resolve()
    if not (folder / "config.json").exists():
        known = ", ".join([*MODEL_ALIASES, BUNDLED_MODEL_NAME, SMOLLM2_MODEL_NAME])
        raise ModelNotFound(f"no model at {folder} (known models: {known})")
    return ModelChoice(folder.name, folder)


def desired_k_key(pool: str) -> str:
    """Redis string (decimal): the k the policy wants on fixed-k pool `pool`; written by
    the policy's telemetry store, read by the supervisor."""
    return f"specroute:pool:{pool}:desired_k"


def desired_fleet_key(model: str) -> str:
    """Redis string (JSON `policies.planner.FleetPlan`): the workers per pool the fleet
    planner wants for `model`, with its reason; written by the gateway, read by the
    supervisors and the Kubernetes controller."""
    return f"specroute:fleet:{model}:desired"


def fleet_move_key(model: str) -> str:
    """Redis string (JSON {url, src, dst, since}), set NX with a TTL: the one worker of
    `model` changing pool now. Held by its supervisor; no other may move meanwhile."""
    return f"specroute:fleet:{model}:moving"


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
