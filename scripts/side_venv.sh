# Sourced by scripts/setup_{vllm,openenv,trl}.sh: helpers for a side virtual environment at the repo root ($VENV),
# for tools whose pins conflict with the app's (the app never imports them).

# This machine's pip.conf may name local index folders that hold only some packages: drop pip's per-package
# "Location ... is ignored" warnings, keep everything else.
quiet_pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

make_side_venv() {
  [ -x "$VENV/bin/python" ] || "${PY:-python3}" -m venv "$VENV"
  # The venv lives inside the work tree: keep git (and anything that copies untracked files) away from it.
  echo '*' > "$VENV/.gitignore"
}
