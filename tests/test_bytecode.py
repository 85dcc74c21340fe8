"""Setup leaves the server's import chain compiled. uv installs without bytecode, and where PYTHONDONTWRITEBYTECODE
is set (as on this project's CI machines) no process writes it: every `serve`, `engine` and CLI start then compiled
its whole import chain from source (a server's start to /health: 11 s of CPU, 4.8 s compiled). scripts/setup.sh
compiles it once (`uv sync --compile-bytecode`, then `compileall` of the package's own modules)."""

import json
import subprocess
import sys

PROBE = r"""
import importlib.util, json, os, sys
import swe_gym_env.cli, swe_gym_env.server.app
missing = sorted(
    m.__file__ for m in list(sys.modules.values())
    if (getattr(m, "__file__", None) or "").endswith(".py")
    and not os.path.exists(importlib.util.cache_from_source(m.__file__))
)
print(json.dumps({"modules": len(sys.modules), "missing": missing}))
"""


def test_the_servers_import_chain_is_compiled_bytecode():
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["modules"] > 500  # the probe imported the server, not a stub
    assert not out["missing"], (
        f"{len(out['missing'])} module(s) of the server's import chain have no bytecode (run scripts/setup.sh: "
        f"`uv sync --compile-bytecode` and compileall of the package), e.g. {out['missing'][:5]}"
    )
