"""Supervisor with real server processes and a real Redis: launch, register, drain and
relaunch on a new desired k, restart after a crash, deregister on stop, and the CLI.

The server under supervision is a command template (`WORKER_TEMPLATE`); by default this
module's own tiny HTTP worker (run as `python tests/e2e/test_supervisor.py --port P --k K`).
Set SPECROUTE_SUPERVISOR_TEST_COMMAND to supervise something else, e.g. EMBEDDED_TEMPLATE.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from workers.models import BUNDLED_MODEL_DIR  # noqa: E402

STUB_TEMPLATE = f"{{python}} {ROOT / 'tests/sglang_stub.py'} --port {{port}} --k {{k}}"
EMBEDDED_TEMPLATE = ("{python} -m specroute.cli worker --method plain --port {port} "
                     "--num-speculative-tokens {k} --model {model}")
BUILTIN_TEMPLATE = f"{{python}} {Path(__file__).resolve()} --port {{port}} --k {{k}}"
WORKER_TEMPLATE = os.environ.get("SPECROUTE_SUPERVISOR_TEST_COMMAND", BUILTIN_TEMPLATE)
FAILING_K = 13  # the builtin worker refuses to start with this k
HANGING_K = 14  # its first start with this k hangs (marked in $SPECROUTE_TEST_HANG_MARK)


def reported_k(base_url: str) -> int:
    info = httpx.get(f"{base_url}/server_info", timeout=5).json()
    for key in ("speculative_num_steps", "num_speculative_tokens", "k"):
        if info.get(key) is not None:
            return int(info[key])
    if info.get("speculative_num_draft_tokens") is not None:  # chain: k + 1 (tests/sglang_stub.py)
        return int(info["speculative_num_draft_tokens"]) - 1
    raise AssertionError(f"/server_info reports no k: {info}")


def wait_in_flight(base_url: str, timeout: float = 30.0) -> None:
    """Until the worker's /server_info counts a running request (not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = httpx.get(f"{base_url}/server_info", timeout=5).json()
        if any(s.get("num_running_reqs", 0) >= 1 for s in info.get("internal_states", [])):
            return
        time.sleep(0.02)
    raise AssertionError(f"no request in flight at {base_url} after {timeout} s")


def pid_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True  # exited, waiting to be reaped by its parent
        time.sleep(0.05)
    return False


# -- the fixtures use workers.*, imported lazily so the module also runs as a server --
@pytest.fixture
def make_supervisor(redis_url: str, tmp_path: Path):
    from policies.fleet import FleetPool
    from tests.conftest import free_port
    from workers.fleet.launch import command_builder
    from workers.fleet.supervisor import Supervisor, SupervisorSettings

    made = []

    def make(k: int = 2, measured: str | None = None, **overrides: float):
        port = free_port()
        pool = FleetPool(name="eagle", engine="sglang", method="eagle", k=k, model="tiny",
                          model_path=str(BUNDLED_MODEL_DIR), measured=measured)
        options = dict(min_relaunch_interval_s=0.0, health_timeout_s=60.0,
                       drain_notice_s=0.0, drain_timeout_s=10.0, drain_grace_s=0.5,
                       restart_backoff_s=0.2, registration_ttl_s=3.0, stop_timeout_s=5.0)
        settings = SupervisorSettings(url=f"http://127.0.0.1:{port}", port=port,
                                      log_path=tmp_path / f"server-{port}.log",
                                      **{**options, **overrides})
        sup = Supervisor(pool, redis_url, command_builder(pool, WORKER_TEMPLATE), settings)
        made.append(sup)
        return sup

    yield make
    for sup in made:
        sup.stop()


def test_launch_registers_with_ttl(make_supervisor, redis_url: str) -> None:
    import redis

    from policies.keys import worker_key
    from workers.fleet.registry import list_workers

    sup = make_supervisor(k=2)
    sup.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = worker_key("eagle", sup.settings.url)
    assert 0 < client.pttl(key) <= 3000
    [worker] = list_workers(client, "eagle")
    assert (worker.k, worker.pid, worker.draining) == (2, sup.process.pid, False)
    assert reported_k(sup.settings.url) == 2
    assert sup.poll_once() == "idle"


