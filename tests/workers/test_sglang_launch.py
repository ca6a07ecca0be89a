"""SGLang launch arguments: every flag exists in SGLang 0.5.23 and each method maps
onto the knobs (and the validation rules) of that version."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from workers.fleet.sglang_launch import (
    SGLANG_VERSION,
    LaunchError,
    SGLangLaunch,
    build_sglang_args,
    extra_args_from_mapping,
)

# Read from the sglang-0.5.23 wheel. Fields are declared in
# sglang/srt/arg_groups/fields/*.py and become `--field-name` via
# sglang/srt/arg_groups/arg_utils.py:288-290 (none of these has a cli_name override).
SGLANG_0_5_23_FLAGS = {
    "--model-path",  # fields/model.py:51 (alias --model)
    "--host",  # fields/serving.py:65
    "--port",  # fields/serving.py:66
    "--served-model-name",  # fields/serving.py:168
    "--tp-size",  # fields/parallel.py:45 (alias --tensor-parallel-size)
    "--mem-fraction-static",  # fields/schedule.py:27
    "--max-running-requests",  # fields/schedule.py:31
    "--enable-metrics",  # fields/observability.py:70 (bool -> store_true)
    "--api-key",  # arg_groups/fields/serving.py:160
    "--context-length",  # fields/model.py:110
    "--trust-remote-code",  # fields/model.py:106
    "--speculative-algorithm",  # fields/spec.py:31
    "--speculative-draft-model-path",  # fields/spec.py:36
    "--speculative-num-steps",  # fields/spec.py:58
    "--speculative-eagle-topk",  # fields/spec.py:62
    "--speculative-num-draft-tokens",  # fields/spec.py:66
    "--speculative-ngram-min-bfs-breadth",  # fields/spec.py:252
    "--speculative-ngram-max-bfs-breadth",  # fields/spec.py:256
    "--speculative-ngram-max-trie-depth",  # fields/spec.py:264
}
# SpeculativeAlgorithm enum, sglang/srt/speculative/spec_info.py:39-47
SGLANG_0_5_23_ALGORITHMS = {"DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP",
                            "STANDALONE", "NGRAM"}

ALL_METHODS = [
    SGLangLaunch(model_path="/m", method="plain", k=0),
    SGLangLaunch(model_path="/m", method="eagle", k=3, draft_model_path="/d"),
    SGLangLaunch(model_path="/m", method="eagle2", k=5, topk=4, num_draft_tokens=8,
                 draft_model_path="/d"),
    SGLangLaunch(model_path="/m", method="eagle3", k=4, draft_model_path="/d"),
    SGLangLaunch(model_path="/m", method="ngram", k=6, topk=2),
    SGLangLaunch(model_path="/m", method="draft", k=4, draft_model_path="/d",
                 mem_fraction_static=0.8, max_running_requests=32, served_model_name="x",
                 extra_args=extra_args_from_mapping({"context_length": 4096,
                                                     "trust_remote_code": True})),
]


def flags(args: list[str]) -> dict[str, str | None]:
    """argv -> {flag: value or None for bare flags}."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_version_pinned() -> None:
    assert SGLANG_VERSION == "0.5.23"


@pytest.mark.parametrize("launch", ALL_METHODS, ids=lambda spec: spec.method)
def test_every_flag_exists_in_sglang(launch: SGLangLaunch) -> None:
    args = build_sglang_args(launch)
    assert args[:3] == ["python", "-m", "sglang.launch_server"]
    got = flags(args)
    assert set(got) <= SGLANG_0_5_23_FLAGS
    if "--speculative-algorithm" in got:
        assert got["--speculative-algorithm"] in SGLANG_0_5_23_ALGORITHMS


