"""Which hot modules the install compiles with mypyc, and whether this process runs them.

`setup.py` builds every module in `COMPILED` into a C extension next to its `.py`
(`pip install -e .` builds them in place; `SPECROUTE_NO_COMPILE=1` skips the build). An
extension module takes precedence over the `.py` of the same name, so where the build
ran, `import gateway.classifier.scorer` loads the compiled one; where it did not (no C
compiler, no mypyc, a module mypyc refused), the `.py` runs, with the same answers
(tests/test_compiled.py compares the two). `log_start` is the gateway's one line on it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# Modules of the request path that mypyc compiles as they are: nothing patches their
# functions or their objects' methods, nothing subclasses their classes in Python (a
# compiled class is a C type). Out, and why: `PoolRouter` (tests and the hot-path bench
# replace its methods on the instance); `policies.decision.Policy` and
# `gateway.routing.slo_aware.SloAware` (the request-walk test wraps their `decide` on the
# class); the adapters' `openai` (its stream; its bodies are `openai_body`'s) and `wire`
# (async generators, which mypyc 2.4 does not compile). `dispatch`, the HTTP endpoints,
# `pools`, `responses` and more compile, but saved 1.6% of a request's CPU for two
# failures only a compiled build shows (Starlette takes a compiled route handler for an
# ASGI app; orjson crashes on a compiled dataclass): docs/PERFORMANCE.md.
COMPILED = (
    "gateway/classifier/scorer.py",
    "gateway/classifier/code_signs.py",
    "gateway/classifier/code_edit.py",
    "gateway/classifier/grounded.py",
    "gateway/classifier/classify.py",
    "gateway/schemas.py",
    "policies/options.py",
    "policies/predictor.py",
    "policies/slo.py",
    "gateway/classifier/features.py",
    "gateway/classifier/prediction.py",
    "gateway/forwarding.py",
    "gateway/http/bodies.py",
    "gateway/picker/exchange.py",
    "gateway/picker/place.py",
    "gateway/picker/reading.py",
    "gateway/tenants/auth.py",
    "gateway/telemetry/prometheus.py",
    "gateway/telemetry/record.py",
    "gateway/telemetry/series.py",
    "gateway/telemetry/tenant_metrics.py",
    "gateway/telemetry/worker_stats.py",
    "gateway/upstream/adapters/reply.py",
    "gateway/upstream/adapters/calls.py",
    "gateway/upstream/http1.py",
    "gateway/http/deadlines.py",
    "gateway/core/admit.py",
    "gateway/upstream/adapters/openai_body.py",
)
NO_COMPILE_ENV = "SPECROUTE_NO_COMPILE"  # "1": install pure Python only
ROOT = Path(__file__).resolve().parent.parent
# what an in-place build compiled: module -> sha256 of its source (written by setup.py)
MANIFEST = ROOT / "build" / "mypyc" / "sources.json"


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extension_path(name: str) -> Path | None:
    """The extension `import name` loads, or None where it loads the `.py` (the module
    is not imported)."""
    spec = importlib.util.find_spec(name)
    origin = Path(spec.origin) if spec is not None and spec.origin else None
    return origin if origin is not None and origin.name.endswith(tuple(EXTENSION_SUFFIXES)) \
        else None


def stale(names: list[str]) -> list[str]:
    """Compiled modules whose `.py` changed since an in-place build: the extension runs the
    old code until `pip install -e .` rebuilds it."""
    if not MANIFEST.exists():
        return []  # an installed wheel: sources and extensions came from one build
    built = json.loads(MANIFEST.read_text())
    out = []
    for name in names:
        found = extension_path(name)
        source = found.parent / (name.rpartition(".")[2] + ".py") if found else None
        if source is not None and source.exists() and built.get(name) != source_digest(source):
            out.append(name)
    return out


def summary() -> tuple[int, str]:
    """(log level, line): how many hot modules run compiled, which run as Python, and
    which compiled ones are older than their source."""
    names = [module_name(path) for path in COMPILED]
    compiled = [name for name in names if extension_path(name) is not None]
    if not compiled:
        return logging.INFO, (f"hot path: pure Python, {len(names)} modules not compiled "
                              f"(no mypyc build, or {NO_COMPILE_ENV}=1)")
    line = f"hot path: {len(compiled)} of {len(names)} modules compiled with mypyc"
    pure = [name for name in names if name not in compiled]
    if pure:
        line += f"; pure Python: {', '.join(pure)}"
    old = stale(compiled)
    if old:
        return logging.WARNING, (f"{line}; STALE, their source changed since the build and "
                                 f"the old code runs (rebuild: pip install -e .): "
                                 f"{', '.join(old)}")
    return logging.INFO, line


def log_start(logger: logging.Logger) -> None:
    level, line = summary()
    logger.log(level, "%s", line)
