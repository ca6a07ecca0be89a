"""A token budget for every request: no worker call runs without `max_tokens`.

A chat request without `max_tokens` would run on a worker until its context ends: on a
small model under a grammar that can pad (a tool call's JSON), thousands of tokens and
minutes of a slot (issue 24: 2,580 tokens in 300 s, then the same again on the failover).
So the gateway gives it one, per pool, at dispatch: `server.default_max_tokens`, bounded
by half the context left on that pool (its `max_context` less the prompt estimate, which
for chat with tools includes the tools' JSON: every template renders them into the
prompt). Half, because the estimate is bytes / 4 (the gateway has no tokenizer) and the
worker adds what the gateway cannot see (the chat template, a tools preamble: 163 real
tokens for an estimated 62 on the bundled model), and a worker refuses a prompt plus
budget past its context (SGLang, vLLM and the embedded worker all do).
A tenant's `max_tokens` cap was already made the request's own by `authorize`.
Completions keep OpenAI's documented default of 16; SGLang's `/generate` keeps its own
(`max_new_tokens` 128 on the worker).
"""

from __future__ import annotations

import dataclasses

import orjson

from gateway.pools import Pool
from gateway.schemas import BYTES_PER_TOKEN, COMPLETIONS_MAX_TOKENS, GenerationRequest


def tools_tokens(request: GenerationRequest) -> int:
    if not request.tools:
        return 0
    return -(-len(orjson.dumps(request.tools)) // BYTES_PER_TOKEN)


def with_budget(request: GenerationRequest, pool: Pool,
                default_max_tokens: int) -> GenerationRequest:
    """The request with a `max_tokens` that fits `pool`, if it had none."""
    if request.max_tokens is not None or request.native is not None:
        return request
    asked = COMPLETIONS_MAX_TOKENS if request.endpoint == "completions" else default_max_tokens
    left = (pool.config.capabilities.max_context - request.prompt_tokens_estimate
            - tools_tokens(request))
    budget = max(1, min(asked, left // 2))
    return dataclasses.replace(request, max_tokens=budget,
                               body={**request.body, "max_tokens": budget})
