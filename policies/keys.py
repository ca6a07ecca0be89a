"""Every Redis key the project reads or writes, in one place (docs/FLEET.md and
docs/POLICY.md draw the same table).

All keys start with `specroute:`; a per-pool key is spelled `specroute:pool:{pool}:...`.
`{url}` is a worker's base URL as is, `{model}` a served model's name, `{context}` an
aggregate's context string (policies/aggregates.py).

    specroute:telemetry                      stream, one entry per finished request
    specroute:telemetry:batch:{id}           string, a telemetry batch was applied (TTL)
    specroute:agg:{context}                  hash, the context's forward-decayed sums
    specroute:agg:index                      set, every {context}, so readers need no SCAN
    specroute:pool:{pool}:desired_k          string, the k the policy wants on a fixed-k pool
    specroute:pool:{pool}:workers            set, the worker URLs registered in the pool
    specroute:pool:index                     set, the pool names that ever registered
    specroute:worker:{pool}:{url}            string, the worker's JSON WorkerInfo (TTL)
    specroute:worker:{pool}:{url}:draining   string "1" while the worker is being drained
    specroute:fleet:{model}:desired          string, the fleet planner's plan (JSON)
    specroute:fleet:{model}:moving           string, the one worker changing pool (NX, TTL)
    specroute:limit:{tenant}:{minute}:req    string, a tenant's requests in one window
    specroute:limit:{tenant}:{minute}:tok    string, a tenant's tokens in one window

It lives in policies/ because every side may import policies/ while policies/ imports
neither, and it imports nothing: the supervisor reads it inside the SGLang image.
"""

from __future__ import annotations

PREFIX = "specroute:"

# Telemetry (policies/telemetry.py): the request stream and the decayed aggregates.
STREAM_KEY = PREFIX + "telemetry"
AGG_PREFIX = PREFIX + "agg:"
AGG_INDEX = AGG_PREFIX + "index"
TELEMETRY_BATCH_PREFIX = STREAM_KEY + ":batch:"

# The worker registry (workers/fleet/registry.py): the set of pool names.
POOL_INDEX_KEY = PREFIX + "pool:index"


def agg_key(context: str) -> str:
    """Redis hash: the forward-decayed sums of one context (policies/aggregates.py)."""
    return AGG_PREFIX + context


def telemetry_batch_key(batch_id: str) -> str:
    """Redis string "1", with a TTL: the telemetry batch `batch_id` was applied, so the
    same batch sent again (its reply lost to a timeout) is not counted twice."""
    return TELEMETRY_BATCH_PREFIX + batch_id


def desired_k_key(pool: str) -> str:
    """Redis string (decimal): the k the policy wants on fixed-k pool `pool`; written by
    the policy's telemetry store, read by the supervisor."""
    return f"{PREFIX}pool:{pool}:desired_k"


def pool_workers_key(pool: str) -> str:
    """Redis set: the URLs of the workers registered in `pool` (an index; members whose
    `worker_key` has expired are pruned on read)."""
    return f"{PREFIX}pool:{pool}:workers"


def worker_key(pool: str, url: str) -> str:
    """Redis string (JSON `WorkerInfo`) with the heartbeat TTL: the worker is alive
    exactly while it exists."""
    return f"{PREFIX}worker:{pool}:{url}"


def draining_key(pool: str, url: str) -> str:
    """Redis string "1" while the worker is being drained: send it no new requests."""
    return f"{worker_key(pool, url)}:draining"


def desired_fleet_key(model: str) -> str:
    """Redis string (JSON `policies.planner.FleetPlan`): the workers per pool the fleet
    planner wants for `model`, with its reason; written by the gateway, read by the
    supervisors and the Kubernetes controller."""
    return f"{PREFIX}fleet:{model}:desired"


def fleet_move_key(model: str) -> str:
    """Redis string (JSON {url, src, dst, since}), set NX with a TTL: the one worker of
    `model` changing pool now. Held by its supervisor; no other may move meanwhile."""
    return f"{PREFIX}fleet:{model}:moving"


def limit_window_keys(tenant: str, window: int) -> tuple[str, str]:
    """Redis strings (counters): a tenant's requests and tokens in one fixed window
    (gateway/tenants/limits.py), expiring two windows later."""
    base = f"{PREFIX}limit:{tenant}:{window}"
    return f"{base}:req", f"{base}:tok"
