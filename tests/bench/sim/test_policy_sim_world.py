"""The simulated world departs from the policy's model where the measurements say it does:
per-prompt acceptance, positional decay, tree saturation, co-batching cost, classifier
errors; the engine baselines follow their engines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.sim.baselines import Learned, first_pool
from bench.sim.calibration import PAPER_K, PAPER_TREE_DEPTH, PROMPT_LOGIT_STD, true_accept
from bench.sim.engine_fleet import (
    SGLANG_ADAPTIVE,
    AdaptiveStepSlot,
    BatchSchedule,
    FixedK,
    SGLangAdaptive,
    simulate_engine,
)
from bench.sim.evaluation import summarize
from bench.sim.measure import measured_priors
from bench.sim.scenarios import EMBEDDED, SGLANG_POOLS, VLLM
from bench.sim.simulator import (
    Phase,
    Running,
    SimConfig,
    Worker,
    default_phases,
    simulate,
    workload,
)
from bench.sim.steplaw import LOAD_ROWS, law
from bench.sim.types import SimRequest
from bench.sim.world import World, positional_length
from policies.acceptance import expected_accept_length
from policies.decision import PolicyConfig
from policies.types import RequestRecord

WORLD = World()


def test_the_class_value_reproduces_the_paper_tau_at_the_paper_depth() -> None:
    for method in ("eagle", "eagle3", "ngram"):
        a = WORLD.class_first_accept(method, "code", "t0")
        tau = expected_accept_length(true_accept(method, "code", "t0"), PAPER_K[method])
        assert abs(positional_length(a, WORLD.decay(method), PAPER_K[method]) - tau) < 1e-3


def test_tree_drafters_saturate_at_their_depth_chains_do_not() -> None:
    depth = PAPER_TREE_DEPTH["eagle2"]
    at_depth = WORLD.expected_accept_length("eagle2", "code", "t0", depth)
    assert WORLD.expected_accept_length("eagle2", "code", "t0", 12) == at_depth
    assert (WORLD.expected_accept_length("eagle", "code", "t0", 8)
            > WORLD.expected_accept_length("eagle", "code", "t0", 5))
    ideal = World.ideal()  # the policy's chain law keeps growing with k
    assert ideal.expected_accept_length("eagle2", "code", "t0", 12) > ideal.expected_accept_length(
        "eagle2", "code", "t0", depth)


def test_per_prompt_acceptance_spreads_by_the_measured_logit_std() -> None:
    rng = np.random.default_rng(0)
    z = WORLD.family_draws(rng, 4000)
    a = np.array([WORLD.prompt_accept("eagle", "chat", "t0", zm, zt) for zm, zt in z])
    logit = np.log(a / (1 - a))
    assert abs(logit.std() - PROMPT_LOGIT_STD["eagle"]) < 0.05
    ngram = np.array([WORLD.prompt_accept("ngram", "chat", "t0", zm, zt) for zm, zt in z])
    assert np.corrcoef(a, ngram)[0, 1] < 0.9  # a prompt easy for one family is not for all


def _running(k: int, index: int) -> Running:
    rec = RequestRecord(model="m", pool="p", method="eagle", k=k, task="code",
                        temperature_bucket="t0", prompt_tokens=10, output_tokens=100,
                        verify_steps=50, accept_length=2.0, load=0, ttft_s=0.0, itl_s=0.0,
                        e2e_s=0.0)
    return Running(100.0, index, "p", 0.0, 0.0, rec, "sglang-eagle1", k, 0.1 * k)


def test_one_request_large_k_slows_the_whole_batch() -> None:
    quiet, loud = Worker(0.015), Worker(0.015)
    for i in range(8):
        quiet.add(_running(0, i))
        loud.add(_running(0, i))
    quiet.add(_running(0, 8))
    loud.add(_running(12, 8))  # same batch size, one request drafting 12 tokens
    assert loud.step_s > quiet.step_s * 1.05  # every plain request in it now steps slower


def test_routers_see_the_classifier_label_and_the_world_the_true_task() -> None:
    phases = (Phase("mix", 3000, (("code", 0.0, 1.0), ("chat", 0.0, 1.0)), 20.0, 20.0),)
    requests = workload(SimConfig(phases, seed=1, world=WORLD))
    wrong = sum(r.label != r.task for r in requests) / len(requests)
    assert 0.0 < wrong < 0.2
    ideal = workload(SimConfig(phases, seed=1, world=World.ideal()))
    assert all(r.label == r.task for r in ideal)


def test_learned_router_runs_at_the_shipped_decay() -> None:
    router = Learned("adaptive", EMBEDDED.fleet)
    assert router.tau_s == PolicyConfig().decay_tau_s
    assert router.store.tau_s == PolicyConfig().decay_tau_s


def test_sglang_adaptive_is_the_0_5_23_source() -> None:
    # DEFAULT_ADAPTIVE_CONFIG: candidate steps and down hysteresis per batch-size key
    assert {key: list(c) for key, (c, _, _) in SGLANG_ADAPTIVE.items()} == {
        1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
    slot = AdaptiveStepSlot(3, (1, 3, 5, 7), 0.0, -0.25)
    for _ in range(10):  # warm-up: 10 verify batches, no decision
        slot.update(6.0)
    assert slot.current_steps == 3
    for _ in range(5):  # the first decision, 5 batches later: the EMA is above 5 - 0.5
        slot.update(6.0)
    assert slot.current_steps == 7 and slot.ema_accept_len > 4.5
    for _ in range(40):  # drafts rejected: steps down to the floor
        slot.update(0.0)
    assert slot.current_steps == 1
    engine = SGLangAdaptive(3)
    assert [engine.steps(b) for b in (1, 7, 8, 31, 32, 64, 200)] == [3, 3, 3, 3, 1, 0, 0]


def test_vllm_schedule_is_a_dense_lookup_by_running_requests() -> None:
    table = BatchSchedule(((1, 4, 5), (9, 16, 2), (17, 64, 1)))
    # 5-8 carry the previous range's k (build_dynamic_sd_schedule_lookup); past the last
    # range its k carries on
    assert [table.steps(b) for b in (1, 4, 5, 8, 9, 16, 17, 64, 100)] == [
        5, 5, 5, 5, 2, 2, 1, 1, 1]


def test_the_world_step_law_is_not_the_policy_cost_form() -> None:
    """At each load the policy fits step = base + per_token * k (linear in k). The
    world's step, per engine, is saturating: the best line through k = 0..8 at a load
    misses it by more than 5% somewhere; the ideal world's (the policy's form) by ~0."""
    ks = np.arange(0, 9)

    def worst_residual(step) -> float:
        y = np.array([step(k) for k in ks])
        fit = np.polyval(np.polyfit(ks, y, 1), ks)
        return float(np.max(np.abs(fit - y) / y))

    for name in ("sglang-h100", "vllm-h100", "embedded-cpu"):
        world_law = law(name)
        misses = [worst_residual(lambda k, b=b, w=world_law: w.step(b, b * (k + 1)))
                  for b in (1, 8, 32, 64)]
        assert max(misses) > 0.05, name
    from bench.sim.calibration import LoadCurve, true_step_s
    curve = LoadCurve("sglang-eagle3")
    for b in (1, 8, 32, 64):
        assert worst_residual(lambda k, b=b: true_step_s("eagle3", k, b, curve, 1.0)) < 1e-9


def test_the_step_law_is_fitted_to_every_published_row() -> None:
    fitted = law("sglang-h100")
    assert 4.0 < fitted.knee < 2048.0 and fitted.per_draft_step > 0  # overhead: per draft forward
    assert {m for m, *_ in LOAD_ROWS["vllm-h100"]} == {"eagle3", "eagle", "draft", "ngram"}


def test_the_prior_is_a_measurement_run_not_the_world_expected_values() -> None:
    """Server pools publish one average over a sample of prompts held apart from the
    traffic; it moves with the measurement's draws, and is never the expected value."""
    a = measured_priors(SGLANG_POOLS, WORLD, "m", seed=0)
    b = measured_priors(SGLANG_POOLS, WORLD, "m", seed=7)
    key = ("m", "eagle3", "code", "t0")
    assert a["eagle3-k3"].acceptance[key] != b["eagle3-k3"].acceptance[key]
    assert a["eagle3-k3"].acceptance == measured_priors(SGLANG_POOLS, WORLD, "m", 0)[
        "eagle3-k3"].acceptance
    from policies.acceptance import invert_method_accept_length
    expected = np.mean([WORLD.expected_accept_length("eagle3", t, bucket, 3)
                        for t in ("code", "chat", "structured") for bucket in ("t0", "thigh")])
    assert a["eagle3-k3"].acceptance[key] != pytest.approx(
        invert_method_accept_length(expected, "eagle3", 3), abs=1e-6)
    embedded = measured_priors(EMBEDDED, WORLD, "m", seed=0)
    assert embedded["eagle"].step_curve and embedded["eagle"].draft_cost is not None


