#!/usr/bin/env bash
# Install specroute with the embedded engine and test tools, check what the layout promises
# (ruff; mypy on the typed layers), then run the whole test suite. Every service the tests
# need (Redis, workers, gateways) is started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e '.[embedded,test]'
python -m ruff check gateway policies workers specroute
python -m mypy gateway policies workers specroute
python -m pytest -q -p no:cacheprovider "$@"