def test_the_registration_carries_the_pools_measured_file(make_supervisor, redis_url: str,
                                                         tmp_path: Path) -> None:
    """A pool's `measured` file (what its servers measured about themselves) goes into
    the worker's registry entry, where the gateway reads it as the pool's prior."""
    import redis

    from tests.policies.test_planner_benchmarked import EAGLE3, document
    from workers.fleet.registry import list_workers

    path = tmp_path / "measured.json"
    path.write_text(json.dumps(document(EAGLE3)))
    sup = make_supervisor(k=2, measured=str(path))
    sup.start()
    [worker] = list_workers(redis.Redis.from_url(redis_url), "eagle")
    assert worker.measured == document(EAGLE3)


def test_desired_k_change_drains_then_relaunches(make_supervisor, redis_url: str) -> None:
    import redis

    from policies.keys import desired_k_key
    from workers.fleet.registry import list_workers

    sup = make_supervisor(k=2)
    sup.start()
    old_pid = sup.process.pid
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(desired_k_key("eagle"), "2")
    assert sup.poll_once() == "idle"  # equal k: nothing to do

    slow: dict[str, object] = {}

    def long_request() -> None:
        resp = httpx.post(f"{sup.settings.url}/generate", json={"sleep": 1.0}, timeout=10)
        slow["status"], slow["done_at"] = resp.status_code, time.monotonic()

    thread = threading.Thread(target=long_request)
    thread.start()
    wait_in_flight(sup.settings.url)
    client.set(desired_k_key("eagle"), "5")
    assert sup.poll_once() == "relaunched"
    thread.join(10)
    assert slow["status"] == 200  # the drain waited for it instead of cutting it
    assert pid_gone(old_pid)
    assert reported_k(sup.settings.url) == 5
    [worker] = list_workers(client, "eagle")
    assert (worker.k, worker.pid, worker.draining) == (5, sup.process.pid, False)
    assert sup.poll_once() == "idle"


def test_one_server_of_a_model_relaunches_at_a_time(make_supervisor, redis_url: str) -> None:
    """Two servers of one pool and a new desired k: the second keeps serving (held) while
    the first relaunches, then relaunches itself; a relaunch never takes both down."""
    import redis

    from policies.keys import desired_k_key, fleet_move_key

    first, second = make_supervisor(k=2), make_supervisor(k=2)
    first.start()
    second.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(desired_k_key("eagle"), "5")
    client.set(fleet_move_key("tiny"), '{"url": "elsewhere"}', ex=60)  # another is restarting
    assert (first.poll_once(), second.poll_once()) == ("held", "held")
    assert reported_k(first.settings.url) == reported_k(second.settings.url) == 2
    client.delete(fleet_move_key("tiny"))
    assert first.poll_once() == "relaunched"
    assert client.get(fleet_move_key("tiny")) is None  # given back
    assert second.poll_once() == "relaunched"
    assert reported_k(first.settings.url) == reported_k(second.settings.url) == 5


def test_relaunch_held_by_min_interval(make_supervisor, redis_url: str) -> None:
    import redis

    from policies.keys import desired_k_key

    sup = make_supervisor(k=2, min_relaunch_interval_s=60.0)
    sup.start()
    redis.Redis.from_url(redis_url).set(desired_k_key("eagle"), "4")
    assert sup.poll_once() == "held"
    assert reported_k(sup.settings.url) == 2


def test_k_that_fails_to_start_falls_back(make_supervisor, redis_url: str) -> None:
    import redis

    from policies.keys import desired_k_key
    from workers.fleet.registry import list_workers

    if WORKER_TEMPLATE != BUILTIN_TEMPLATE:
        pytest.skip("needs the builtin worker's refusal to start")
    sup = make_supervisor(k=3)
    sup.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(desired_k_key("eagle"), str(FAILING_K))
    assert sup.poll_once() == "failed"
    assert reported_k(sup.settings.url) == 3
    assert [w.k for w in list_workers(client, "eagle")] == [3]
    assert sup.poll_once() == "idle"  # the failed k is not retried in a loop


