"""The values the simulator runs on: a pool of the simulated fleet and one request.

`SimRequest.profile` is the one adapter from a simulated request to what the gateway's
policies see of it (`policies.types.RequestProfile`): the classifier's label, never the
true task, which only the world (and the oracle, bench/sim/baselines.py) knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from policies.types import RequestProfile, Task


@dataclass(frozen=True, slots=True)
class SimPool:
    name: str
    engine: str
    method: str
    k: int
    per_request_k: bool
    workers: int
    max_k: int = 12
    curve: str = "sglang-eagle1"
    group: str = "fleet"  # pools of one group run on the same workers (share batches)
    law: str = ""  # the engine's step law (bench/sim/steplaw.py) where the world measures


@dataclass(slots=True)
class SimRequest:
    index: int
    arrival_s: float
    task: str
    temperature: float
    bucket: str
    prompt_tokens: int
    output_tokens: int
    phase: int
    label: str = ""  # the classifier's task (what routers see); "" = the true task
    z_model: float = 0.0  # per-prompt acceptance draws (bench/sim/world.py)
    z_text: float = 0.0

    @property
    def seen_task(self) -> str:
        return self.label or self.task

    def profile(self, model: str) -> RequestProfile:
        """What the gateway's classifier reads off this request: its label, temperature
        and sizes (the output length stands for `max_tokens`)."""
        return RequestProfile(task=cast(Task, self.seen_task), temperature=self.temperature,
                              top_p=1.0, prompt_tokens=self.prompt_tokens,
                              max_tokens=self.output_tokens, stream=False, model=model)
