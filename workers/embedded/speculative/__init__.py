"""Speculative decoding: drafters propose token trees, one shared `verify()` accepts.

Modules: draft (Draft, DecodeState, the Drafter protocol, tree masks), sampling (target
distribution, rejection rule), verify (the shared step), ngram and lookahead (weightless
drafters), medusa (Medusa heads), eagle (EAGLE chain and its head-cache sync), eagle2
(EAGLE-2 dynamic tree), draftmodel (a small draft model), methods (which drafters a
model folder provides).
"""

from workers.embedded.speculative.draft import ROOT, AuxBranch, DecodeState, Draft, Drafter
from workers.embedded.speculative.sampling import Sampler
from workers.embedded.speculative.verify import VerifyResult, verify

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
