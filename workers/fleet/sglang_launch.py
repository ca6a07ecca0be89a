"""Build the `python -m sglang.launch_server` argument list for one pool.

SGLang fixes the speculation shape at launch: there is no per-request `k`. This module
maps specroute's (method, k) onto SGLang 0.5.23's knobs; every flag and rule below was
read from the 0.5.23 wheel (`sglang/srt/arg_groups/fields/*.py` declares the fields,
`arg_utils.py:288-290` turns `field_name` into `--field-name`,
`arg_groups/speculative_hook.py` holds the validation rules).

Mapping (k = draft tokens proposed per verify step; 0 = no speculation):

=========  =======================  ==========================================
method     --speculative-algorithm  knobs
=========  =======================  ==========================================
plain      (not passed)             none
eagle      EAGLE                    num_steps=k, eagle_topk=1, num_draft_tokens=k+1
eagle2     EAGLE                    num_steps=k (tree depth), eagle_topk=topk>1,
                                    num_draft_tokens=budget (default 2k, within
                                    [k+1, topk + (k-1)*topk^2 + 1])
eagle3     EAGLE3                   as eagle (topk 1) or as eagle2 (topk > 1)
ngram      NGRAM                    num_draft_tokens=k+1, ngram_max_bfs_breadth=topk
                                    (default 1: a chain of k), min_bfs_breadth=1
draft      STANDALONE               num_steps=k, eagle_topk=1, num_draft_tokens=k+1,
                                    draft_model_path required
=========  =======================  ==========================================

Why k+1: with topk == 1 SGLang overrides num_draft_tokens to num_steps + 1
(speculative_hook.py:1255-1266), i.e. the verify width counts the root token. NGRAM
sets eagle_topk := ngram_max_bfs_breadth and num_steps := num_draft_tokens // topk
(speculative_hook.py:1309-1330), so the verify width num_draft_tokens is the knob that
bounds its drafts; we use the same k+1 convention. EAGLE-2 (arXiv 2406.16858) builds a
dynamic tree of depth num_steps with topk children per node and verifies the best
num_draft_tokens nodes; EAGLE (arXiv 2401.15077) and EAGLE-3 (arXiv 2503.01840) chains
are the topk == 1 case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.methods import SGLANG_ALGORITHM

SGLANG_VERSION = "0.5.23"

# specroute method name -> SGLang --speculative-algorithm value (policies.methods: the
# SpeculativeAlgorithm enum members, sglang/srt/speculative/spec_info.py:32-47).
METHOD_TO_ALGORITHM = SGLANG_ALGORITHM
DEFAULT_TREE_TOPK = 4  # SGLang's own auto choice for Llama: (steps 5, topk 4, tokens 8)


class LaunchError(ValueError):
    """The pool's method, k or paths cannot be expressed as an SGLang launch."""


@dataclass(frozen=True, slots=True)
class SGLangLaunch:
    """Everything that shapes one SGLang server; `build_sglang_args` turns it into argv.

    `topk` is the tree branching for eagle2/eagle3 and the BFS breadth for ngram;
    `num_draft_tokens` overrides the verify-width budget of tree methods.
    `extra_args` are passed through verbatim after ours (the pool's `launch:` block).
    """

    model_path: str
    method: str = "plain"
    k: int = 0
    host: str = "0.0.0.0"
    port: int = 30000
    tp_size: int = 1
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    served_model_name: str | None = None
    draft_model_path: str | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    enable_metrics: bool = True  # the supervisor's drain reads sglang:num_running_reqs
    api_key: str | None = None  # --api-key: /generate, /v1/* and admin routes need it
    python: str = "python"
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.method not in METHOD_TO_ALGORITHM:
            raise LaunchError(f"method {self.method!r} has no SGLang equivalent; "
                              f"choose one of {', '.join(METHOD_TO_ALGORITHM)}")
        if self.k < 0:
            raise LaunchError(f"k must be >= 0, got {self.k}")
        if self.topk is not None and self.topk < 1:
            raise LaunchError(f"topk must be >= 1, got {self.topk}")
        if self.method == "draft" and self.k > 0 and not self.draft_model_path:
            raise LaunchError("method 'draft' (STANDALONE) needs draft_model_path")
        if self.method in ("eagle", "eagle2", "eagle3") and self.k > 0 \
                and not self.draft_model_path:
            raise LaunchError(f"method {self.method!r} needs draft_model_path "
                              "(the EAGLE head checkpoint)")


