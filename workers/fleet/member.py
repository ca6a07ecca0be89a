"""A supervised worker that follows the fleet planner's desired fleet (bare metal, compose).

The gateway publishes, per model, the workers each pool should have
(`policies.fleet.desired_fleet_key`, a `policies.planner.FleetPlan`). Every supervisor of
that model compares it with the live registry (`workers.fleet.registry.list_workers`) and, when
its own pool has more workers than desired and the planner's next move
(`policies.planner.next_move`) takes a worker from its pool:

    take the model's restart lock (`workers.fleet.restart_lock`: one move or k relaunch
    per model at a time)
    -> fewer than `min_workers` would still serve? give the lock back, hold
    -> drain (no new requests, finish those in flight) -> stop -> deregister
    -> launch with the new pool's method and k -> /health -> register in the new pool
    -> give the lock back; a launch that fails rolls back to the old pool

At start, a supervisor takes the pool with the largest shortfall in the desired fleet
(its configured pool when there is none), so supervisors are assigned to pools by the
desired fleet before any relaunch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis
import yaml

from policies.fleet import FleetConfigError, FleetPool, load_pool
from policies.keys import desired_fleet_key
from policies.planner import FleetPlan, next_move
from workers.fleet.launch import CommandBuilder
from workers.fleet.registry import list_workers
from workers.fleet.restart_lock import LOCK_TTL_S, restart_lock
from workers.fleet.supervisor import Supervisor

logger = logging.getLogger(__name__)


def model_pools(config_path: str, model: str) -> dict[str, FleetPool]:
    """Every pool of the config that serves `model`: where its workers may move."""
    try:
        raw = yaml.safe_load(Path(config_path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FleetConfigError(f"cannot read config {config_path}: {exc}") from exc
    names = [e.get("name") for e in (raw or {}).get("pools") or [] if isinstance(e, dict)]
    pools = (load_pool(config_path, str(name))[0] for name in names if name)
    return {p.name: p for p in pools if p.model == model}


@dataclass(frozen=True, slots=True)
class MemberSettings:
    min_workers: int = 1  # serving (registered, not draining) workers of the model, at least
    lock_ttl_s: float = LOCK_TTL_S


class FleetMember:
    def __init__(self, supervisor: Supervisor, pools: Mapping[str, FleetPool],
                 builder: Callable[[FleetPool], CommandBuilder],
                 settings: MemberSettings | None = None) -> None:
        self.supervisor = supervisor
        self.pools = dict(pools)  # the model's pools by name
        self.model = supervisor.pool.model
        self.builder = builder
        self.settings = settings or MemberSettings()
        self._redis = redis.Redis.from_url(supervisor.redis_url, socket_timeout=5.0,
                                           decode_responses=True)
        self.moves = 0

    def desired(self) -> dict[str, int] | None:
        try:
            raw = self._redis.get(desired_fleet_key(self.model))
        except redis.RedisError as exc:
            logger.warning("cannot read the desired fleet of %s: %s", self.model, exc)
            return None
        if not raw:
            return None
        try:
            wanted = FleetPlan.from_json(raw).desired
        except (ValueError, TypeError) as exc:
            logger.warning("ignoring a malformed desired fleet of %s: %s", self.model, exc)
            return None
        return {name: int(n) for name, n in wanted.items() if name in self.pools}

    def current(self) -> tuple[dict[str, int], int]:
        """(live workers per pool of the model, those serving: not draining)."""
        counts = dict.fromkeys(self.pools, 0)
        serving = 0
        for info in list_workers(self._redis):
            if info.pool in counts and info.model == self.model:
                counts[info.pool] += 1
                serving += not info.draining
        return counts, serving

    def initial_pool(self) -> FleetPool:
        """The pool with the largest shortfall against the desired fleet, else the
        configured one."""
        wanted = self.desired()
        if not wanted:
            return self.supervisor.pool
        try:
            counts, _ = self.current()
        except redis.RedisError:
            return self.supervisor.pool
        short = {name: wanted.get(name, 0) - counts[name] for name in self.pools}
        name = max(sorted(short), key=lambda p: short[p])
        return self.pools[name] if short[name] > 0 else self.supervisor.pool

    def start(self) -> None:
        pool = self.initial_pool()
        if pool.name != self.supervisor.pool.name:
            logger.info("starting in pool %s (desired fleet) instead of %s", pool.name,
                        self.supervisor.pool.name)
            self.supervisor.assign(pool, self.builder(pool))
        self.supervisor.start()

    def poll_once(self) -> str:
        """The supervisor's own step first (crash restarts, desired k); then, when idle,
        one fleet step: 'moved', 'failed', 'held' (minimum, or another move under way),
        or 'idle'."""
        outcome = self.supervisor.poll_once()
        if outcome != "idle":
            return outcome
        wanted = self.desired()
        if not wanted:
            return "idle"
        try:
            counts, serving = self.current()
        except redis.RedisError as exc:
            logger.warning("cannot read the registry: %s", exc)
            return "idle"
        mine = self.supervisor.pool.name
        move = next_move(counts, {**dict.fromkeys(self.pools, 0), **wanted})
        if move is None or move[0] != mine:
            return "idle"
        if serving - 1 < self.settings.min_workers:
            return "held"
        return self._move(move[1])

    def _move(self, dst: str) -> str:
        holder = {"url": self.supervisor.settings.url, "src": self.supervisor.pool.name,
                  "dst": dst}
        with restart_lock(self._redis, self.model, holder, self.settings.lock_ttl_s) as held:
            if not held:
                return "held"  # another server of the model is moving or relaunching
            try:
                _, serving = self.current()  # re-check under the lock
            except redis.RedisError as exc:
                logger.warning("cannot read the registry: %s", exc)
                return "held"
            if serving - 1 < self.settings.min_workers:
                return "held"
            outcome = self.supervisor.move_to(self.pools[dst], self.builder(self.pools[dst]))
            self.moves += outcome == "moved"
            return outcome

    def stop(self, drain: bool = False) -> None:
        self.supervisor.stop(drain)
        self._redis.close()
