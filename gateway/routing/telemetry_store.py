"""The gateway's Redis telemetry store: `policies.telemetry.TelemetryStore` with its
flush coalesced per batch.

The store's thread sends each finished request as one stream entry (`XADD`) and, for a
request that teaches, one `HINCRBYFLOAT` per aggregate field (~15), an `HDEL` of the
stale era's fields and an `SADD` of its context: ~18 commands a request. In the gateway
that thread shares the interpreter (and so the GIL) with the event loop; at c = 32 on the
2-core box, packing and parsing those commands was the largest single cost of a request
(a quarter of the gateway process's CPU samples, docs/PERFORMANCE.md). A batch's
requests almost all share a few contexts, so here their increments are summed per
(context, field) first and each context gets one increment per field, one `HDEL` and one
`SADD` per batch; the stream still gets one entry per request.

The aggregates in Redis are the same: an increment is additive, and a field is deleted
only once it is two eras old (`policies.aggregates.stale_fields`), so with the batch's
timestamps in order (they are: records are stamped when they finish) deleting after the
batch's increments removes exactly what the one-by-one writes would have. Floating-point
sums may differ in the last bits. A stream entry is `orjson.dumps(record)`, the same
bytes as `orjson.dumps(record.to_dict())` (`dataclasses.asdict`) without the copy.
"""

from __future__ import annotations

import orjson

from policies.aggregates import (
    ContextKey,
    forward_increments,
    record_values,
    stale_fields,
    teaches,
)
from policies.fleet import desired_k_key
from policies.telemetry import AGG_INDEX, AGG_PREFIX, STREAM_KEY, TelemetryStore
from policies.types import RequestRecord


class CoalescingTelemetryStore(TelemetryStore):
    """`TelemetryStore` whose batch write sends one increment per (context, field)."""

    def _write(self, batch: list[RequestRecord], desired: dict[str, int]) -> None:
        tau = self.config.tau_s
        maxlen = self.config.stream_maxlen
        pipe = self._client.pipeline(transaction=False)
        sums: dict[str, dict[str, float]] = {}
        stale: dict[str, dict[str, None]] = {}  # per context, ordered and unique
        for rec in batch:
            # orjson writes the dataclass itself as `asdict` would, without the deep copy
            pipe.xadd(STREAM_KEY, {"r": orjson.dumps(rec)}, maxlen=maxlen, approximate=True)
            if not teaches(rec):
                continue
            context = ContextKey.of(rec).encode()
            fields = sums.get(context)
            if fields is None:
                fields = sums[context] = {}
                stale[context] = {}
            for name, inc in forward_increments(record_values(rec), rec.timestamp,
                                                tau).items():
                fields[name] = fields.get(name, 0.0) + inc
            stale[context].update(dict.fromkeys(stale_fields(rec.timestamp, tau)))
        for context, fields in sums.items():
            key = AGG_PREFIX + context
            for name, inc in fields.items():
                pipe.hincrbyfloat(key, name, inc)
            pipe.hdel(key, *stale[context])
            pipe.sadd(AGG_INDEX, context)
        for pool, k in desired.items():
            pipe.set(desired_k_key(pool), k)
        pipe.execute()
