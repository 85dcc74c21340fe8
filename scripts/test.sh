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
# pytest runs in parallel (pytest-xdist, `--dist loadgroup`): the tests mostly wait on agents, sandboxes, servers
# and docker, so several workers run side by side (2 per core, at most one per 3 GiB of memory, at least 2; or
# PYTEST_XDIST_AUTO_NUM_WORKERS; or -n N among the arguments, -n 0 for a serial run); tests that share a heavy
# resource stay on one worker (tests/conftest.py: GROUPS), and work is handed out longest first by the wall times
# in tests/durations.json where it exists (--record-durations PATH writes one; unknown tests count 1 s each).
# The budget in the open: one line per setup step with its wall time (again as a table before pytest), the worker
# count, and at the end pytest's 15 slowest tests, the 15 test files that took longest, and each worker's busy time
# and idle time at the end (tests/conftest.py).
# Extra arguments go to pytest (e.g. -m "not integration", -n 3; a later --durations or -n wins).
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

bg_names=() bg_pids=() bg_logs=()
bg_step() {  # bg_step NAME COMMAND...: `step` in the background, its output kept in a file until join_steps
  local name=$1 log
  log=$(mktemp "${TMPDIR:-/tmp}/swe-gym-setup-step.XXXXXX")
  step "$@" >"$log" 2>&1 &
  bg_names+=("$name") bg_pids+=($!) bg_logs+=("$log")
}
join_steps() {  # wait for the background steps in the order they started: each one's output, then its wall time
  local i rc line
  for i in "${!bg_pids[@]}"; do
    rc=0
    wait "${bg_pids[$i]}" || rc=$?
    cat "${bg_logs[$i]}"
    line=$(grep '^== setup step: ' "${bg_logs[$i]}" | tail -n 1 || true)
    rm -f "${bg_logs[$i]}"
    if [ "$rc" != 0 ]; then
      echo "== setup step failed: ${bg_names[$i]} (exit $rc)" >&2
      exit "$rc"
    fi
    steps+=("${line#== setup step: } (side by side)")
  done
  bg_names=() bg_pids=() bg_logs=()
}

step setup.sh bash scripts/setup.sh
# the side venvs are independent of each other and of the harnesses: set up side by side (they wait on pip and disk)
bg_step setup_vllm.sh bash scripts/setup_vllm.sh
bg_step setup_openenv.sh bash scripts/setup_openenv.sh
bg_step setup_trl.sh bash scripts/setup_trl.sh
step "swe-gym-env setup --all" .venv/bin/swe-gym-env setup --all
join_steps
docker_was_up=0
docker info >/dev/null 2>&1 && docker_was_up=1
step setup_docker.sh bash scripts/setup_docker.sh
if [ "$docker_was_up" = 0 ]; then  # this run started dockerd: stop it at the end; one already running stays up
  trap 'bash scripts/setup_docker.sh stop' EXIT
fi
step setup_ui.sh bash scripts/setup_ui.sh
step build_standin_images.sh bash scripts/build_standin_images.sh
echo "== setup steps (wall time):"
printf '   %s\n' "${steps[@]}"

cores=$(nproc)
mem_gib=$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo)
workers=$((cores * 2))
[ "$workers" -le $((mem_gib / 3)) ] || workers=$((mem_gib / 3))
[ "$workers" -ge 2 ] || workers=2
workers=${PYTEST_XDIST_AUTO_NUM_WORKERS:-$workers}  # xdist's own override of its worker count
prev=
for a in "$@"; do  # the worker count pytest will use: a later -n wins
  case "$a" in -n[0-9]*) workers=${a#-n} ;; --numprocesses=*) workers=${a#*=} ;; esac
  case "$prev" in -n | --numprocesses) workers=$a ;; esac
  prev=$a
done
echo "== pytest: $workers worker(s) (pytest-xdist, --dist loadgroup; $cores cores, $mem_gib GiB)"
.venv/bin/python -m pytest -n "$workers" --dist loadgroup --durations=15 "$@"
