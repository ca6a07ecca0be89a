"""Learning on real fixed-k pools: the live vLLM CPU run replayed (docs/results/
2026-12-01-vllm.md: after 50 requests per class the predicted accept length on the n-gram
pool was 2.68 for edits vLLM served at 4.46, 2.55 for code at 1.43, 3.54 for chat at 1.15,
and the n-gram pool's desired k flapped 4 -> 11 -> 4, each relaunch ~93 s).

The replay is closed loop: one plain and one n-gram k 4 vLLM pool of one worker each,
classes in turn (50 edits, 50 code, 50 chat, greedy, 48 tokens) as `specroute bench
vllm` sends them, each request routed by the policy and answered the way vLLM 0.32
answers: `metrics.speculative_decoding` whose `num_spec_steps` counts only the steps
that drafted (prompt lookup finds no match on most steps of an open question) and whose
`mean_acceptance_length` is per drafting step. The record is built by the gateway's own
`verify_steps`; the clock runs at the CPU pools' speed (8-20 tokens/s), so the
telemetry's 300 s decay acts as it did live.
"""

from __future__ import annotations

import random

import pytest

from gateway.telemetry.record import verify_steps
from gateway.telemetry.worker_stats import SpecStats
from policies.decision import Policy, PolicyConfig
from policies.desired_k import DesiredK
from policies.prior import WorkerPrior
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord

TOKENS = 48
PLAIN_TPS = 8.4  # vllm-plain, tokens/s per request (the pinned rows)
# class -> (vLLM mean accept length per drafting step, fraction of decode steps that
# drafted, n-gram tokens/s): edits copy the input (every step finds a match); code and
# chat draft on a third or a quarter of their steps (the pinned rows: 1.43 and 1.14
# tokens a drafting step at plain's speed).
ENGINE = {"edit": (4.46, 1.0, 20.5), "code": (1.43, 0.36, 8.2), "chat": (1.145, 0.27, 8.3)}
RELAUNCH_S = 93.0  # a vLLM CPU drain + relaunch, measured


def views(k: int, down: bool = False) -> list[PoolView]:
    return [PoolView("vllm-plain", "vllm", "plain", 0, False, 1, 0, 0),
            PoolView("vllm-ngram", "vllm", "ngram", k, False, 0 if down else 1, 0, 16)]


def vllm_answer(task: str, rng: random.Random) -> tuple[SpecStats, float]:
    """What vLLM 0.32 reports for one n-gram request (RequestSpecDecodeMetrics.to_dict)
    and its tokens/s: decode steps after the first token, a share of them drafting."""
    mean, drafting, tps = ENGINE[task]
    mean *= rng.uniform(0.9, 1.1)
    accepted_per_step = min(mean - 1.0, 4.0)
    # tokens = 1 (prefill) + spec_steps * (1 + accepted) + plain steps
    spec_steps = max(round((TOKENS - 1) * drafting / (1 + accepted_per_step * drafting)), 1)
    accepted = min(round(spec_steps * accepted_per_step), TOKENS - 1 - spec_steps)
    spec = SpecStats(verify_steps=spec_steps, accept_length=1.0 + accepted / spec_steps,
                     accept_rate=accepted / (4 * spec_steps), correct_drafts=accepted,
                     proposed_drafts=4 * spec_steps)
    return spec, tps * rng.uniform(0.9, 1.1)


def record(pool: PoolView, task: str, spec: SpecStats, tps: float, now: float
           ) -> RequestRecord:
    steps = verify_steps(spec, pool.k, TOKENS)
    e2e = TOKENS / tps
    return RequestRecord(
        model="smollm2", pool=pool.name, method=pool.method, k=pool.k, task=task,
        temperature_bucket="t0", prompt_tokens=120, output_tokens=TOKENS,
        verify_steps=steps, accept_length=spec.accept_length or 1.0, load=0,
        ttft_s=e2e / max(steps or TOKENS, 1), itl_s=0.0, e2e_s=e2e, workers=1,
        timestamp=now)


