"""Response shapes of the worker's SGLang surface: meta_info, OpenAI pieces, error bodies.

Each function names the SGLang 0.5.23 structure it reproduces; docs/WORKER.md cites
file and line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from policies.fleet import WORKER_BATCH_KEY
from workers.embedded.api import GenerationStats, StepOutput, TokenLogprob

TokenText = Callable[[int], str]  # a token id's text
# a hybrid request's steps and accepted draft tokens per branch (`GenerationStats.branches`)
DRAFTS_KEY = "specroute_drafts"


def finish_reason_json(output: StepOutput, completion_tokens: int) -> dict[str, Any] | None:
    """SGLang's BaseFinishReason.to_json() (managers/schedule_batch.py)."""
    if not output.finished:
        return None
    if output.finish_reason == "length":
        return {"type": "length", "length": completion_tokens}
    if output.finish_reason == "stop":
        return {"type": "stop", "matched": output.matched_stop}
    return {"type": "abort", "message": "aborted", "status_code": None, "err_type": None}


def spec_fields(stats: GenerationStats) -> dict[str, Any]:
    """meta_info spec fields of a request that ran with speculation on.

    SGLang adds them whenever speculation is on and a verify step ran; its proposed
    count is verify_ct * k, here it is what the drafter actually proposed.
    """
    if not stats.verify_steps:
        return {}
    proposed = stats.num_proposed_drafts
    return {
        "spec_accept_rate": stats.num_correct_drafts / proposed if proposed else 0.0,
        "spec_accept_length": stats.completion_tokens / stats.verify_steps,
        "spec_num_correct_drafts": stats.num_correct_drafts,
        "spec_num_proposed_drafts": stats.num_proposed_drafts,
        "spec_verify_ct": stats.verify_steps,
        # SGLang's BatchStrOutput.spec_correct_drafts_histogram (managers/io_struct.py):
        # index = draft tokens a step accepted, value = steps; decode steps only
        "spec_correct_drafts_histogram": list(stats.accept_histogram),
    }


def meta_info(rid: str, output: StepOutput, stats: GenerationStats, started: float,
              speculative: bool) -> dict[str, Any]:
    """SGLang meta_info (tokenizer_manager.py _handle_batch_output); final fields at finish."""
    info: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason_json(output, stats.completion_tokens),
        "prompt_tokens": stats.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": 0,
    }
    if output.finished:
        now = time.perf_counter()  # one end for both, so decode_s <= e2e_latency
        info["e2e_latency"] = now - started
        if speculative:
            info.update(spec_fields(stats))
        if stats.by_source:
            info[DRAFTS_KEY] = stats.branches()
        info[WORKER_BATCH_KEY] = batch_fields(stats, now)
    return info




def batch_fields(stats: GenerationStats, now: float) -> dict[str, Any]:
    """What this request's batch looked like over its decode steps (every request, plain
    too; `GenerationStats` says what is counted): mean sequences per forward, mean draft
    tokens verified per forward across the batch, the steps counted (0: a request that
    ended at its first token; the means are then null), and `decode_s`, the seconds from
    its first token to `now` (its end): what its decode steps took, prefill and queueing
    not included — a client that does not stream cannot tell them apart, and with few
    steps (high acceptance) a share of the whole would read prefill as slow steps."""
    decode = now - stats.first_token_at if stats.first_token_at is not None else None
    return {"requests": stats.mean_batch, "draft_tokens": stats.mean_batch_draft_tokens,
            "steps": stats.batch_steps, "decode_s": decode}


def merge_batch(fields: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`batch_fields` of n samples as one: means weighted by their steps; `decode_s` the
    longest (the samples decode side by side)."""
    steps = sum(f["steps"] for f in fields)
    decodes = [f["decode_s"] for f in fields if f.get("decode_s") is not None]
    decode = max(decodes) if decodes else None
    if not steps:
        return {"requests": None, "draft_tokens": None, "steps": 0, "decode_s": decode}
    return {key: sum(f[key] * f["steps"] for f in fields if f["steps"]) / steps
            for key in ("requests", "draft_tokens")} | {"steps": steps, "decode_s": decode}


def merge_drafts(fields: Sequence[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    """`GenerationStats.branches` of n samples as one: every count summed."""
    out: dict[str, dict[str, int]] = {}
    for branches in fields:
        for branch, counts in branches.items():
            mine = out.setdefault(branch, {"steps": 0, "accepted": 0})
            for key, value in counts.items():
                mine[key] += value
    return dict(sorted(out.items()))


def merge_histograms(histograms: Sequence[Sequence[int]]) -> list[int]:
    """`spec_correct_drafts_histogram`s of n samples as one: counts summed by index."""
    out = [0] * max((len(h) for h in histograms), default=0)
    for histogram in histograms:
        for accepted, steps in enumerate(histogram):
            out[accepted] += steps
    return out


def spec_tokens_details(info: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang SpecTokensDetails (entrypoints/openai/protocol.py) from a final meta_info."""
    if "spec_verify_ct" not in info:
        return None
    return {
        "spec_accept_rate": info["spec_accept_rate"],
        "spec_accept_length": info["spec_accept_length"],
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": info["spec_num_correct_drafts"],
        "spec_num_proposed_drafts": info["spec_num_proposed_drafts"],
        "spec_verify_ct": info["spec_verify_ct"],
        "spec_correct_drafts_histogram": info.get("spec_correct_drafts_histogram", []),
        "spec_cap_lens_histogram": [],
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """SGLang UsageInfo."""
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None,
            "reasoning_tokens": 0}


def openai_finish(info: dict[str, Any]) -> tuple[str | None, str | int | None]:
    """(finish_reason, matched_stop) of an OpenAI choice from meta_info.finish_reason."""
    reason = info["finish_reason"]
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


def error_body(message: str, status_code: int) -> dict[str, Any]:
    """SGLang ErrorResponse (openai/serving_base.py create_error_response), flat, no "error" key."""
    kind = {400: "BadRequestError", 503: "ServiceUnavailableError"}.get(
        status_code, "InternalServerError")
    return {"object": "error", "message": message, "type": kind, "param": None,
            "code": status_code}


def sglang_logprobs(logprobs: Sequence[TokenLogprob], top: int, text: TokenText | None,
                    ) -> dict[str, Any]:
    """meta_info output_token_logprobs / output_top_logprobs (tokenizer_manager.py
    detokenize_logprob_tokens): [logprob, token id, text or None] per token."""
    def entry(token: int, logprob: float) -> list[Any]:
        return [logprob, token, text(token) if text is not None else None]

    info: dict[str, Any] = {
        "output_token_logprobs": [entry(lp.token_id, lp.logprob) for lp in logprobs]}
    if top:
        info["output_top_logprobs"] = [[entry(t, v) for t, v in lp.top] for lp in logprobs]
    return info


def chat_logprobs(logprobs: Sequence[TokenLogprob], text: TokenText) -> dict[str, Any]:
    """OpenAI ChoiceLogprobs: content[] of {token, bytes, logprob, top_logprobs[]}."""
    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = text(token)
        return {"token": piece, "bytes": list(piece.encode()), "logprob": logprob}

    return {"content": [{**entry(lp.token_id, lp.logprob),
                         "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs]}


def completion_logprobs(logprobs: Sequence[TokenLogprob], text: TokenText,
                        offset: int = 0) -> dict[str, Any]:
    """OpenAI completions LogProbs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = [text(lp.token_id) for lp in logprobs]
    offsets = []
    for piece in tokens:
        offsets.append(offset)
        offset += len(piece)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{text(t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets}
