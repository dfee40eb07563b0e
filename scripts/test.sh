#!/usr/bin/env bash
# Set up everything (Debian packages, .venv with all extras), type-check the
# package and run the whole test suite, slow tests included. Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --system
export OUTLINES_CACHE_DIR="${OUTLINES_CACHE_DIR:-$PWD/.cache/outlines}"
.venv/bin/python -m mypy outlines --no-error-summary
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