def profile(task: str) -> RequestProfile:
    return RequestProfile(task=task, temperature=0.0, top_p=1.0, prompt_tokens=120,  # type: ignore[arg-type]
                          max_tokens=TOKENS, stream=False, model="smollm2")


def replay(prior: WorkerPrior | None, per_class: int = 50, explore_rate: float = 0.0
           ) -> tuple[Policy, dict, list]:
    clock = [0.0]
    config = PolicyConfig(explore_rate=explore_rate, relaunch_cost_s=RELAUNCH_S)
    policy = Policy(LocalTelemetry(config.decay_tau_s, clock=lambda: clock[0]), config)
    if prior is not None:
        policy.set_worker_prior("vllm-ngram", prior)
    rng = random.Random(11)
    k, down_until, published = 4, -1.0, []
    observed: dict[tuple[str, str], list[float]] = {}
    next_refit = 0.0
    for task in ENGINE:
        for _ in range(per_class):
            if clock[0] >= down_until and down_until > 0:
                k, down_until = policy.store.desired_k["vllm-ngram"], -1.0  # type: ignore[attr-defined]
            pools = views(k, down=clock[0] < down_until)
            decision = policy.decide(profile(task), pools)
            pool = next(p for p in pools if p.name == decision.pool)
            if pool.method == "plain":
                spec, tps = SpecStats(), PLAIN_TPS * rng.uniform(0.9, 1.1)
            else:
                spec, tps = vllm_answer(task, rng)
            clock[0] += TOKENS / tps + 0.2
            policy.observe(record(pool, task, spec, tps, clock[0]))
            observed.setdefault((task, pool.name), []).append(spec.accept_length or 1.0)
            while next_refit <= clock[0]:  # the learner thread: one refit a second
                policy.refit()
                next_refit += config.refit_interval_s
                wished = policy.store.desired_k.get("vllm-ngram")  # type: ignore[attr-defined]
                if wished is not None and (not published or published[-1] != wished):
                    published.append(wished)
                if wished not in (None, k) and down_until < 0:
                    down_until = clock[0] + RELAUNCH_S  # the supervisor drains, relaunches
    clock[0] += 2.5
    policy.refit()
    return policy, observed, published


@pytest.mark.parametrize("explore_rate", [0.0, 0.02], ids=["greedy", "shipped-exploration"])
@pytest.mark.parametrize("prior", [
    None,  # vLLM publishes nothing about itself: the flat prior
    # a registration prior of one figure for every class (the pool's mixed average)
    WorkerPrior.from_server_average("smollm2", "ngram", 2.3, 4),
], ids=["flat-prior", "server-average-prior"])
def test_predicted_accept_length_within_20_percent_after_50_requests(
        prior: WorkerPrior | None, explore_rate: float) -> None:
    policy, observed, published = replay(prior, explore_rate=explore_rate)
    checked = 0
    for (task, pool_name), lengths in observed.items():
        if pool_name != "vllm-ngram" or len(lengths) < 5:
            continue
        pools = [p for p in views(policy.store.desired_k.get("vllm-ngram", 4))  # type: ignore[attr-defined]
                 if p.name == pool_name]
        predicted = policy.predict(profile(task), pools).predicted_accept_length
        engine = sum(lengths) / len(lengths)  # vLLM's own mean, as the bench reads it
        assert abs(predicted - engine) <= 0.2 * engine, (task, predicted, engine)
        checked += 1
    assert checked >= 2  # edits and at least one of code/chat had 5+ on n-gram
    # edits go to n-gram (2.4x plain), never to plain
    assert policy.predict(profile("edit"), views(4)).pool == "vllm-ngram"
    # no flapping: the published k never leaves 4 and comes back (at most one change)
    assert len(published) <= 2 and published[:1] in ([], [4])


