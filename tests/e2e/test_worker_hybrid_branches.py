"""A hybrid worker says which branch drafted each verify step: per request
(`specroute_drafts` in the final meta_info and in the OpenAI answer's sglext) and summed
since start in its /metrics (`specroute_draft_branch_*_total{branch}`), through real HTTP
to a real `specroute worker --method hybrid` on the bundled tiny model."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import stop_process
from gateway_harness import start_worker

from workers.models import BUNDLED_MODEL_DIR

BRANCHES = {"eagle", "ngram", "plain", "none"}
FAMILIES = ("steps", "accepted_tokens")
# repeats itself, so the n-gram branch finds matches in the prompt
TEXT = "def add(a, b):\n    return a + b\n\n" * 6


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_worker(tmp_path_factory.mktemp("hybrid"), "hybrid", BUNDLED_MODEL_DIR)
    yield url
    stop_process(proc)


def counters(url: str) -> dict[tuple[str, str], float]:
    """(family, branch) -> value of the worker's branch counters."""
    out = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("specroute_draft_branch_"):
            name, value = line.rsplit(" ", 1)
            family = name.split("{")[0].removeprefix("specroute_draft_branch_")
            out[(family.removesuffix("_total"), name.split('branch="')[1].split('"')[0])] = \
                float(value)
    return out


def check(drafts: dict, verify_steps: int, accepted: int) -> None:
    """Every decode step is under one branch (the prefill drafts nothing), and every
    accepted draft token under the branch that drafted it."""
    assert set(drafts) <= BRANCHES and "none" in drafts
    assert sum(d["steps"] for d in drafts.values()) == verify_steps - 1
    assert sum(d["accepted"] for d in drafts.values()) == accepted
    assert drafts["none"]["accepted"] == 0


def test_branch_counts_per_request_and_in_metrics(worker: str) -> None:
    before = counters(worker)
    assert set(before) == {(f, b) for f in FAMILIES for b in BRANCHES}  # a hybrid worker
    meta = httpx.post(f"{worker}/generate", timeout=60, json={
        "text": TEXT, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                          "ignore_eos": True}}).json()["meta_info"]
    drafts = meta["specroute_drafts"]
    check(drafts, meta["spec_verify_ct"], meta["spec_num_correct_drafts"])
    assert drafts["ngram"]["steps"] > 0  # the prompt repeats: copied at least once

    chat = httpx.post(f"{worker}/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 16,
        "temperature": 0, "ignore_eos": True, "return_spec_tokens_details": True}).json()
    details, chat_drafts = chat["sglext"]["spec_tokens_details"], chat["sglext"]["specroute_drafts"]
    check(chat_drafts, details["spec_verify_ct"], details["spec_num_correct_drafts"])

    plain = httpx.post(f"{worker}/generate", timeout=60, json={
        "text": TEXT, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                          "custom_params": {"method": "plain"}}}).json()
    assert "specroute_drafts" not in plain["meta_info"]  # one drafter or none: no branches

    after = counters(worker)
    for branch in BRANCHES:
        for family, key in zip(FAMILIES, ("steps", "accepted"), strict=True):
            served = sum(d.get(branch, {}).get(key, 0) for d in (drafts, chat_drafts))
            assert after[(family, branch)] - before[(family, branch)] == served, (family, branch)
