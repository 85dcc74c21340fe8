# Sourced first by scripts/setup_{vllm,openenv,trl}.sh: a side virtual environment at the repo root ($VENV), for
# tools whose pins conflict with the app's (the app never imports them). Sourcing it sets bash's strict mode and
# moves to the repo root. The script sets VENV and MARKER, defines `install_side_venv` (what goes into the venv,
# with `quiet_pip`) and calls `ensure_side_venv NAME`, which builds the venv once (until $MARKER exists).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# This machine's pip.conf may name local index folders that hold only some packages: drop pip's per-package
# "Location ... is ignored" warnings, keep everything else.
quiet_pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

make_side_venv() {
  [ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
  # The venv lives inside the work tree: keep git (and anything that copies untracked files) away from it.
  echo '*' > "$VENV/.gitignore"
}

# ensure_side_venv NAME [--size]: unless $MARKER exists, make the venv, run `install_side_venv`, write $MARKER and
# say how long it took (and, with --size, how large the venv is).
ensure_side_venv() {
  [ -f "$MARKER" ] && return 0
  local start size=""
  start=$(date +%s)
  make_side_venv
  install_side_venv
  touch "$MARKER"
  [ "${2:-}" = --size ] && size=" ($(du -sh "$VENV" | cut -f1))"
  echo "$1 venv ready in $(( $(date +%s) - start )) s: $VENV$size"
}
