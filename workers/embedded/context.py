"""What the worker's routes share: its configuration and the objects built at startup."""

from __future__ import annotations

from dataclasses import dataclass

from workers.embedded.api import GenerationEngine
from workers.embedded.scheduler import Scheduler


@dataclass(frozen=True)
class WorkerConfig:
    method: str  # the worker's method (a request may name another)
    k: int  # the worker's k for its method, also the engine's default for it (0: plain)
    model_path: str
    served_model_name: str
    max_running: int = 4
    max_queue: int = 64


@dataclass
class WorkerState:
    engine: GenerationEngine
    scheduler: Scheduler
    config: WorkerConfig
    started: float  # wall-clock start, for /v1/models `created`

    @property
    def k(self) -> int:
        return self.config.k

    @property
    def speculative(self) -> bool:
        return self.config.method != "plain" and self.config.k > 0
