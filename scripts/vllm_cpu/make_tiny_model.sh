#!/usr/bin/env bash
# Make the tiny random-weight Qwen2 chat model (and its locally trained tokenizer) with the
# vLLM venv's torch/transformers: scripts/vllm_cpu/make_tiny_model.sh [OUT_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$VLLM_DIR/cache/hf"
exec "$VLLM_VENV/bin/python" "$HERE/make_tiny_model.py" "${1:-$VLLM_MODEL}"
