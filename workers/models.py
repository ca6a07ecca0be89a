"""The models `specroute up` serves: their names, the bundled model's folder, and where
the repository ships weights (drafters, measured figures) for a model (`weights_dir`).

A served model's name is its folder's name (the worker serves it under that name). The
weights live under workers/embedded/weights/, so this is workers/' fact, read by the
engine, the fleet (vLLM drafters), the command and the benchmarks; policies/ never
needs a path. Standard library only: the supervisor imports workers/ inside the SGLang
image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "embedded" / "weights"

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
