#!/usr/bin/env bash
# Install specroute with the embedded engine, then run the whole local stack (`specroute up`:
# Redis, one embedded worker per method, the gateway on http://127.0.0.1:8000). Arguments
# go to `specroute up` (e.g. `--model tiny`, `--engine vllm`).
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first, so that the install below finds it satisfied: an environment that has a
# torch keeps it; otherwise 2.13.0 (on a machine with a local wheel folder, its CPU build;
# from PyPI, its default build). Without a GPU, a CPU build is enough and much smaller:
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
python -c 'import torch' 2>/dev/null || python -m pip install --quiet 'torch==2.13.0'
# compiles the hot path in place too (setup.py; SPECROUTE_NO_COMPILE=1 keeps pure Python);
# the gateway says at start which build runs
python -m pip install --quiet -e '.[embedded]'
exec specroute up "$@"
