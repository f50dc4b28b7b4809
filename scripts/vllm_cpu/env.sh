# Sourced by the scripts in scripts/vllm_cpu/: where the separate vLLM environment lives.
# Everything (venv, tiny model, caches, temp files) stays under one directory, outside the
# project's .venv: vLLM pins its own torch/transformers.
# Override with ROLLOUT_RAY_VLLM_DIR (the test reads the same variable).
VLLM_DIR=${ROLLOUT_RAY_VLLM_DIR:-$HOME/.cache/rollout-ray-vllm-cpu}
VLLM_VENV=$VLLM_DIR/venv
VLLM_MODEL=$VLLM_DIR/tiny-model
VLLM_VERSION=${ROLLOUT_RAY_VLLM_VERSION:-0.32.0}
