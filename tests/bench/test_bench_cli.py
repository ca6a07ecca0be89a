"""`specroute bench NAME`: each bench has its own options and help."""

from __future__ import annotations

import importlib

import pytest

from specroute.cli import BENCH_MODULES, BENCHES, build_parser


def help_of(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_each_bench_lists_only_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    live = help_of("bench", "live", capsys=capsys)
    assert "--warmup" in live and "--classes" in live
    assert "--fleet" not in live and "--minutes" not in live and "--peers" not in live
    policy = help_of("bench", "policy", capsys=capsys)
    assert "--fleet" in policy and "--warmup" not in policy


def test_an_option_of_another_bench_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["bench", "soak", "--fleet"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --fleet" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_every_bench_parses_with_its_defaults(name: str) -> None:
    args = build_parser().parse_args(["bench", name, "--quick"])
    assert args.target == name and args.quick and not args.json
    for flag in BENCHES[name][1]:
        assert hasattr(args, flag.removeprefix("--").replace("-", "_"))
    # the module `_bench` runs for it (bench/<purpose>/<module>.py) imports and has a main
    assert callable(importlib.import_module(f"bench.{BENCH_MODULES[name]}").main)
