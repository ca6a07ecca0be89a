"""`specroute up`: which model it serves (SmolLM2 by default, `--model tiny` the bundled
one) and with which methods (those the model has drafters for); and the whole local
stack (Redis, embedded workers, the gateway with the learned policy) comes up, answers
the official `openai` client, and a signal stops every process it started.

The stack runs the bundled model (`--model tiny`; skipped while it is absent);
`SPECROUTE_TEST_MODEL` points it at another model folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest
from conftest import free_port, start_process, stop_process, wait_http

from specroute.stack import available_methods, build_config, prepare_model
from workers.models import BUNDLED_MODEL_DIR, ModelChoice, ModelNotFound, resolve_model

MODEL = Path(os.environ.get("SPECROUTE_TEST_MODEL") or BUNDLED_MODEL_DIR)
MODEL_ARG = "tiny" if MODEL == BUNDLED_MODEL_DIR else str(MODEL)
needs_model = pytest.mark.skipif(not (MODEL / "config.json").exists(),
                                 reason=f"no model at {MODEL}")
ALL_METHODS = ["plain", "ngram", "lookahead", "medusa", "eagle", "eagle2", "hybrid", "draft"]


def test_up_serves_smollm2_unless_told_otherwise() -> None:
    assert resolve_model(None) == ModelChoice("smollm2-135m-instruct", None)
    assert resolve_model("smollm2") == resolve_model("smollm2-135m-instruct") == resolve_model(None)
    assert resolve_model("tiny") == ModelChoice("specroute-tiny", BUNDLED_MODEL_DIR)
    assert resolve_model("specroute-tiny") == resolve_model("tiny")
    assert resolve_model(str(BUNDLED_MODEL_DIR)) == resolve_model("tiny")
    with pytest.raises(ModelNotFound, match="known models: tiny, smollm2"):
        resolve_model("no-such-model")


def test_the_default_model_is_fetched_by_a_child_process() -> None:
    from workers.embedded.fetch_model import ensure_smollm2

    assert prepare_model(resolve_model(None)) == ensure_smollm2()


def test_methods_follow_the_drafters_that_exist(tmp_path: Path) -> None:
    assert available_methods(BUNDLED_MODEL_DIR) == ALL_METHODS
    bare = tmp_path / "some-model"
    bare.mkdir()
    assert available_methods(bare) == ["plain", "ngram", "lookahead"]
    (bare / "medusa").mkdir()
    (bare / "medusa" / "config.json").write_text("{}")
    assert available_methods(bare) == ["plain", "ngram", "lookahead", "medusa"]
    # a fetched model finds the drafters the repository ships under its name
    fetched = tmp_path / "specroute-tiny"
    fetched.mkdir()
    assert available_methods(fetched) == ALL_METHODS


def test_pools_serve_the_model_under_its_folder_name(tmp_path: Path) -> None:
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 2048}')
    config = build_config([("plain", 1), ("ngram", 2)], "127.0.0.1", 8000, "redis://x", folder)
    assert [p["model"] for p in config["pools"]] == ["smollm2-135m-instruct"] * 2
    assert config["pools"][1]["capabilities"]["max_context"] == 2048
    assert config["pools"][1]["workers"] == ["http://127.0.0.1:2"]


def children_of(pid: int) -> set[int]:
    """Direct children, from /proc (the stack's processes run in their own sessions)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(entry.name))
    return found


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, theirs, and so on)."""
    found, todo = set(), [pid]
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def assert_stops_cleanly(proc: subprocess.Popen, pids: set[int] | list[int],
                         stop_signal: int = signal.SIGTERM, exit_s: float = 30,
                         linger_s: float = 10) -> None:
    """`stop_signal` to the stack: it exits 0 within `exit_s` and, `linger_s` later, none
    of `pids` lives on."""
    proc.send_signal(stop_signal)
    assert proc.wait(exit_s) == 0
    deadline = time.monotonic() + linger_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)]


def kill_stack(proc: subprocess.Popen, pids: set[int]) -> None:
    """After a test, whatever happened: the stack and every process it started are gone."""
    if proc.poll() is None:  # every descendant, also those started since `pids` was taken
        pids |= descendants(proc.pid)
        proc.kill()
        proc.wait()
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    stop_process(proc)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@needs_model
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_up_serves_and_stops_everything(tmp_path: Path, stop_signal: signal.Signals) -> None:
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "up", "--port", str(port), "--workdir",
                          str(tmp_path / "work"), "--methods", "plain,ngram", "--model",
                          MODEL_ARG], tmp_path / "up.log", env={"REDIS_URL": ""})
    pids: set[int] = set()
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", 60, proc)
        pids = children_of(proc.pid)
        assert len(pids) == 4  # redis, two workers, the gateway
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=30)
        messages = [{"role": "user", "content": "Say hello."}]
        response = client.chat.completions.create(model="specroute-tiny", messages=messages,
                                                  max_tokens=12, temperature=0)
        facts = response.model_extra["specroute"]
        assert facts["pool"] in ("embedded-plain", "embedded-ngram")
        assert response.usage.completion_tokens > 0 and facts["accept_length"] >= 1.0
        # per-request k reaches the embedded worker: never more than k + 1 tokens a step
        raw = client.chat.completions.with_raw_response.create(
            model="specroute-tiny", messages=messages, max_tokens=12, temperature=0,
            extra_headers={"x-specroute-pool": "embedded-ngram", "x-specroute-k": "1"})
        facts = raw.parse().model_extra["specroute"]
        assert facts["k"] == 1 and facts["accept_length"] <= 2.0
        # a JSON schema, enforced by the embedded workers' grammar engine
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                  "required": ["ok"], "additionalProperties": False}
        raw = client.chat.completions.with_raw_response.create(
            model="specroute-tiny", messages=messages, max_tokens=16, temperature=0,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "ok", "schema": schema}})
        assert "x-specroute-warning" not in raw.headers
        assert isinstance(json.loads(raw.parse().choices[0].message.content)["ok"], bool)
        assert_stops_cleanly(proc, pids, stop_signal)
    finally:
        kill_stack(proc, pids)