def speculative_args(launch: SGLangLaunch) -> list[str]:
    """The --speculative-* flags for the launch's (method, k); empty when k == 0."""
    algorithm = METHOD_TO_ALGORITHM[launch.method]
    k = launch.k
    if algorithm is None or k == 0:
        return []
    args = ["--speculative-algorithm", algorithm]
    if algorithm == "NGRAM":
        breadth = launch.topk or 1
        return args + [
            "--speculative-num-draft-tokens", str(k + 1),
            "--speculative-ngram-min-bfs-breadth", "1",
            "--speculative-ngram-max-bfs-breadth", str(breadth),
        ]
    topk = _eagle_topk(launch)
    draft_tokens = k + 1 if topk == 1 else _tree_budget(launch, topk)
    args += [
        "--speculative-num-steps", str(k),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(draft_tokens),
    ]
    if launch.draft_model_path:
        args += ["--speculative-draft-model-path", launch.draft_model_path]
    return args


def _eagle_topk(launch: SGLangLaunch) -> int:
    if launch.method in ("eagle", "draft"):
        return 1
    if launch.method == "eagle2":
        topk = launch.topk or DEFAULT_TREE_TOPK
        if topk < 2:
            raise LaunchError("eagle2 is the tree variant: topk must be > 1 (use eagle)")
        return topk
    return launch.topk or 1  # eagle3: chain unless a tree is asked for


def _tree_budget(launch: SGLangLaunch, topk: int) -> int:
    """Verify width of a tree: at least a full chain (k+1), at most every tree node + root.

    Step 1 drafts topk candidates, each later step topk*topk of which topk are kept
    (sglang/srt/speculative/spec_utils.py:438-470), so the tree holds
    topk + (k-1)*topk^2 candidates. The default 2k sits near SGLang's Llama choice
    (steps 5, topk 4, tokens 8; speculative_hook.py:1437-1441).
    """
    k = launch.k
    max_nodes = topk + (k - 1) * topk * topk + 1
    budget = launch.num_draft_tokens if launch.num_draft_tokens is not None else 2 * k
    if not k + 1 <= budget <= max_nodes:
        raise LaunchError(f"num_draft_tokens {budget} outside [{k + 1}, {max_nodes}] "
                          f"for depth {k}, topk {topk}")
    return budget


def build_sglang_args(launch: SGLangLaunch) -> list[str]:
    """The full argv: `python -m sglang.launch_server --model-path ... [spec flags] [extra]`."""
    args = [launch.python, "-m", "sglang.launch_server",
            "--model-path", launch.model_path,
            "--host", launch.host,
            "--port", str(launch.port),
            "--tp-size", str(launch.tp_size)]
    if launch.served_model_name:
        args += ["--served-model-name", launch.served_model_name]
    if launch.mem_fraction_static is not None:
        args += ["--mem-fraction-static", str(launch.mem_fraction_static)]
    if launch.max_running_requests is not None:
        args += ["--max-running-requests", str(launch.max_running_requests)]
    if launch.enable_metrics:
        args.append("--enable-metrics")
    if launch.api_key:
        args += ["--api-key", launch.api_key]
    return args + speculative_args(launch) + list(launch.extra_args)


def extra_args_from_mapping(options: Mapping[str, object]) -> tuple[str, ...]:
    """Turn a config `launch:` mapping into flags: `context_length: 8192` ->
    `--context-length 8192`; `true` -> bare flag; `false`/null -> omitted; lists repeat."""
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).lstrip("-").replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, list | tuple):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return tuple(out)
