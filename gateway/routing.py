"""Which pool serves a request: filter by model and capability, then ask a policy.

The `Router` owns the parts that are facts (which pools serve the model, which can do
constrained decoding or tools, which have a healthy worker); the choice among the
remaining pools is a pluggable `decide(profile, pools) -> Decision` callable from
`policies/`. The default, `first_healthy`, takes the first pool with a healthy worker
in config order; the learned policy replaces it without touching this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.errors import InvalidRequest, ModelNotFound, NoHealthyWorker
from gateway.pools import Pool
from gateway.schemas import GenerationRequest
from policies.types import Decision, PoolView, RequestProfile

Decide = Callable[[RequestProfile, list[PoolView]], Decision]
Classify = Callable[[dict, str, str], RequestProfile]
CHARS_PER_TOKEN = 4  # rough prompt-size estimate; the gateway has no tokenizer


def estimate_prompt_tokens(body: dict) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = sum(len(m.get("content") or "") if isinstance(m.get("content"), str)
                    else 64 for m in messages if isinstance(m, dict))
        return chars // CHARS_PER_TOKEN + 4 * len(messages)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt) if prompt and isinstance(prompt[0], int) else 1
    return len(prompt or "") // CHARS_PER_TOKEN + 1


def minimal_profile(body: dict, endpoint: str, tenant: str) -> RequestProfile:
    """A stand-in classifier (task from response_format/tools only), same signature as
    `gateway.classify.classify`, which replaces it."""
    fmt = body.get("response_format") or {}
    constrained = fmt.get("type") in ("json_object", "json_schema")
    tools = bool(body.get("tools")) and body.get("tool_choice") != "none"
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return RequestProfile(
        task="structured" if constrained or tools else "chat",
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        prompt_tokens=estimate_prompt_tokens(body),
        max_tokens=int(max_tokens),
        stream=bool(body.get("stream")),
        tenant=tenant,
        model=str(body.get("model", "")),
        needs_constrained=constrained,
        needs_tools=tools,
        reasons=("minimal_profile",),
    )


def first_healthy(profile: RequestProfile, pools: list[PoolView]) -> Decision:
    """Default policy: the first pool (config order) that has a healthy worker."""
    for view in pools:
        if view.healthy_workers > 0:
            rest = tuple(p.name for p in pools if p.name != view.name and p.healthy_workers)
            return Decision(pool=view.name, method=view.method, k=view.k,
                            reason="first pool with a healthy worker", fallbacks=rest)
    raise NoHealthyWorker(f"no healthy worker serves model {profile.model!r}",
                          code="no_healthy_worker")


class Router:
    def __init__(self, pools: dict[str, Pool], decide: Decide = first_healthy,
                 classify: Classify = minimal_profile) -> None:
        self.pools = pools
        self.decide = decide
        self.classify = classify
        self.by_model: dict[str, list[Pool]] = {}
        for pool in pools.values():
            self.by_model.setdefault(pool.config.model, []).append(pool)

    def candidates(self, request: GenerationRequest, profile: RequestProfile) -> list[Pool]:
        """Pools serving the model that have every capability the request needs."""
        pools = self.by_model.get(request.model)
        if not pools:
            raise ModelNotFound(f"The model '{request.model}' does not exist",
                                param="model", code="model_not_found")
        needs = [("constrained_decoding", request.needs_constrained, "response_format"),
                 ("tools", request.needs_tools, "tools")]
        for capability, needed, param in needs:
            if needed:
                pools = [p for p in pools if getattr(p.config.capabilities, capability)]
                if not pools:
                    raise InvalidRequest(
                        f"no pool serving '{request.model}' supports {capability} "
                        f"(needed for '{param}')", param=param, code="unsupported_capability")
        wanted = profile.prompt_tokens + (request.max_tokens or 0)
        fitting = [p for p in pools if p.config.capabilities.max_context >= wanted]
        if not fitting:
            raise InvalidRequest(
                f"the request needs about {wanted} tokens of context; the largest "
                f"max_context for '{request.model}' is "
                f"{max(p.config.capabilities.max_context for p in pools)}",
                param="max_tokens", code="context_length_exceeded")
        return fitting

    def route(self, request: GenerationRequest,
              profile: RequestProfile) -> tuple[Decision, list[Pool]]:
        """The policy's decision and the pools to try, chosen pool first."""
        pools = self.candidates(request, profile)
        by_name = {p.name: p for p in pools}
        decision = self.decide(profile, [p.view() for p in pools])
        chosen = by_name.get(decision.pool)
        if chosen is None:
            raise NoHealthyWorker(f"policy chose unknown pool {decision.pool!r}")
        if not chosen.config.capabilities.per_request_k:
            decision = replace(decision, k=chosen.config.k)  # k is fixed at launch
        order = [chosen] + [by_name[n] for n in decision.fallbacks if n in by_name]
        return decision, order

