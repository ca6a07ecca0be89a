"""The minimal profile: the classifier's fallback when its model cannot load (task from
`response_format` and tools only), with `gateway.classifier.classify.classify`'s
signature; `Guarded`, a classifier that falls back on it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.errors import traceback_text
from gateway.schemas import GenerationRequest
from policies.types import RequestProfile

log = logging.getLogger("specroute.gateway")
Classify = Callable[[GenerationRequest, str], RequestProfile]


def minimal_profile(request: GenerationRequest, tenant: str) -> RequestProfile:
    """Fallback classifier (task from response_format/tools only), same signature as
    `gateway.classifier.classify.classify`; used only when that one cannot load its model."""
    fmt_type = request.response_format["type"] if request.response_format else None
    return RequestProfile(
        task="structured" if fmt_type in ("json_object", "json_schema")
        or request.needs_tools else "chat",
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        prompt_tokens=request.prompt_tokens_estimate,
        max_tokens=request.max_tokens or 0,
        stream=request.stream,
        tenant=tenant,
        model=request.model,
        needs_constrained=request.needs_constrained,  # json_object is only a preference
        needs_tools=request.needs_tools,
        reasons=("minimal_profile",),
    )


class Guarded:
    """`classify`, except that a classifier bug never fails a valid request: it degrades
    to the minimal profile (logged with its traceback the first time)."""

    def __init__(self, classify: Classify) -> None:
        self.classify = classify
        self._failed = False

    def __call__(self, request: GenerationRequest, tenant: str) -> RequestProfile:
        try:
            return self.classify(request, tenant)
        except Exception as exc:  # noqa: BLE001 - any classifier failure: route on the basics
            if not self._failed:
                self._failed = True
                log.error("request classifier failed; using the minimal profile: %s",
                          traceback_text(exc))  # not the message: it may quote the prompt
            return minimal_profile(request, tenant)
