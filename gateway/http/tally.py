"""The tokens a stream has cost so far, for one that never reaches its `Final`.

A tenant's tokens are counted from the worker's final `usage` (`Reporter.record`), which
a stream the client abandons, or one cut by a deadline or a worker's error, never gets:
without this tally the tokens it had generated were free (issue 43), and a client could
read a whole answer and hang up before the last chunk. The count is the worker's own
where its chunks carry one (SGLang's `/generate`: `meta_info` on every chunk); else the
prompt's estimate plus, per relayed delta, its UTF-8 bytes / 4 rounded up and at least
one (a worker streams at least one token per chunk; `gateway.schemas.BYTES_PER_TOKEN`).
"""

from __future__ import annotations

from gateway.schemas import BYTES_PER_TOKEN, GenerationRequest
from gateway.telemetry.worker_stats import Usage
from gateway.upstream.adapters.base import Delta


class StreamTally:
    __slots__ = ("prompt_tokens", "completion_tokens", "reported")

    def __init__(self, request: GenerationRequest) -> None:
        self.prompt_tokens = request.prompt_tokens_estimate
        self.completion_tokens = 0  # estimated from the deltas relayed
        self.reported: Usage | None = None  # the worker's latest running count

    def add(self, item: Delta) -> None:
        if item.usage is not None:
            self.reported = item.usage
        if item.text or item.extra.get("tool_calls") or item.native is not None:
            size = len(item.text.encode("utf-8"))
            self.completion_tokens += max(1, -(-size // BYTES_PER_TOKEN))

    @property
    def tokens(self) -> int:
        """Prompt and completion tokens so far."""
        if self.reported is not None:
            return self.reported.prompt_tokens + max(self.reported.completion_tokens, 0)
        return self.prompt_tokens + self.completion_tokens