def test_vllm_counts_only_drafting_steps_and_the_record_counts_them_all() -> None:
    """tokens / num_spec_steps read chat at ~3.5 tokens a step; the steps are tokens less
    the accepted drafts (prefill included, as SGLang's spec_verify_ct counts them)."""
    spec, _ = vllm_answer("chat", random.Random(0))
    assert TOKENS / spec.verify_steps > 3.0  # what the policy used to learn
    steps = verify_steps(spec, 4, TOKENS)
    assert steps == TOKENS - spec.correct_drafts
    assert 1.0 <= TOKENS / steps <= spec.accept_length
    # an engine whose steps already cover its tokens (SGLang, embedded) is left alone
    sglang = SpecStats(verify_steps=12, accept_length=4.0, correct_drafts=36,
                       proposed_drafts=48)
    assert verify_steps(sglang, 4, 48) == 12


def test_the_prior_does_not_win_its_weight_back_as_the_telemetry_decays() -> None:
    """50 edits, then 20 minutes of other traffic: the decayed count falls below the
    prior's weight, the undecayed one does not."""
    clock = [0.0]
    policy = Policy(LocalTelemetry(300.0, clock=lambda: clock[0]), PolicyConfig(explore_rate=0))
    pools = views(4)
    policy.decide(profile("edit"), pools)
    for _ in range(50):
        clock[0] += 2.5
        policy.observe(RequestRecord(
            model="smollm2", pool="vllm-ngram", method="ngram", k=4, task="edit",
            temperature_bucket="t0", prompt_tokens=120, output_tokens=48, verify_steps=11,
            accept_length=48 / 11, load=0, ttft_s=0.1, itl_s=0.05, e2e_s=2.4, workers=1,
            timestamp=clock[0]))
    clock[0] += 1200.0
    state = policy.refit()
    a, n = state.accept("smollm2", "ngram", "edit", "t0")
    assert n < 5.0  # decayed below the prior's weight
    # the prior keeps 5 / (50 + 5) of the estimate (was 5 / (n + 5): about half, 2.9)
    assert state.accept_length(a, "ngram", 4) == pytest.approx(48 / 11, rel=0.1)


class Terms:
    desired_k_gain = 0.05
    relaunch_cost_s = 10.0
    relaunch_payback_s = 100.0
    relaunch_min_samples = 20.0
    refit_interval_s = 1.0
    k_trust_margin: int | None = 2


def test_a_relaunch_is_not_undone_within_its_payback_horizon() -> None:
    """A pool relaunched on a wish keeps its new k for relaunch_payback_s, whatever the
    next wish, and no k past the trust region is ever asked for."""
    clock = [0.0]
    store = LocalTelemetry(1e6, clock=lambda: clock[0])
    policy = Policy(store, PolicyConfig(explore_rate=0))
    publisher = DesiredK(Terms())
    pool = PoolView("ngram", "vllm", "ngram", 2, False, 1, 0, 16)
    policy.decide(profile("edit"), [pool])

    def feed(k: int, accept_length: float, n: int = 30) -> None:
        for _ in range(n):
            store.record(RequestRecord(
                model="smollm2", pool="ngram", method="ngram", k=k, task="edit",
                temperature_bucket="t0", prompt_tokens=120, output_tokens=100,
                verify_steps=round(100 / accept_length), accept_length=accept_length,
                load=0, ttft_s=0.01, itl_s=0.01, e2e_s=1.0, workers=1, timestamp=clock[0]))

    feed(2, 2.95)  # a ~ 0.99: more drafts pay
    asked = []
    for _ in range(20):
        publisher.publish(store, policy.refit(), {"ngram": pool}, lambda p: 1.0)
        asked.append(store.desired_k["ngram"])
    assert max(asked) == 4  # the trust region: measured k 2 + 2, not 16
    pool = PoolView("ngram", "vllm", "ngram", 4, False, 1, 0, 16)  # relaunched at 4
    feed(4, 1.3, n=200)  # and k 4 turns out poor: the model now wants 2 again
    for _ in range(60):
        publisher.publish(store, policy.refit(), {"ngram": pool}, lambda p: 1.0)
        assert store.desired_k["ngram"] == 4  # within the payback horizon: kept