def test_a_start_that_hangs_is_tried_again(make_supervisor, redis_url: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """A server that neither serves nor exits within health_timeout_s is killed and started
    again at the same k; the k is kept, not given up; the log says what the hung server's
    processes were waiting on."""
    import redis

    from policies.keys import desired_k_key
    from workers.fleet.registry import list_workers

    if WORKER_TEMPLATE != BUILTIN_TEMPLATE:
        pytest.skip("needs the builtin worker's hanging start")
    monkeypatch.setenv("SPECROUTE_TEST_HANG_MARK", str(tmp_path / "hung-once"))
    sup = make_supervisor(k=3, health_timeout_s=3.0)
    sup.start()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.set(desired_k_key("eagle"), str(HANGING_K))
    with caplog.at_level(logging.WARNING, logger="workers.fleet.supervisor"):
        assert sup.poll_once() == "relaunched"
    assert (tmp_path / "hung-once").exists()  # the first start did hang
    hung = [r.getMessage() for r in caplog.records if "its processes" in r.getMessage()]
    assert len(hung) == 1 and " S " in hung[0] and f"--k {HANGING_K}" in hung[0]  # asleep
    assert sup.launches == 3  # k 3, the hung start at k 14, the one that served
    assert reported_k(sup.settings.url) == HANGING_K
    assert [w.k for w in list_workers(client, "eagle")] == [HANGING_K]


def test_crashed_server_is_restarted(make_supervisor, redis_url: str) -> None:
    import redis

    from workers.fleet.registry import list_workers

    sup = make_supervisor(k=3)
    sup.start()
    old_pid = sup.process.pid
    os.killpg(old_pid, signal.SIGKILL)
    sup.process.wait(5)
    assert sup.poll_once() == "backoff"
    time.sleep(0.3)
    assert sup.poll_once() == "restarted"
    assert sup.process.pid != old_pid
    assert reported_k(sup.settings.url) == 3
    [worker] = list_workers(redis.Redis.from_url(redis_url), "eagle")
    assert (worker.pid, worker.draining) == (sup.process.pid, False)



def test_relaunches_a_real_embedded_worker_on_a_k_change(redis_url: str, tmp_path: Path) -> None:
    """The whole loop with the real engine: the policy's key changes, the supervisor drains
    a real `specroute worker` (an in-flight generation completes), relaunches it with the
    new k, and the new server reports and uses that k."""
    import redis

    from policies.fleet import FleetPool
    from policies.keys import desired_k_key
    from tests.conftest import free_port
    from workers.fleet.launch import command_builder
    from workers.fleet.registry import list_workers
    from workers.fleet.supervisor import Supervisor, SupervisorSettings

    port = free_port()
    pool = FleetPool(name="ngram", engine="embedded", method="ngram", k=2, model="tiny",
                     model_path=str(BUNDLED_MODEL_DIR))
    settings = SupervisorSettings(url=f"http://127.0.0.1:{port}", port=port,
                                  log_path=tmp_path / "server.log", min_relaunch_interval_s=0.0,
                                  health_timeout_s=90.0, drain_notice_s=0.0,
                                  drain_timeout_s=60.0, drain_grace_s=0.5,
                                  registration_ttl_s=3.0, stop_timeout_s=10.0)
    template = ("{python} -m specroute.cli worker --method ngram --port {port} "
                "--num-speculative-tokens {k} --model {model}")
    sup = Supervisor(pool, redis_url, command_builder(pool, template), settings)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        sup.start()
        assert reported_k(settings.url) == 2
        done: dict[str, object] = {}

        def generate() -> None:
            body = {"text": "def parse(line):\n", "sampling_params": {
                "max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
            resp = httpx.post(f"{settings.url}/generate", json=body, timeout=60)
            done["status"], done["tokens"] = resp.status_code, len(resp.json()["output_ids"])

        thread = threading.Thread(target=generate)
        thread.start()
        wait_in_flight(settings.url)
        client.set(desired_k_key("ngram"), "5")
        assert sup.poll_once() == "relaunched"
        thread.join(60)
        assert done == {"status": 200, "tokens": 400}  # drained, not cut
        assert reported_k(settings.url) == 5
        [worker] = list_workers(client, "ngram")
        assert (worker.k, worker.draining) == (5, False)
        resp = httpx.post(f"{settings.url}/generate", timeout=60, json={
            "text": "x = 1\nx = 1\nx = 1\n", "sampling_params": {"max_new_tokens": 24,
                                                                "temperature": 0}})
        assert resp.json()["meta_info"]["spec_accept_length"] <= 6  # at most k + 1 per step
    finally:
        sup.stop()

def test_stop_deregisters_and_ends_the_server(make_supervisor, redis_url: str) -> None:
    import redis

    from workers.fleet.registry import list_workers

    sup = make_supervisor(k=1)
    sup.start()
    pid = sup.process.pid
    sup.stop()
    assert list_workers(redis.Redis.from_url(redis_url), "eagle") == []
    assert pid_gone(pid)


def test_cli_supervise_runs_until_sigterm(redis_url: str, tmp_path: Path) -> None:
    import redis
    import yaml

    from tests.conftest import free_port, start_process, stop_process
    from workers.fleet.registry import list_workers

    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"redis_url": redis_url, "pools": [
        {"name": "ngram", "engine": "sglang", "method": "ngram", "k": 4, "model": "tiny",
         "workers": [f"http://127.0.0.1:{port}"]}]}))
    proc = start_process(["-m", "specroute.cli", "supervise", "--config", str(config),
                          "--pool", "ngram", "--command", WORKER_TEMPLATE,
                          "--port", str(port)], tmp_path / "supervise.log")
    client = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 60
        while not (workers := list_workers(client, "ngram")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert (workers[0].url, workers[0].k) == (f"http://127.0.0.1:{port}", 4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        stop_process(proc)
    assert list_workers(client, "ngram") == []
    assert pid_gone(workers[0].pid)


def test_in_flight_reads_sglang_metrics() -> None:
    from workers.fleet.supervisor import in_flight_requests

    text = ('# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{model_name="m"} 3.0\n'
            'sglang:num_queue_reqs{model_name="m"} 2.0\nsglang:num_used_tokens 99\n')

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=text)
        return httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert in_flight_requests("http://w", client) == 5
        text = 'vllm:num_requests_running{engine="0"} 1.0\nvllm:num_requests_waiting 4.0\n'
        assert in_flight_requests("http://w", client) == 5
        text = "nothing_known 1\n"
        assert in_flight_requests("http://w", client) is None


# -- the builtin worker: /health, /server_info (k, in-flight count), slow /generate --
def _serve(port: int, k: int) -> None:
    if k == FAILING_K:
        sys.exit(3)
    mark = Path(os.environ.get("SPECROUTE_TEST_HANG_MARK", "/nonexistent/mark"))
    if k == HANGING_K and mark.parent.is_dir() and not mark.exists():
        mark.touch()
        time.sleep(3600)  # hung: no /health, no exit (killed by the supervisor)
    lock, running = threading.Lock(), [0]

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path == "/health":
                self._reply({})
            elif self.path == "/server_info":
                self._reply({"speculative_num_steps": k, "pid": os.getpid(),
                             "internal_states": [{"num_running_reqs": running[0]}]})
            else:
                self.send_error(404)

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                running[0] += 1
            time.sleep(float(body.get("sleep", 0.0)))
            with lock:
                running[0] -= 1
            self._reply({"text": "ok", "meta_info": {"completion_tokens": 1}})

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    cli = parser.parse_args()
    _serve(cli.port, cli.k)
