#!/usr/bin/env bash
# Stand-ins of SWE-Gym task images for the `pypi` split, built offline from the Debian base image of
# scripts/setup_docker.sh: one shared layer (swe-gym-env-standin/base:bookworm: no Node, a Miniconda-shaped
# /opt/miniconda3 whose bin/activate defines `conda`, no pytest on the system Python), then one thin layer per task
# tagged with the row's docker_image (/opt/miniconda3/envs/testbed with the task's test dependencies, the repo at
# /testbed at base_commit). Images whose recipe label matches are skipped, so a CI run builds each once.
# Needs: a docker daemon with the base image (scripts/setup_docker.sh), the pypi split and its local task venvs
# (scripts/setup.sh builds them; the venvs pin what goes into each image). Differences from a real SWE-Gym image:
# tasks/pypi_fixes/README.md.
# usage: scripts/build_standin_images.sh [--force] [--rows FILE.jsonl]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker image inspect "${SWE_GYM_DOCKER_IMAGE:-swe-gym-env/base:bookworm}" >/dev/null 2>&1; then
  echo "no docker daemon or no base image: run scripts/setup_docker.sh first" >&2
  exit 1
fi
exec .venv/bin/python -m swe_gym_env.tasks.pypi_fixes.standin "$@"
