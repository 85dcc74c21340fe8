#!/usr/bin/env bash
# OpenEnv's own client beside the app, for tests/test_openenv_compat.py's round trip through OpenEnv's classes.
# Idempotent.
#
# `.openenv-venv/` at the repo root: its own virtual environment with openenv==0.10.* (its `openenv.core`
# MCPToolClient / GenericEnvClient, which need httpx and websockets). openenv 0.10 pins fastmcp<4 (so mcp<2): it
# must never share the app's .venv (fastmcp 4). The app itself never imports openenv.
source "$(dirname "$0")/side_venv.sh"

VENV=.openenv-venv
OPENENV_SPEC="openenv==0.10.*"
MARKER="$VENV/.ready-openenv-0.10"

install_side_venv() {
  quiet_pip install -q "$OPENENV_SPEC" httpx websockets
  "$VENV/bin/python" - <<'PY'
from importlib.metadata import version

from openenv.core.generic_client import GenericEnvClient  # noqa: F401
from openenv.core.mcp_client import MCPToolClient  # noqa: F401

print("openenv", version("openenv"), "fastmcp", version("fastmcp"), "websockets", version("websockets"))
PY
}

ensure_side_venv openenv
