"""Speculative decoding: drafters propose token trees, one shared `verify()` accepts.

Modules: draft (Draft, DecodeState, the Drafter protocol, tree masks), chain (a chain
from an autoregressive drafter), sampling (target distribution, rejection rule), result
(VerifyResult), verify (the shared step), ngram and lookahead (weightless drafters),
medusa (Medusa heads), eagle (EAGLE chain and its head-cache sync), eagle2 (EAGLE-2
dynamic tree), hybrid (n-gram where the context matches, else the EAGLE chain),
draft_model (a small draft model), methods (which drafters a model folder provides).
Network weights for the drafters are in `drafter_models`.
"""

from workers.embedded.speculative.draft import ROOT, AuxBranch, DecodeState, Draft, Drafter
from workers.embedded.speculative.result import VerifyResult
from workers.embedded.speculative.sampling import Sampler
from workers.embedded.speculative.verify import verify

__all__ = [
    "ROOT",
    "AuxBranch",
    "DecodeState",
    "Draft",
    "Drafter",
    "Sampler",
    "VerifyResult",
    "verify",
]
