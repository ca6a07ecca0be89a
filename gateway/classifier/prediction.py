"""The drafter predictor on the classifier's path: the loaded model, and the profile
fields it gives a request (policies/predictor.py; features: gateway/classifier/
features.py).

A predictor file that cannot be read is not a classifier failure: the request keeps its
class and routes by the class's acceptance (no prediction, scale 1), logged once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from policies.predictor import Fields, Predictor

log = logging.getLogger("specroute.gateway")
NO_PREDICTION: Fields = ((), (), ())

_PREDICTOR: Predictor | None = None
_FAILED = False


def load_predictor(path: Path | str | None = None) -> Predictor:
    """Load (and cache for `classify`) the drafter predictor; the shipped one by default."""
    global _PREDICTOR, _FAILED
    _PREDICTOR, _FAILED = Predictor.load(path), False
    return _PREDICTOR


def cached_predictor() -> Predictor | None:
    """The loaded predictor, loading the shipped one on first use; None if it cannot be
    read (tried once)."""
    global _FAILED
    if _PREDICTOR is None and not _FAILED:
        try:
            return load_predictor()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _FAILED = True
            log.warning("drafter predictor not loaded (%s): routing by class acceptance",
                        type(exc).__name__)
    return _PREDICTOR


def profile_fields(predictor: Predictor | None, task: str, features: tuple[float, ...]
                   ) -> Fields:
    """`RequestProfile.predicted_accept`, `drafter_scales` and `pooled_scales` for a
    request."""
    if predictor is None:
        return NO_PREDICTION
    return predictor.profile_fields(task, features)
