"""`specroute bench slo` on a small run: with SLO-awareness on, the high-priority tenant
keeps its SLO while lower-priority work waits or is shed; off, it does not."""

from __future__ import annotations

from bench.gateway.slo import run, table


def test_slo_bench_ordering() -> None:
    rows = {(r["mode"], r["tenant"]): r for r in run(duration_s=8.0, seed=0)}
    print(table(list(rows.values())))
    on, off = rows[("on", "interactive")], rows[("off", "interactive")]
    assert on["shed"] == 0  # the top priority is never the one shed
    assert on["attainment"] > off["attainment"]
    assert on["attainment"] >= rows[("on", "batch")]["attainment"]
    assert rows[("on", "batch")]["shed"] > 0  # overload ends in shedding the lowest priority
    assert on["p95_ttft_s"] < off["p95_ttft_s"]
    assert all(r["shed"] == r["shed_with_retry_after"] for r in rows.values())
