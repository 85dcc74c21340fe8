#!/usr/bin/env bash
# Static checks, as tests/test_layering.py runs them in CI: ruff, import-linter's contracts ([tool.importlinter] in
# pyproject.toml) and pyright in basic mode ([tool.pyright]). Needs the dev group (`uv sync`, as scripts/setup.sh).
# The repo root *is* the package `swe_gym_env`, which pyright cannot resolve through the editable install's import
# hook: build/pyright/swe_gym_env (ignored by git) is a symlink to the root that pyright takes as an import root.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build/pyright
ln -sfn ../.. build/pyright/swe_gym_env
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-logo --cache-dir build/import_linter_cache
.venv/bin/pyright
