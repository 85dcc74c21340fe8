#!/usr/bin/env bash
# Fresh-machine test run (README command 2, and what .ci/run calls): everything the suites need, then pytest.
# - scripts/setup.sh: system packages, the app's locked .venv, tokenizer, sandbox runtime, Pi (the demo's setup)
# - swe-gym-env setup --all: every other harness (npm + its bundle) and the pypi split with its task venvs, which a
#   server would otherwise install on a rollout's first use
# - scripts/setup_vllm.sh: a real vLLM (CPU) in .vllm-venv + SmolLM2-135M weights, for tests/test_vllm_real.py
# - scripts/setup_openenv.sh: OpenEnv's own client in .openenv-venv, for tests/test_openenv_compat.py
# - scripts/setup_trl.sh: trl + CPU torch + the light client in .trl-venv, for tests/test_trl_adapter.py
# - scripts/setup_docker.sh: docker.io + a dockerd (no bridge) + a debootstrap base image, for the docker backend
# - scripts/setup_ui.sh: Debian chromium, for the browser tests of the UI (tests/test_ui.py)
# - scripts/build_standin_images.sh: stand-in SWE-Gym images of the pypi split (skips those present)
# The budget in the open: one line per setup step with its wall time (again as a table before pytest), and pytest's
# 15 slowest tests at the end. Extra arguments go to pytest (e.g. -m "not integration"; a later --durations wins).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=()
step() {  # step NAME COMMAND...: run it, print and keep its wall time
  local name=$1 t0 us
  shift
  t0=${EPOCHREALTIME//[!0-9]/}  # microseconds
  "$@"
  us=$((${EPOCHREALTIME//[!0-9]/} - t0))
  steps+=("$(printf '%-26s %5d.%ds' "$name" $((us / 1000000)) $((us / 100000 % 10)))")
  echo "== setup step: ${steps[-1]}"
}

step setup.sh bash scripts/setup.sh
step "swe-gym-env setup --all" .venv/bin/swe-gym-env setup --all
step setup_vllm.sh bash scripts/setup_vllm.sh
step setup_openenv.sh bash scripts/setup_openenv.sh
step setup_trl.sh bash scripts/setup_trl.sh
step setup_docker.sh bash scripts/setup_docker.sh
step setup_ui.sh bash scripts/setup_ui.sh
trap 'bash scripts/setup_docker.sh stop' EXIT  # stops dockerd only if setup_docker.sh started it
step build_standin_images.sh bash scripts/build_standin_images.sh
echo "== setup steps (wall time):"
printf '   %s\n' "${steps[@]}"
.venv/bin/python -m pytest --durations=15 "$@"
