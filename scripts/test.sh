#!/usr/bin/env bash
# Fresh-machine test run (README command 2, and what .ci/run calls): everything the suites need, then pytest.
# - scripts/setup.sh: system packages, the app's locked .venv, tokenizer, sandbox runtime, Pi
# - scripts/setup_vllm.sh: a real vLLM (CPU) in .vllm-venv + SmolLM2-135M weights, for tests/test_vllm_real.py
# - scripts/setup_openenv.sh: OpenEnv's own client in .openenv-venv, for tests/test_openenv_compat.py
# - scripts/setup_trl.sh: trl + CPU torch + the light client in .trl-venv, for tests/test_trl_adapter.py
# - scripts/setup_docker.sh: docker.io + a dockerd (no bridge) + a debootstrap base image, for the docker backend
# - scripts/setup_ui.sh: Debian chromium, for the browser tests of the UI (tests/test_ui.py)
# Extra arguments go to pytest (e.g. -m "not integration").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm.sh
bash scripts/setup_openenv.sh
bash scripts/setup_trl.sh
bash scripts/setup_docker.sh
bash scripts/setup_ui.sh
trap 'bash scripts/setup_docker.sh stop' EXIT  # stops dockerd only if setup_docker.sh started it
bash scripts/build_standin_images.sh  # stand-in SWE-Gym images of the pypi split (skips those present)
.venv/bin/python -m pytest "$@"
