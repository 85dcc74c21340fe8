#!/usr/bin/env bash
# TRL beside the app, for tests/test_trl_adapter.py (client/trl_adapter.py driven by GRPOTrainer). Idempotent.
#
# `.trl-venv/` at the repo root: its own virtual environment, what a trainer machine gets:
# - torch==2.13.0+cpu, which pip takes from local disk (find-links; PyPI has no "+cpu" build, so where the file
#   is missing this fails instead of downloading a CUDA build). It is installed first and pinned by a constraint
#   for every later step, so nothing trl pulls in can swap it for a CUDA build (several GB).
# - trl (pinned exactly: the newest release whose requirements install here) and the transformers / accelerate /
#   datasets it resolved to, pinned too so the test runs against the code whose rollout_func contract we read.
# - this repo's BASE install only (`pip install -e .`: pydantic, httpx, websockets): the light client, never the
#   server extra. The adapter must work without fastapi, fastmcp, uvicorn or swebench.
source "$(dirname "$0")/side_venv.sh"

VENV=.trl-venv
TORCH_SPEC="torch==2.13.0+cpu"
TRL_SPEC="trl==1.16.0"
# What trl 1.16.0 resolved to here (with torch 2.13.0); pinned so a later release cannot change the code path.
PINS=("transformers==5.24.0" "accelerate==1.15.0" "datasets==5.2.0")
MARKER="$VENV/.ready-trl-1.16.0"

install_side_venv() {
  # Keep the machine's own constraints (if any) and add ours: torch stays the CPU build from local disk.
  CONSTRAINTS="$VENV/constraints.txt"
  { [ -f /etc/xdg/pip/constraints.txt ] && cat /etc/xdg/pip/constraints.txt; echo "$TORCH_SPEC"; } > "$CONSTRAINTS"
  quiet_pip install -q --upgrade "pip>=25"
  quiet_pip install -q -c "$CONSTRAINTS" "$TORCH_SPEC"
  quiet_pip install -q -c "$CONSTRAINTS" "$TRL_SPEC" "${PINS[@]}"
  # setuptools prints pages of package-discovery warnings for this repo's layout: keep them in a log, shown on
  # failure only.
  quiet_pip install -q -c "$CONSTRAINTS" -e . 2> "$VENV/install-repo.log" || { cat "$VENV/install-repo.log" >&2; exit 1; }
  "$VENV/bin/python" - <<'PY'
from importlib.metadata import version

import torch
import trl  # noqa: F401
from trl import GRPOConfig, GRPOTrainer  # noqa: F401

from swe_gym_env.client import trl_adapter  # noqa: F401

assert "+cpu" in torch.__version__, f"not the CPU build of torch: {torch.__version__}"
names = ["trl", "torch", "transformers", "accelerate", "datasets", "pydantic", "httpx", "websockets"]
print(" ".join(f"{n} {version(n)}" for n in names))
PY
}

if [ -f "$MARKER" ]; then
  "$VENV/bin/python" -c 'from importlib.metadata import version as v; print(" ".join(f"{n} {v(n)}" for n in ["trl", "torch", "transformers", "accelerate", "datasets"]))'
fi
ensure_side_venv trl --size
