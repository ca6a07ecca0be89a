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
python -m pip install --quiet -e '.[embedded,test]'
# the offline distribution (benchmarks, simulator, training) that the tests also cover
python -m pip install --quiet --no-deps -e ./bench
python -m ruff check gateway policies workers specroute bench tests
python -m mypy gateway policies workers specroute
python -m pytest -q -p no:cacheprovider "$@"
