"""What one request may ask for, and how it names a grammar: the facts the gateway and
the embedded worker both check, each defined once here.

The gateway validates a request before it routes it (gateway/schemas.py, the
`x-specroute-k` header in gateway/routing/router.py, the `max_tokens` it fills in
before dispatch); the embedded worker validates what reaches it
(workers/embedded/parsing.py, workers/embedded/engine.py). Both read this module, so a
request the gateway admits is one the embedded worker accepts. It lives in policies/
because both sides may import policies/ (the policy's `PoolView.max_k` defaults to
`MAX_K` too), and it imports nothing.
"""

from __future__ import annotations

# The most draft tokens (tree nodes) per verify step: the embedded engine refuses a
# larger k, the policy searches k up to it on a per-request-k pool (`PoolView.max_k`;
# its trust region keeps it near the k measured, docs/POLICY.md), and the
# `x-specroute-k` header takes 0..MAX_K (docs/GATEWAY.md).
MAX_K = 16

# The most samples (`n`) in one request: the embedded worker's limit, which the gateway
# enforces for every pool; more samples are more requests.
MAX_N = 16

# `max_tokens` of a /v1/completions request that gives none: OpenAI's default for that
# route (API reference, "max_tokens ... Defaults to 16"). Chat has no such default: the
# gateway budgets it from the pool's context, the worker decodes to the context's end.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# SGLang's grammar fields (python/sglang/srt/sampling/sampling_params.py), at most one
# per request; the gateway passes them on, the embedded worker compiles them.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")

# OpenAI's `response_format.type` values.
RESPONSE_FORMATS = ("text", "json_object", "json_schema")

# `json_object` as a JSON schema: any object, what SGLang's own OpenAI route compiles
# it to (and what the gateway sends SGLang for it).
JSON_OBJECT_SCHEMA = '{"type": "object"}'
