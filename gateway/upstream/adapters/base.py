"""What every engine adapter returns, whatever the worker speaks.

An adapter turns a validated `GenerationRequest` into one worker call and answers in
engine-neutral values: a `GenerationResult` (non-streaming), or a stream of `Delta`s closed
by exactly one `Final`. The gateway renders these into OpenAI responses itself, so
every pool's answers look the same to the client and carry the same speculation facts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config import PoolConfig
from gateway.schemas import STEERING_KEYS, GenerationRequest
from gateway.telemetry.worker_stats import SpecStats, Usage


@dataclass(slots=True)
class GenerationResult:
    """A whole non-streaming answer, finished when the adapter returns it."""

    text: str
    finish_reason: str
    usage: Usage
    spec: SpecStats
    message: dict | None = None  # chat: the worker's message (tool_calls, ...) when given
    # the worker's OpenAI choices, if any, their finish reasons normalised (`finish_reason_of`)
    choices: list[dict] = field(default_factory=list)
    native: dict | None = None  # the worker's /generate body, for a native request


@dataclass(slots=True)
class Delta:
    text: str = ""
    extra: dict = field(default_factory=dict)  # other chat delta fields: role, tool_calls
    finish_reason: str | None = None
    index: int = 0  # the choice (n > 1)
    logprobs: dict | None = None  # this chunk's OpenAI logprobs object, when asked for
    native: dict | None = None  # the worker's /generate chunk, for a native request
    usage: Usage | None = None  # the worker's running count, where its chunks carry one


@dataclass(slots=True)
class Final:
    usage: Usage
    spec: SpecStats
    finish_reason: str | None = None


StreamItem = Delta | Final


class Adapter(Protocol):
    """One engine's wire protocol; stateless apart from the shared HTTP client."""

    async def generate(self, worker: str, request: GenerationRequest, pool: PoolConfig,
                       k: int, deadline: float | None = None) -> GenerationResult:
        """The whole answer, by `deadline` (`time.monotonic()`; None: the client's
        `total_timeout_s` from now), past which it is an `UpstreamTimeout`."""
        ...

    def stream(self, worker: str, request: GenerationRequest, pool: PoolConfig,
               k: int) -> AsyncIterator[StreamItem]: ...

    async def alive(self, worker: str, timeout_s: float) -> bool:
        """Whether the worker's server answers at all (busy or not) within `timeout_s`."""
        ...


def worker_params(custom_params: object, pool: PoolConfig, k: int) -> dict | None:
    """The request's `custom_params` as the worker gets it: the client's method and k
    never (`STEERING_KEYS`; the schemas refuse them, this keeps any other way in shut),
    the gateway's instead: the pool's method on an embedded worker (which would
    otherwise run a client's), and the decided k (`num_speculative_tokens`, the embedded
    engine's per-request field) on per-request-k pools. None when nothing is left."""
    params = {key: value for key, value in custom_params.items()
              if key not in STEERING_KEYS} if isinstance(custom_params, dict) else {}
    if pool.engine == "embedded":
        params["method"] = pool.method
    if pool.capabilities.per_request_k:
        params["num_speculative_tokens"] = k
    return params or None


def finish_reason_of(value: object) -> str:
    """SGLang reports `{"type": "stop"|"length"|"abort", ...}`; OpenAI a plain string."""
    if isinstance(value, dict):
        value = value.get("type")
    if value in ("stop", "length", "tool_calls", "content_filter", "function_call"):
        return str(value)
    return "stop"


def worker_auth(api_key: str | None) -> dict[str, str]:
    """The headers that carry the workers' API key (SGLang's and vLLM's `--api-key`)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
