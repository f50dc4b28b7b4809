#!/usr/bin/env bash
# Make the tiny random-weight Qwen2 chat model (and its locally trained tokenizer) with the
# vLLM venv's torch/transformers: scripts/vllm_cpu/make_tiny_model.sh [OUT_DIR] [SEED]
# Another SEED makes another checkpoint of the same model (same tokenizer and shapes, other
# weights): what the weight-reload tests load into a running server, e.g.
#   scripts/vllm_cpu/make_tiny_model.sh ~/.cache/rollout-ray-vllm-cpu/tiny-model-b 4321
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/env.sh"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$VLLM_DIR/cache/hf"
exec "$VLLM_VENV/bin/python" "$HERE/make_tiny_model.py" "${1:-$VLLM_MODEL}" 4096 ${2:+"$2"}
