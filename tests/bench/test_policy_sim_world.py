"""The simulated world departs from the policy's model where the measurements say it does:
per-prompt acceptance, positional decay, tree saturation, co-batching cost, classifier
errors; the engine baselines follow their engines."""

from __future__ import annotations

import math

import numpy as np

from bench.sim.baselines import (
    SGLANG_TIERS,
    BatchSizeTable,
    Learned,
    SimRequest,
)
from bench.sim.calibration import PAPER_K, PAPER_TREE_DEPTH, PROMPT_LOGIT_STD, true_accept
from bench.sim.scenarios import EMBEDDED
from bench.sim.simulator import Phase, Running, SimConfig, Worker, simulate, workload
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


def test_engine_baselines_follow_their_engines() -> None:
    # sglang 0.5.23 DEFAULT_ADAPTIVE_CONFIG: candidate steps per batch-size key
    assert {edge: steps for edge, steps, _ in SGLANG_TIERS} == {
        1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
    table = BatchSizeTable("vllm-table", EMBEDDED.homogeneous("eagle", 3))
    assert [table.worker_k(0, b) for b in (1, 64, 65, 128, 129)] == [3, 3, 1, 1, 0]


def test_simulated_tokens_per_step_match_the_world_law() -> None:
    """A single request alone on a worker: its accept length is the world's, not E(a, k)."""
    phases = (Phase("one", 400, (("code", 0.0, 1.0),), 0.2, 0.2),)
    config = SimConfig(phases, seed=2, world=World(prompt_spread=False,
                                                    classifier_errors=False))
    requests = workload(config)

    class Fixed(BatchSizeTable):
        def worker_k(self, worker: int, batch: int) -> int:
            return 12

    outcomes = simulate(Fixed("x", EMBEDDED.homogeneous("eagle2", 12)), config, requests)
    assert len(outcomes) == len(requests) and all(o.k == 12 for o in outcomes)
    expected = WORLD.expected_accept_length("eagle2", "code", "t0", 12)
    chain = expected_accept_length(true_accept("eagle2", "code", "t0"), 12)
    assert expected < chain - 0.5  # saturation: the chain law would promise much more
    assert math.isfinite(expected)


def _request(index: int) -> SimRequest:
    return SimRequest(index, 0.0, "code", 0.0, "t0", 100, 100, 0, label="chat")


def test_seen_task_is_the_label() -> None:
    assert _request(0).seen_task == "chat"
