"""The one registry of speculative methods: every other module reads its facts here.

Per method: the k a pool runs with when its config names none, the most tokens one
verify step can accept for tree drafters, the SGLang `--speculative-algorithm` and the
vLLM `speculative_config.method` that serve it, and whether the embedded engine runs it
(with k per request, which no production engine offers). Sources: SGLang 0.5.23
`sglang/srt/speculative/spec_info.py` (the `SpeculativeAlgorithm` members EAGLE, EAGLE3,
NGRAM, STANDALONE, ...; no Medusa, no lookahead); vLLM 0.33 `vllm/config/speculative.py`
(eagle, eagle3, medusa, mlp_speculator, ngram, draft_model, suffix, ...).

k counts draft tokens per verify step (tree nodes for tree drafters); 0 = plain decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Method(StrEnum):
    PLAIN = "plain"
    NGRAM = "ngram"  # prompt lookup (SGLang NGRAM, vLLM ngram)
    LOOKAHEAD = "lookahead"  # Jacobi n-gram pool (Fu et al. 2024, arXiv 2402.02057)
    MEDUSA = "medusa"  # extra heads (Cai et al. 2024, arXiv 2401.10774)
    EAGLE = "eagle"  # feature-level chain head (arXiv 2401.15077)
    EAGLE2 = "eagle2"  # EAGLE with a dynamic tree (arXiv 2406.16858): SGLang topk > 1
    EAGLE3 = "eagle3"  # arXiv 2503.01840
    DRAFT = "draft"  # a small draft model (SGLang STANDALONE, vLLM draft_model)
    HYBRID = "hybrid"  # per step: n-gram where the context matches, else the EAGLE chain


@dataclass(frozen=True, slots=True)
class MethodFacts:
    default_k: int
    tree_depth: int | None = None  # tree drafters: most draft tokens one step accepts
    sglang_algorithm: str | None = None  # None: SGLang cannot serve it (plain: not passed)
    vllm_method: str | None = None  # None: no vLLM launch is built for it
    embedded: bool = True  # the embedded engine runs it, k per request


METHODS: Mapping[Method, MethodFacts] = {
    Method.PLAIN: MethodFacts(0),
    Method.NGRAM: MethodFacts(6, sglang_algorithm="NGRAM", vllm_method="ngram"),
    Method.LOOKAHEAD: MethodFacts(6, tree_depth=3),
    Method.MEDUSA: MethodFacts(4, tree_depth=4, vllm_method="medusa"),
    Method.EAGLE: MethodFacts(5, sglang_algorithm="EAGLE", vllm_method="eagle"),
    Method.EAGLE2: MethodFacts(8, tree_depth=5, sglang_algorithm="EAGLE"),
    Method.EAGLE3: MethodFacts(4, sglang_algorithm="EAGLE3", vllm_method="eagle3",
                               embedded=False),
    Method.DRAFT: MethodFacts(4, sglang_algorithm="STANDALONE", vllm_method="draft_model"),
    # embedded only (SGLang and vLLM run one method per server); k 3 over 5 on SmolLM2:
    # docs/results/2026-12-06-hybrid.md
    Method.HYBRID: MethodFacts(3),
}
FALLBACK_K = 4  # a method name the registry does not know (a custom SGLang algorithm)

DEFAULT_K: Mapping[str, int] = {str(m): facts.default_k for m, facts in METHODS.items()}
TREE_DEPTH: Mapping[str, int] = {str(m): facts.tree_depth for m, facts in METHODS.items()
                                 if facts.tree_depth is not None}
# specroute method -> SGLang --speculative-algorithm, for the methods SGLang serves
SGLANG_ALGORITHM: Mapping[str, str | None] = {
    str(m): facts.sglang_algorithm for m, facts in METHODS.items()
    if facts.sglang_algorithm is not None or m is Method.PLAIN}
# specroute method -> vLLM speculative_config.method, for the methods launched on vLLM
VLLM_METHOD: Mapping[str, str | None] = {
    str(m): facts.vllm_method for m, facts in METHODS.items()
    if facts.vllm_method is not None or m is Method.PLAIN}


def default_k(method: str) -> int:
    """The k a pool of `method` runs with when its config names none."""
    return DEFAULT_K.get(method, FALLBACK_K)
