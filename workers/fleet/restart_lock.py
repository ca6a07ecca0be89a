"""One server of a model restarting at a time: a fleet move or a relaunch for a new k.

Every supervisor of a model takes the same lock (`policies.keys.fleet_move_key`, SET NX
with a TTL) before it stops its server, so the model's other servers keep serving. Without
it, a desired k published for a pool relaunched every server of that pool at once, and a
server that had just moved into the pool relaunched again while the pool's other server
was still down: the model had no healthy worker for a minute (CI, a vLLM CPU fleet move).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import redis

from policies.keys import fleet_move_key

logger = logging.getLogger(__name__)

LOCK_TTL_S = 1200.0  # a supervisor that dies mid-restart frees the lock by then


@contextmanager
def restart_lock(client: redis.Redis, model: str, holder: Mapping[str, object],
                 ttl_s: float = LOCK_TTL_S) -> Iterator[bool]:
    """Yields True while this supervisor holds the model's restart lock, False when
    another server of the model is restarting (or Redis cannot say: then hold too)."""
    key = fleet_move_key(model)
    token = json.dumps({**holder, "since": time.time()})
    try:
        held = bool(client.set(key, token, nx=True, ex=int(ttl_s)))
    except redis.RedisError as exc:
        logger.warning("cannot take the restart lock of %s: %s", model, exc)
        held = False
    try:
        yield held
    finally:
        if held:
            try:
                raw = client.get(key)
                if (raw.decode() if isinstance(raw, bytes) else raw) == token:
                    client.delete(key)
            except redis.RedisError as exc:  # the TTL frees it
                logger.warning("cannot release the restart lock of %s: %s", model, exc)
