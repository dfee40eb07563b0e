#!/usr/bin/env bash
# Set up .venv and run the main job: self-consistency on the embedded local
# model (built on first run), offline. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --extras=transformers,viz
exec .venv/bin/python examples/self_consistency.py "$@"
