"""Admission (gateway/routing/admission.py) and the SLO choice (policies/slo.py): deadline order,
reserved slots, shedding lower priorities before a higher one misses, bounded queues, and
which option a tenant gets under load."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gateway.config import AdmissionConfig, TenantConfig
from gateway.errors import RateLimited
from gateway.routing.admission import Admission
from policies.slo import SloOption, SloTarget, choose

INTERACTIVE = TenantConfig("interactive", slo_ttft_ms=500, slo_tpot_ms=50, priority=10)
STANDARD = TenantConfig("standard", slo_ttft_ms=300, slo_tpot_ms=100, priority=5)
BATCH = TenantConfig("batch", slo_ttft_ms=30_000, slo_tpot_ms=500, priority=0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def admission(workers: int = 1, **config: object) -> tuple[Admission, Clock]:
    clock = Clock()
    pools = {"p": SimpleNamespace(healthy_workers=workers, outstanding=0)}
    settings = {"max_inflight_per_worker": 1, "reserved_slots": 0, **config}
    return Admission(AdmissionConfig(**settings), pools, clock=clock), clock  # type: ignore[arg-type]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_earliest_deadline_first_priority_breaks_ties() -> None:
    gate, clock = admission()
    running = await gate.enter("p", BATCH, clock())
    order: list[str] = []

    async def wait(tenant: TenantConfig, name: str) -> None:
        ticket = await gate.enter("p", tenant, clock())
        order.append(name)
        gate.leave(ticket)

    twin = TenantConfig("twin", slo_ttft_ms=500, slo_tpot_ms=50, priority=1)
    tasks = [asyncio.create_task(wait(t, n)) for t, n in
             ((BATCH, "batch"), (twin, "twin"), (INTERACTIVE, "interactive"))]
    await settle()
    assert gate.depth("p") == 3
    gate.leave(running)
    await asyncio.gather(*tasks)
    assert order == ["interactive", "twin", "batch"]  # same deadline: priority first


async def test_without_slo_awareness_the_queue_is_first_come_first_served() -> None:
    gate, clock = admission(slo_aware=False)
    running = await gate.enter("p", BATCH, clock())
    order: list[str] = []

    async def wait(tenant: TenantConfig) -> None:
        ticket = await gate.enter("p", tenant, clock())
        order.append(tenant.name)
        gate.leave(ticket)

    tasks = [asyncio.create_task(wait(t)) for t in (BATCH, STANDARD, INTERACTIVE)]
    await settle()
    gate.leave(running)
    await asyncio.gather(*tasks)
    assert order == ["batch", "standard", "interactive"]


async def test_a_reserved_slot_keeps_room_for_the_higher_priority() -> None:
    gate, clock = admission(workers=2, reserved_slots=1)
    gate.leave(await gate.enter("p", INTERACTIVE, clock()))  # a higher priority, just seen
    held = await gate.enter("p", BATCH, clock())
    waiting = asyncio.create_task(gate.enter("p", BATCH, clock()))
    await settle()
    assert not waiting.done() and gate.depth("p") == 1  # the last slot is reserved
    interactive = await gate.enter("p", INTERACTIVE, clock())  # and takes it at once
    assert interactive.queued_s == 0
    gate.leave(interactive)
    await settle()
    assert not waiting.done()
    clock.now += 60  # the interactive tenant went quiet: no reserve any more
    gate.leave(held)
    await settle()
    assert waiting.done()
    gate.leave(waiting.result())


async def test_lower_priority_is_shed_before_a_higher_one_misses() -> None:
    gate, clock = admission()
    done = await gate.enter("p", BATCH, clock())
    clock.now += 1.0
    gate.leave(done)  # the pool's mean slot time is now 1 s
    running = await gate.enter("p", BATCH, clock())
    batch = asyncio.create_task(gate.enter("p", BATCH, clock()))
    standard = asyncio.create_task(gate.enter("p", STANDARD, clock()))
    await settle()
    interactive = asyncio.create_task(gate.enter("p", INTERACTIVE, clock()))
    await settle()
    # the standard request (earlier deadline, lower priority) stood ahead of it: shed
    with pytest.raises(RateLimited) as info:
        await standard
    assert info.value.code == "overloaded" and info.value.retry_after_s >= 1
    assert not batch.done()  # behind it: it waits
    gate.leave(running)
    ticket = await interactive
    assert ticket.tenant is INTERACTIVE
    gate.leave(ticket)
    gate.leave(await batch)


async def test_a_full_queue_sheds_its_worst_and_a_long_wait_is_shed() -> None:
    gate, clock = admission(max_queue=1, max_wait_s=0.2)
    running = await gate.enter("p", BATCH, clock())
    batch = asyncio.create_task(gate.enter("p", BATCH, clock()))
    await settle()
    interactive = asyncio.create_task(gate.enter("p", INTERACTIVE, clock()))
    await settle()
    with pytest.raises(RateLimited):
        await batch  # evicted for the higher priority
    with pytest.raises(RateLimited, match="no slot within"):
        await interactive  # max_wait_s (real time) passed with the slot still held
    assert gate.depth("p") == 0
    gate.leave(running)


async def test_a_client_that_leaves_gives_its_place_up() -> None:
    gate, clock = admission()
    running = await gate.enter("p", BATCH, clock())
    waiting = asyncio.create_task(gate.enter("p", BATCH, clock()))
    await settle()
    waiting.cancel()
    await settle()
    assert gate.depth("p") == 0
    gate.leave(running)
    assert gate.queues["p"].running == 0


async def test_a_tenant_over_its_concurrency_cap_gets_429_others_do_not() -> None:
    """`max_concurrency` counts a tenant's requests admitted or waiting on this process:
    one tenant cannot hold every slot and queue place of a replica."""
    gate, clock = admission(workers=2, max_inflight_per_worker=1)
    capped = TenantConfig("capped", max_concurrency=3)
    first = await gate.enter("p", capped, clock())
    await gate.enter("p", capped, clock())  # both slots taken
    queued = asyncio.ensure_future(gate.enter("p", capped, clock()))  # waits: the 3rd
    await settle()
    with pytest.raises(RateLimited) as refused:
        await gate.enter("p", capped, clock())
    assert refused.value.code == "concurrency_limit" and refused.value.status == 429
    assert refused.value.retry_after_s > 0
    other = asyncio.ensure_future(gate.enter("p", STANDARD, clock()))  # others still queue
    await settle()
    assert not other.done() and gate.tenant_in_flight["capped"] == 3
    queued.cancel()  # the waiting one gives up: its count comes back
    await settle()
    assert gate.tenant_in_flight["capped"] == 2
    gate.leave(first)  # a slot frees: the other tenant's request starts
    await settle()
    assert other.done() and gate.tenant_in_flight["capped"] == 1


def test_slo_choice() -> None:
    eagle = SloOption("eagle", "eagle", 3, tokens_per_s=40, accept_length=2.5)
    plain = SloOption("plain", "plain", 0, tokens_per_s=20, accept_length=1.0)
    latency = SloTarget("interactive", 500, 30, 10)
    batch = SloTarget("batch", 30_000, 500, 0)
    kept = choose(eagle, [eagle, plain], latency)
    assert kept.option == eagle and not kept.changed and kept.meets
    # the policy picked plain, which misses a 30 ms TPOT: the fastest that meets
    faster = choose(plain, [eagle, plain], latency)
    assert faster.option == eagle and faster.kind == "faster" and "misses" in faster.reason
    # under load with higher-priority work on the eagle pool, batch yields to plain
    busy_eagle = SloOption("eagle", "eagle", 3, 40, 2.5, busy=True, higher_priority=2)
    yielded = choose(busy_eagle, [busy_eagle, plain], batch)
    assert yielded.option == plain and yielded.kind == "yielded" and "yields" in yielded.reason
    # nothing meets a 5 ms TPOT: the cheapest, so the miss takes no headroom
    tight = SloTarget("batch", 30_000, 5, 0)
    assert choose(busy_eagle, [busy_eagle, plain], tight).option == plain
    # the top priority does not yield to itself
    top = SloTarget("interactive", 500, 50, 10)
    alone = SloOption("eagle", "eagle", 3, 40, 2.5, busy=True, higher_priority=0)
    assert choose(alone, [alone, plain], top).option == alone
