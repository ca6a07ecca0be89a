"""`specroute bench live` keeps a run when a server loses its port, and reports what it
measured when a stack is lost.

A stack's servers bind ports picked free a moment before; another process can take one
in between (`[Errno 98] address already in use` ended a 12-minute run with nothing
printed, issue 42). Here a real process tries to bind a port this test holds: the stack
is started again on a fresh port. And a run whose second replicate loses its stack prints
the first replicate's ratios, marked incomplete, in the table and in `--json`."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import bench.live.fleets as fleets_module
import bench.live.run as run_module
from bench.live.fleets import ADAPTIVE, BIND_RETRIES, Fleet, Record, Stack
from bench.live.run import StackLost
from specroute.cli import build_parser
from workers.processes import free_port

CODE_ASSISTANT = ("code/t0", "edit/t0", "chat/t0")

FAKE_UP = """
import http.server, sys
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
if sys.argv[2] == "broken":
    sys.exit("specroute up: no model here")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


@pytest.fixture
def held() -> Iterator[int]:
    """A port another process holds (listening), as when a picked port is taken."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _stack(tmp_path: Path, mode: str = "serve") -> Stack:
    script = tmp_path / "fake_up.py"
    script.write_text(FAKE_UP)
    fleet = Fleet("2xngram", ("ngram", "ngram"), ())
    return Stack(fleet, "embedded", None, tmp_path / "work",
                 command=lambda port, work: [sys.executable, str(script), str(port), mode])


def test_a_stack_whose_server_could_not_bind_starts_again_on_a_fresh_port(
        tmp_path: Path, held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = iter([held])
    monkeypatch.setattr(fleets_module, "free_port", lambda: next(ports, None) or free_port())
    stack = _stack(tmp_path)
    try:
        stack.launch(timeout=30)
        assert stack.attempts == 2 and stack.port != held and stack.alive()
        first = (tmp_path / "work" / "up-attempt1.log").read_text()
        assert "Address already in use" in first  # the lost start's log is kept
    finally:
        stack.stop()


def test_a_stack_that_fails_for_another_reason_is_not_retried(tmp_path: Path) -> None:
    stack = _stack(tmp_path, "broken")
    try:
        with pytest.raises(RuntimeError, match="no model here"):
            stack.launch(timeout=30)
        assert stack.attempts == 1
    finally:
        stack.stop()


def test_bind_failures_are_retried_a_bounded_number_of_times(
        tmp_path: Path, held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleets_module, "free_port", lambda: held)
    stack = _stack(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="Address already in use"):
            stack.launch(timeout=30)
        assert stack.attempts == BIND_RETRIES + 1
    finally:
        stack.stop()


def _served(group: list[Fleet], replicate: int, concurrency: tuple[int, ...]) -> list[Record]:
    """Every configuration of `group` on 2 prompts per class and fold of the code
    assistant's classes; the adaptive fleet 1.2x in replicate 0, 1.1x in replicate 1."""
    out = []
    for conc in concurrency:
        for n, cls in enumerate(CODE_ASSISTANT):
            for i in range(4):
                for fleet in group:
                    for config in fleet.configs:
                        rate = (120 - 10 * replicate) if config.name == ADAPTIVE else 100
                        out.append(Record(replicate, conc, fleet.name, config.name, cls, i % 2,
                                          10 * n + i, rate, 1.0, "embedded-ngram", 2))
    return out


def test_a_run_that_loses_a_stack_reports_what_it_measured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Replicate 0 measured in full; replicate 1's stack stops after c = 1: the report and
    the JSON carry replicate 0 at both concurrencies and replicate 1 at c = 1."""
    def run_fleets(group, settings, prompts, replicate, workdir, started, progress=None):
        work = workdir / f"r{replicate}-{group[0].name}"
        work.mkdir(parents=True)
        (work / "config.yaml").write_text("pools: [{model: tiny}]\n")
        if replicate == 1:
            raise StackLost("replicate 1, fleets adaptive, 2xngram: stack 2xngram stopped "
                            "while measuring c=2", _served(group, 1, (1,)))
        audits = [{"fleet": f.name, "replicate": replicate, "adaptive_requests": 0,
                   "learned_from": 0, "pinned": 0, "clean": True} for f in group]
        return _served(group, replicate, settings.concurrency), audits

    monkeypatch.setattr(run_module, "run_fleets", run_fleets)
    monkeypatch.setattr(run_module, "groups", lambda order, engine: [order])
    monkeypatch.setattr(run_module, "available_cores", lambda: list(range(8)))  # c = 2 fair
    records = tmp_path / "records.json"
    args = build_parser().parse_args([
        "bench", "live", "--model", "tiny", "--methods", "plain,ngram", "--homogeneous",
        "ngram", "--ks", "1,2", "--classes", ",".join(CODE_ASSISTANT), "--per-class", "4",
        "--replicates", "2", "--concurrency", "1,2", "--warmup", "0",
        "--workdir", str(tmp_path / "w"), "--records", str(records), "--json"])
    assert run_module.main(args) == 1  # incomplete: not a success
    out = capsys.readouterr()
    table, line = out.out.strip().rsplit("\n", 1)
    assert "INCOMPLETE: replicate 1, fleets adaptive, 2xngram: stack 2xngram stopped" in table
    assert "### concurrency 1" in table and "### concurrency 2" in table
    got = json.loads(line)
    assert got["incomplete"].startswith("replicate 1")
    cells = got["embedded"]["code assistant"]
    # c = 1: both replicates (1.2x and 1.1x); c = 2: replicate 0 alone
    assert cells["1"]["by_replicate"] == {"0": [1.2, 1.2], "1": [1.1, 1.1]}
    assert cells["1"]["interval"]["replicates"] == 2 and cells["1"]["vs_best_homogeneous"][0] \
        == pytest.approx(1.15, abs=1e-3)
    assert cells["2"]["by_replicate"] == {"0": [1.2, 1.2]}
    # the k's the run left out are named (the adaptive gateway may pick ngram k 3..16)
    assert got["ks_missing"]["ngram"][0] == 3 and "--ks leaves out" in out.err
    saved = json.loads(records.read_text())["records"]
    assert {(r["replicate"], r["concurrency"]) for r in saved} == {(0, 1), (0, 2), (1, 1)}
