#!/usr/bin/env bash
# Start one vLLM OpenAI server (CPU build) on 127.0.0.1:PORT serving the tiny local model made by
# bench/real_engine_setup.sh, in the background; prints its PID, logs to $ROOT/vllm-PORT.log.
# Ready in 25-60 s (curl -s 127.0.0.1:PORT/health). Stop it with: kill PID
#
# Usage: bash bench/real_engine_serve.sh PORT [extra vLLM flags...]
#   bash bench/real_engine_serve.sh 8000 --no-enable-prefix-caching    # live, no KV reuse
#   bash bench/real_engine_serve.sh 8001 --enable-prefix-caching       # a bi-kv candidate
#   bash bench/real_engine_serve.sh 8003 --dtype bfloat16              # a "quantized" stand-in
# Later flags win over the defaults below (float32 keeps greedy answers identical across engines).
# SPIN_S (default 0.01): how long an idle engine busy-polls after each request; vLLM's own 1 s
# burns a core per engine after every request, which on a small machine starves everything else.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-$here/../.real-engine}
ROOT=$(cd "$ROOT" && pwd)
port=${1:?usage: real_engine_serve.sh PORT [vLLM flags...]}; shift
mkdir -p "$ROOT/spin-cap"
cat > "$ROOT/spin-cap/sitecustomize.py" <<'PY'
import importlib.abc, importlib.util, os, sys

_NAME = "vllm.distributed.device_communicators.shm_broadcast"


class _CapSpin(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _NAME:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.SpinCondition.__init__.__defaults__ = (float(os.environ.get("SPIN_S", "0.01")),)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CapSpin())
PY
SPIN_S=${SPIN_S:-0.01} PYTHONPATH="$ROOT/spin-cap${PYTHONPATH:+:$PYTHONPATH}" \
HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 \
nohup "$ROOT/venv/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$ROOT/tiny-llama" --served-model-name tiny-llama \
  --host 127.0.0.1 --port "$port" --max-model-len 2048 --block-size 32 \
  --kv-cache-memory-bytes 268435456 --enable-prompt-tokens-details --dtype float32 "$@" \
  > "$ROOT/vllm-$port.log" 2>&1 &
echo $!