def test_step_level_and_fluid_simulators_agree_on_a_fixed_k_fleet() -> None:
    """The engine baselines run step by step, everything else in the fluid simulator:
    on the same fixed-k fleet they agree within 5% overall."""
    config = SimConfig(default_phases(0.08), seed=3, world=WORLD)
    requests = workload(config)
    for k in (1, 4):
        step = summarize("s", simulate_engine(requests, config, "eagle3", lambda k=k: FixedK(k),
                                              law(VLLM.law)), 4)
        fluid = summarize("f", simulate(first_pool("f", VLLM.homogeneous("eagle3", k)),
                                        config, requests), 4)
        assert step.mean_tokens_per_s == pytest.approx(fluid.mean_tokens_per_s, rel=0.05)


def test_simulated_tokens_per_step_match_the_world_law() -> None:
    """A single request alone on a worker: its accept length is the world's, not E(a, k)."""
    phases = (Phase("one", 400, (("code", 0.0, 1.0),), 0.2, 0.2),)
    config = SimConfig(phases, seed=2, world=World(prompt_spread=False,
                                                    classifier_errors=False))
    requests = workload(config)

    outcomes = simulate(first_pool("x", EMBEDDED.homogeneous("eagle2", 12)), config, requests)
    assert len(outcomes) == len(requests) and all(o.k == 12 for o in outcomes)
    expected = WORLD.expected_accept_length("eagle2", "code", "t0", 12)
    chain = expected_accept_length(true_accept("eagle2", "code", "t0"), 12)
    assert expected < chain - 0.5  # saturation: the chain law would promise much more
    assert math.isfinite(expected)


def _request(index: int) -> SimRequest:
    return SimRequest(index, 0.0, "code", 0.0, "t0", 100, 100, 0, label="chat")


def test_seen_task_is_the_label() -> None:
    assert _request(0).seen_task == "chat"
