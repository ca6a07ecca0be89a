"""The gateway's Redis telemetry store: `policies.telemetry.TelemetryStore` with its
flush coalesced per batch.

The store's thread sends each finished request as one stream entry (`XADD`) and, for a
request that teaches, one `HINCRBYFLOAT` per aggregate field (~15), an `HDEL` of the
stale era's fields and an `SADD` of its context. In the gateway that thread shares the
interpreter (and so the GIL) with the event loop, and packing and parsing those commands
was the largest single cost of a request under load (docs/PERFORMANCE.md). A batch's
requests almost all share a few contexts, so here their increments are summed per
(context, field) first and each context gets one increment per field, one `HDEL` and one
`SADD` per batch; the stream still gets one entry per request.

The aggregates in Redis are the same: an increment is additive, and a field is deleted
only once it is two eras old (`policies.aggregates.stale_fields`), so with the batch's
timestamps in order (they are: records are stamped when they finish) deleting after the
batch's increments removes exactly what the one-by-one writes would have. Floating-point
sums may differ in the last bits. A stream entry is `orjson.dumps(record)`, the same
bytes as `orjson.dumps(record.to_dict())` (`dataclasses.asdict`) without the copy.
The batch goes to Redis as the arguments of one `APPLY_ONCE_LUA` call, as in the base
store, so it is applied once however often it is sent.
"""

from __future__ import annotations

import orjson

from policies.aggregates import (
    ContextKey,
    add_forward,
    record_values,
    stale_eras,
    stale_of_eras,
    teaches,
)
from policies.keys import AGG_INDEX, AGG_PREFIX, STREAM_KEY, desired_k_key
from policies.telemetry import APPLY_ONCE_LUA, Batch, Command, TelemetryStore, apply_once_args


def command(*args: bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%b\r\n" % (len(a), a) for a in args)


class CoalescingTelemetryStore(TelemetryStore):
    """`TelemetryStore` whose batch write sends one increment per (context, field)."""

    def _write(self, batch: Batch) -> None:
        args = apply_once_args(batch, self.config.batch_mark_ttl_s, self._commands(batch))
        script = (b"EVAL", APPLY_ONCE_LUA.encode(), b"1")
        if not self._send(command(*script, *(a if isinstance(a, bytes) else str(a).encode()
                                             for a in args))):
            self.replayed += 1

    def _commands(self, batch: Batch) -> list[Command]:
        """The batch's writes, increments summed per (context, field)."""
        tau = self.config.tau_s
        xadd = (b"XADD", STREAM_KEY.encode(), b"MAXLEN", b"~",
                str(self.config.stream_maxlen).encode(), b"*", b"r")
        commands: list[Command] = []
        sums: dict[str, dict[str, float]] = {}
        stale: dict[str, dict[str, None]] = {}  # per context, ordered and unique
        last: dict[str, tuple[int, int]] = {}  # per context, the last `stale_eras` added
        for rec in batch.records:
            # orjson writes the dataclass itself as `asdict` would, without the deep copy
            commands.append((*xadd, orjson.dumps(rec)))
            if not teaches(rec):
                continue
            context = ContextKey.of(rec).encode()
            fields = sums.get(context)
            if fields is None:
                fields = sums[context] = {}
                stale[context] = {}
            add_forward(fields, record_values(rec), rec.timestamp, tau)
            eras = stale_eras(rec.timestamp, tau)
            if last.get(context) != eras:  # the same eras add no new names
                last[context] = eras
                stale[context].update(dict.fromkeys(stale_of_eras(*eras)))
        for context, fields in sums.items():
            key = (AGG_PREFIX + context).encode()
            commands.extend((b"HINCRBYFLOAT", key, name.encode(), repr(inc).encode())
                            for name, inc in fields.items())
            commands.append((b"HDEL", key, *(name.encode() for name in stale[context])))
            commands.append((b"SADD", AGG_INDEX.encode(), context.encode()))
        for pool, k in batch.desired.items():
            commands.append((b"SET", desired_k_key(pool).encode(), str(k).encode()))
        return commands

    def _send(self, packed: bytes) -> object:
        """One packed command on a connection of the client's pool; its reply."""
        pool = self._client.connection_pool
        connection = pool.get_connection()
        try:
            connection.send_packed_command([packed])
            return connection.read_response()
        except BaseException:
            connection.disconnect()  # its reply may still come: never reuse it
            raise
        finally:
            pool.release(connection)
