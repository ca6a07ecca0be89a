"""`decide` (event loop) and `refit` (learner thread) share no mutable map: new pools
(discovery) arrive through decide while the learner thread iterates the pools it knows."""

from __future__ import annotations

import sys
import threading

from policies.decision import Policy, PolicyConfig
from policies.telemetry import LocalTelemetry
from policies.types import PoolView
from tests.policies.test_policy_decide import PROFILE


def test_decide_and_refit_share_no_mutable_pool_map() -> None:
    policy = Policy(LocalTelemetry(), PolicyConfig(explore_rate=0.0))
    errors: list[BaseException] = []
    stop = threading.Event()

    def refits() -> None:
        while not stop.is_set():
            try:
                policy.refit()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    learner = threading.Thread(target=refits)
    learner.start()
    try:
        for i in range(3000):
            views = [PoolView(f"p{i}-{j}", "sglang", "eagle", 3, False, 1, 0) for j in range(4)]
            policy.decide(PROFILE, views)
            if errors:
                break
    finally:
        stop.set()
        learner.join()
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
