"""The embedded worker's `specroute_batch` as the adapters read it: from meta_info (SGLang
adapter) and from sglext (OpenAI adapter), with or without speculation counters, odd
values ignored (None), never an exception; a stream keeps both kinds across chunks."""

from __future__ import annotations

import pytest

from gateway.telemetry.worker_stats import SpecStats, merge_spec
from gateway.upstream.adapters.openai_body import spec_of
from gateway.upstream.adapters.reply import Reply
from gateway.upstream.adapters.sglang import spec_from_meta

DETAILS = {"spec_verify_ct": 4, "spec_accept_length": 2.5, "spec_accept_rate": 0.5,
           "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12}


def spec_from_body(raw: dict) -> SpecStats | None:
    return spec_of(Reply("worker", raw))


BATCH = {"requests": 2.5, "draft_tokens": 6.0, "steps": 3, "decode_s": 0.4}


def test_meta_info_batch_with_and_without_counters() -> None:
    spec = spec_from_meta({**DETAILS, "specroute_batch": BATCH})
    assert (spec.verify_steps, spec.batch, spec.batch_draft_tokens) == (4, 2.5, 6.0)
    plain = spec_from_meta({"completion_tokens": 3, "specroute_batch": BATCH})
    assert (plain.verify_steps, plain.batch, plain.batch_draft_tokens, plain.decode_s) == (
        0, 2.5, 6.0, 0.4)
    sglang = spec_from_meta(DETAILS)  # SGLang itself says nothing of its batch
    assert sglang.batch is None and sglang.batch_draft_tokens is None
    assert sglang.decode_s is None


def test_sglext_batch_alone_or_beside_details() -> None:
    both = spec_from_body({"sglext": {"spec_tokens_details": DETAILS, "specroute_batch": BATCH}})
    assert both is not None and (both.correct_drafts, both.batch) == (6, 2.5)
    alone = spec_from_body({"sglext": {"specroute_batch": BATCH}})
    assert alone is not None and not alone.has_counters
    assert (alone.batch, alone.batch_draft_tokens) == (2.5, 6.0)
    assert spec_from_body({"sglext": {}}) is None
    assert spec_from_body({"sglext": {"specroute_batch": "full"}}) is None


@pytest.mark.parametrize("value", [None, "2", -1, -0.5, True, float("inf"), float("nan"),
                                   [2], {"n": 2}])
def test_odd_values_are_ignored(value: object) -> None:
    odd = {"requests": value, "draft_tokens": value, "steps": 3, "decode_s": value}
    for spec in (spec_from_meta({"specroute_batch": odd}),
                 spec_from_body({"sglext": {"specroute_batch": odd}})):
        assert spec is not None and spec.batch is None and spec.batch_draft_tokens is None
        assert spec.decode_s is None
    mixed = spec_from_meta({"specroute_batch": {"requests": 1, "draft_tokens": value}})
    assert mixed.batch == 1.0 and mixed.batch_draft_tokens is None
    assert spec_from_meta({"specroute_batch": value}).batch is None


def test_sglangs_own_latencies_give_the_decode_time() -> None:
    """SGLang with --enable-metrics: e2e_latency less first_token_latency; the embedded
    worker's own decode_s wins; without both, or in the wrong order, nothing."""
    assert spec_from_meta({"e2e_latency": 2.0, "first_token_latency": 0.5}).decode_s == 1.5
    assert spec_from_meta({"e2e_latency": 2.0, "first_token_latency": 0.5,
                           "specroute_batch": BATCH}).decode_s == 0.4
    for meta in ({"e2e_latency": 2.0}, {"e2e_latency": 0.5, "first_token_latency": 2.0},
                 {"e2e_latency": "2", "first_token_latency": 0.5}):
        assert spec_from_meta(meta).decode_s is None


def test_zero_is_a_value() -> None:
    spec = spec_from_meta({"specroute_batch": {"requests": 1, "draft_tokens": 0}})
    assert (spec.batch, spec.batch_draft_tokens) == (1.0, 0.0)


def test_a_stream_merges_counters_and_batch_from_different_chunks() -> None:
    spec = SpecStats()
    for chunk in ({"choices": []}, {"sglext": {"spec_tokens_details": DETAILS}},
                  {"sglext": {"specroute_batch": BATCH}}, {"usage": {}}):
        spec = merge_spec(spec_from_body(chunk), spec)
    assert (spec.verify_steps, spec.accept_length, spec.batch, spec.batch_draft_tokens,
            spec.decode_s) == (4, 2.5, 2.5, 6.0, 0.4)
    spec = SpecStats()  # the other order
    for chunk in ({"sglext": {"specroute_batch": BATCH}},
                  {"sglext": {"spec_tokens_details": DETAILS}}):
        spec = merge_spec(spec_from_body(chunk), spec)
    assert (spec.correct_drafts, spec.proposed_drafts, spec.batch) == (6, 12, 2.5)
    vllm = merge_spec(spec_from_body({"metrics": {"speculative_decoding": {
        "num_spec_steps": 2, "mean_acceptance_length": 3.0}}}), SpecStats())
    assert vllm.verify_steps == 2 and vllm.batch is None


DRAFTS = {"none": {"steps": 2, "accepted": 0}, "ngram": {"steps": 5, "accepted": 9},
          "eagle": {"steps": 7, "accepted": 4}}


def test_a_hybrids_branch_counts_from_meta_info_and_sglext() -> None:
    """`specroute_drafts` beside `specroute_batch`, as the embedded worker sends it; its
    key is the worker's; odd branches are dropped, a stream keeps it across chunks."""
    from gateway.telemetry.worker_stats import DRAFTS_KEY as READ_KEY
    from workers.embedded.responses import DRAFTS_KEY

    assert READ_KEY == DRAFTS_KEY
    want = {"none": (2, 0), "ngram": (5, 9), "eagle": (7, 4)}
    assert spec_from_meta({**DETAILS, "specroute_batch": BATCH,
                           "specroute_drafts": DRAFTS}).drafts == want
    body = spec_from_body({"sglext": {"specroute_batch": BATCH, "specroute_drafts": DRAFTS}})
    assert body is not None and body.drafts == want
    assert spec_from_meta({"specroute_batch": BATCH}).drafts is None  # one drafter: none
    odd = {"ngram": {"steps": -1, "accepted": 0}, "eagle": {"steps": True, "accepted": 1},
           "x": "many", "none": {"steps": 3, "accepted": 0}}
    assert spec_from_meta({"specroute_batch": BATCH, "specroute_drafts": odd}).drafts == {
        "none": (3, 0)}
    assert spec_from_meta({"specroute_batch": BATCH, "specroute_drafts": [1]}).drafts is None
    kept = merge_spec(SpecStats(verify_steps=4), SpecStats(drafts=want))
    assert kept.drafts == want and kept.verify_steps == 4