def test_eagle_chain_uses_steps_k_topk_1_and_k_plus_1_tokens() -> None:
    got = flags(build_sglang_args(ALL_METHODS[1]))
    assert got["--speculative-algorithm"] == "EAGLE"
    # speculative_hook.py:1255-1266 forces num_draft_tokens = num_steps + 1 when topk == 1
    assert (got["--speculative-num-steps"], got["--speculative-eagle-topk"],
            got["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert got["--speculative-draft-model-path"] == "/d"


def test_eagle2_tree_budget() -> None:
    got = flags(build_sglang_args(ALL_METHODS[2]))
    assert (got["--speculative-algorithm"], got["--speculative-num-steps"],
            got["--speculative-eagle-topk"], got["--speculative-num-draft-tokens"]) == \
        ("EAGLE", "5", "4", "8")
    default = flags(build_sglang_args(SGLangLaunch(model_path="/m", method="eagle2", k=3,
                                                   draft_model_path="/d")))
    assert (default["--speculative-eagle-topk"], default["--speculative-num-draft-tokens"]) \
        == ("4", "6")
    with pytest.raises(LaunchError):  # more tokens than the tree has nodes: 2 + 1*4 + 1
        build_sglang_args(SGLangLaunch(model_path="/m", method="eagle2", k=2, topk=2,
                                       num_draft_tokens=8, draft_model_path="/d"))
    with pytest.raises(LaunchError):
        build_sglang_args(SGLangLaunch(model_path="/m", method="eagle2", k=2, topk=1,
                                       draft_model_path="/d"))


def test_eagle3_chain_and_tree() -> None:
    chain = flags(build_sglang_args(ALL_METHODS[3]))
    assert (chain["--speculative-algorithm"], chain["--speculative-eagle-topk"],
            chain["--speculative-num-draft-tokens"]) == ("EAGLE3", "1", "5")
    tree = flags(build_sglang_args(SGLangLaunch(model_path="/m", method="eagle3", k=4, topk=3,
                                                draft_model_path="/d")))
    assert (tree["--speculative-eagle-topk"], tree["--speculative-num-draft-tokens"]) == \
        ("3", "8")


def test_ngram_bounds_drafts_with_verify_width() -> None:
    got = flags(build_sglang_args(ALL_METHODS[4]))
    assert got["--speculative-algorithm"] == "NGRAM"
    assert got["--speculative-num-draft-tokens"] == "7"
    assert got["--speculative-ngram-max-bfs-breadth"] == "2"
    assert "--speculative-num-steps" not in got  # derived by SGLang (hook.py:1324-1330)
    assert "--speculative-draft-model-path" not in got


def test_standalone_and_passthrough_options() -> None:
    got = flags(build_sglang_args(ALL_METHODS[5]))
    assert (got["--speculative-algorithm"], got["--speculative-num-steps"],
            got["--speculative-eagle-topk"], got["--speculative-num-draft-tokens"]) == \
        ("STANDALONE", "4", "1", "5")
    assert got["--mem-fraction-static"] == "0.8"
    assert got["--context-length"] == "4096"
    assert got["--trust-remote-code"] is None and "--enable-metrics" in got


def test_k_zero_and_plain_launch_without_speculation() -> None:
    for launch in (ALL_METHODS[0], SGLangLaunch(model_path="/m", method="eagle", k=0)):
        assert not any(a.startswith("--speculative") for a in build_sglang_args(launch))


@pytest.mark.parametrize("kwargs", [
    {"method": "medusa", "k": 3},  # SGLang has no Medusa
    {"method": "eagle", "k": 3},  # no EAGLE head given
    {"method": "draft", "k": 3},  # no draft model given
    {"method": "ngram", "k": -1},
])
def test_inexpressible_launches_are_refused(kwargs: dict) -> None:
    with pytest.raises(LaunchError):
        SGLangLaunch(model_path="/m", **kwargs)


# -- vLLM 0.33.0 (workers/fleet/vllm_launch.py) --
# --host/--port: vllm/entrypoints/common/cli_args.py:293-296 (FrontendArgs);
# --tensor-parallel-size: engine/arg_utils.py:1209; --served-model-name: 1031;
# --gpu-memory-utilization: 1389; --speculative-config: 1866;
# --per-request-spec-decode-metrics: 1694 (choices none|summary|detailed, line 746).
VLLM_0_33_FLAGS = {"--host", "--port", "--tensor-parallel-size", "--served-model-name",
                   "--gpu-memory-utilization", "--speculative-config",
                   "--per-request-spec-decode-metrics"}
# SpeculativeMethod literal, vllm/config/speculative.py:71-82 (subset we emit)
VLLM_0_33_METHODS = {"ngram", "draft_model", "eagle", "eagle3", "medusa"}


@pytest.mark.parametrize("method,draft", [("plain", None), ("eagle", "/d"), ("eagle3", "/d"),
                                          ("ngram", None), ("draft", "/d"), ("medusa", "/d")])
def test_vllm_flags_and_speculative_config(method: str, draft: str | None) -> None:
    import json

    from workers.fleet.vllm_launch import VLLM_VERSION, VLLMLaunch, build_vllm_args

    assert VLLM_VERSION == "0.33.0"
    args = build_vllm_args(VLLMLaunch(model_path="/m", method=method, k=3,
                                      draft_model_path=draft, gpu_memory_utilization=0.9))
    assert args[:3] == ["vllm", "serve", "/m"]
    got = flags(args)
    assert set(got) <= VLLM_0_33_FLAGS
    if method == "plain":
        assert "--speculative-config" not in got
        return
    spec = json.loads(got["--speculative-config"])
    assert spec["method"] in VLLM_0_33_METHODS and spec["num_speculative_tokens"] == 3
    assert spec.get("model") == draft
    assert got["--per-request-spec-decode-metrics"] == "summary"
    if method == "ngram":
        assert spec["prompt_lookup_min"] == 1 <= spec["prompt_lookup_max"]


def test_vllm_refuses_what_it_cannot_run() -> None:
    from workers.fleet.vllm_launch import VLLMLaunch, VLLMLaunchError

    for kwargs in ({"method": "eagle2", "k": 3}, {"method": "eagle", "k": 3},
                   {"method": "medusa", "k": 3}):  # Medusa needs its heads
        with pytest.raises(VLLMLaunchError):
            VLLMLaunch(model_path="/m", **kwargs)


# Every launch the supervisor can build: each method at every k 1..8 (chains and trees).
EVERY_LAUNCH = [ALL_METHODS[0], SGLangLaunch(model_path="/m", method="eagle", k=0)] + [
    launch for k in range(1, 9) for launch in (
        SGLangLaunch(model_path="/m", method="eagle", k=k, draft_model_path="/d"),
        SGLangLaunch(model_path="/m", method="eagle3", k=k, draft_model_path="/d"),
        SGLangLaunch(model_path="/m", method="eagle3", k=k, topk=3, draft_model_path="/d"),
        SGLangLaunch(model_path="/m", method="ngram", k=k),
        SGLangLaunch(model_path="/m", method="ngram", k=k, topk=2),
        SGLangLaunch(model_path="/m", method="draft", k=k, draft_model_path="/d"),
    )] + [SGLangLaunch(model_path="/m", method="eagle2", k=k, topk=4, draft_model_path="/d")
          for k in range(2, 9)] + ALL_METHODS[1:]
# Runs in SGLang's own environment: its parser and `ServerArgs` (with its __post_init__
# checks) on each argv; prints what SGLang made of the speculation flags.
PARSE_WITH_SGLANG = """
import json, sys
from sglang.srt.server_args import prepare_server_args
out = []
for argv in json.load(sys.stdin):
    args = prepare_server_args(argv)
    out.append([args.model_path, args.speculative_algorithm, args.speculative_num_steps,
                args.speculative_eagle_topk, args.speculative_num_draft_tokens,
                args.speculative_draft_model_path])
print(json.dumps(out))
"""


def test_sglang_own_parser_and_server_args_accept_every_launch() -> None:
    """SGLang 0.5.23 itself (its `prepare_server_args`) takes every argv we build and reads
    the speculation we meant. scripts/test.sh builds the environment it runs in (sglang
    without its GPU dependencies) and names it in SPECROUTE_SGLANG_PYTHON; elsewhere the
    test is skipped, in CI it must run."""
    python = os.environ.get("SPECROUTE_SGLANG_PYTHON")
    if not python:
        if os.environ.get("SPECROUTE_REQUIRE_SGLANG"):
            pytest.fail("SPECROUTE_REQUIRE_SGLANG is set but SPECROUTE_SGLANG_PYTHON is not")
        pytest.skip("no SGLang environment (scripts/test.sh builds one)")
    argvs = [build_sglang_args(launch)[3:] for launch in EVERY_LAUNCH]
    done = subprocess.run([python, "-c", PARSE_WITH_SGLANG], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(parsed) == len(EVERY_LAUNCH)
    for launch, argv, (model, algorithm, steps, topk, tokens, draft) in zip(
            EVERY_LAUNCH, argvs, parsed, strict=True):
        got = flags(argv)
        assert model == "/m"
        if launch.k == 0 or launch.method == "plain":
            assert algorithm is None, argv
            continue
        assert algorithm == got["--speculative-algorithm"], argv
        assert tokens == int(got["--speculative-num-draft-tokens"]), argv
        if launch.method == "ngram":
            assert tokens == launch.k + 1  # SGLang derives its steps from the width
            continue
        assert (steps, topk) == (launch.k, int(got["--speculative-eagle-topk"])), argv
        assert draft == "/d"
        if topk == 1:
            assert tokens == launch.k + 1, argv
