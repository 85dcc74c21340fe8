"""A relocatable CPython for Python agents' bundles: the agent brings its own interpreter, like Pi brings Node.

A task image's Python is the task's (its version differs from task to task, its packages are what is tested), so a
Python agent must never run on it. The runtime is this host's CPython 3.11 (`source_python`: by default Debian
bookworm's `/usr/bin/python3.11`) copied with its standard library, its `lib-dynload` and **every shared library it
and the agent's packages load, the dynamic loader and the C library included**, so it runs in any x86-64 Linux image
whatever its C library (older glibc, as SWE-Gym's Ubuntu 22.04 images have, or none):

    <bundle>/python/lib/ld-linux-x86-64.so.2 --library-path <bundle>/python/lib <bundle>/python/bin/python3.11 -I

The loader is called directly, so nothing of the image's C library is used and no `LD_LIBRARY_PATH` reaches the
agent's own commands (they run with the image's libraries, as the image expects). `-I` (isolated: no `PYTHON*`
variables, no user site, no current directory on `sys.path`) and `bin/python3.11._pth` (CPython >= 3.11 honours it
on POSIX) pin `sys.path` to the runtime's standard library and the bundle's `site/`, so the agent's packages and the
task's never meet. The agent's packages are installed by the runtime's own pip (a pinned wheel, run from the wheel)
into `site/` (`pip install --target`, `--no-deps` from a full pin list, binary wheels only); every module is compiled
with `--invalidation-mode unchecked-hash`, so the read-only bundle starts without compiling and without writing
`__pycache__` (copies change mtimes; hash-based .pyc files do not care).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from swe_gym_env.server.agents.base import AgentError

FORMAT = 1  # how the runtime is laid out and pruned: a change here rebuilds the bundles that carry one
SOURCE_ENV = "SWE_GYM_AGENT_PYTHON"
DEFAULT_SOURCE = "/usr/bin/python3.11"
VERSION = "3.11"  # the pinned wheels are cp311
RUNTIME = "python"  # the runtime's directory in the bundle
SITE = "site"  # the agent's packages, beside it
LOADER = "ld-linux-x86-64.so.2"
BIN = f"bin/python{VERSION}"
# pip, run from its wheel by the runtime itself; fetched with the host's pip (`pip download`), sha256-checked
PIP = ("pip", "25.3", "9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd")
# never loaded by an agent: left out of the runtime
DROP = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "site-packages"}
    | {"dist-packages", "EXTERNALLY-MANAGED", f"config-{VERSION}-x86_64-linux-gnu"}
)
_LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x")


def python_command(root: str) -> str:
    """The shell words that start the bundle's Python isolated, the bundle at ``root``."""
    py = f"{root}/{RUNTIME}"
    return f"{py}/lib/{LOADER} --library-path {py}/lib {py}/{BIN} -I -X utf8"


def source_python() -> str:
    """The interpreter the runtime is copied from: $SWE_GYM_AGENT_PYTHON, else Debian's python3.11, else the first
    python3.11 on PATH (python:3.11-slim's /usr/local/bin/python3.11, the Space image's base), else this one."""
    found = os.environ.get(SOURCE_ENV) or (DEFAULT_SOURCE if os.path.isfile(DEFAULT_SOURCE) else None)
    return found or shutil.which(f"python{VERSION}") or sys.executable


def recipe() -> list[str]:
    """What the runtime is built from (in the bundle's recipe: a changed source or pip pin rebuilds it)."""
    return [f"runtime {FORMAT}", f"python {source_python()} {VERSION}", f"pip {PIP[1]} {PIP[2]}", f"loader {LOADER}"]


def _run(argv: list[str], what: str, timeout: float = 900, cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentError("install", f"{what} failed: {e}") from e
    if r.returncode != 0:
        said = (r.stdout.strip() + "\n" + r.stderr.strip()).strip()
        raise AgentError("install", f"{what} failed (exit {r.returncode}): {said[-600:]}")
    return r.stdout


def _layout(source: str) -> dict:
    probe = (
        "import json, sys, sysconfig; print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
        "'stdlib': sysconfig.get_path('stdlib'), 'executable': sys.executable}))"
    )
    out = json.loads(_run([source, "-I", "-S", "-c", probe], f"`{source}` (the agent runtime's source)", 60))
    if out["version"] != VERSION:
        raise AgentError("install", f"{source} is Python {out['version']}; the agent runtime needs {VERSION}")
    return out


def _copy_stdlib(src: Path, dst: Path) -> None:
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in DROP)
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in names:
            if name not in DROP and not name.endswith((".pyc", ".exe")) and not name.startswith("_tkinter"):
                shutil.copyfile(Path(root) / name, dst / rel / name)


def _libraries(objects: list[Path]) -> set[Path]:
    """Every shared library (and the loader) the ELF ``objects`` load, as ldd resolves them here."""
    found: set[Path] = set()
    for start in range(0, len(objects), 64):
        r = subprocess.run(["ldd", *map(str, objects[start : start + 64])], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = _LDD_LINE.match(line)
            if m:
                found.add(Path(m.group(1)))
    return found


def ship_libraries(runtime: Path, *trees: Path) -> int:
    """Copy into ``runtime/lib`` every library the interpreter and the extension modules under ``trees`` load that
    they do not carry themselves (manylinux wheels carry theirs in `<pkg>.libs/`); the number copied."""
    objects = [runtime / BIN] + [p for t in (runtime, *trees) for p in sorted(t.rglob("*.so*")) if p.is_file()]
    lib, carried = runtime / "lib", {p.name for t in trees for p in t.rglob("*.so*")}
    n = 0
    for path in sorted(_libraries(objects)):
        name = LOADER if LOADER in path.name else path.name
        if (lib / name).exists() or name in carried:
            continue
        shutil.copyfile(path.resolve(), lib / name)
        (lib / name).chmod(0o755)
        n += 1
    if not (lib / LOADER).is_file() or not (lib / "libc.so.6").is_file():
        raise AgentError("install", f"the agent runtime has no {LOADER} / libc.so.6 of its own (ldd found none)")
    return n


def build_runtime(dest: Path, log=print) -> Path:
    """The runtime (without the agent's packages) at ``dest/python``, ``dest/site`` empty beside it."""
    source = source_python()
    layout = _layout(source)
    runtime = dest / RUNTIME
    for old in (runtime, dest / SITE):  # a rebuild starts empty (pip --target skips what is already there)
        shutil.rmtree(old, ignore_errors=True)
    (runtime / "bin").mkdir(parents=True)
    log(f"agent runtime: Python {VERSION} from {layout['executable']} ({layout['stdlib']})")
    shutil.copyfile(Path(layout["executable"]).resolve(), runtime / BIN)
    (runtime / BIN).chmod(0o755)
    _copy_stdlib(Path(layout["stdlib"]), runtime / "lib" / f"python{VERSION}")
    (dest / SITE).mkdir(parents=True)
    # sys.path, exactly: the standard library, its extension modules, the agent's packages (relative to the binary)
    pth = f"../lib/python{VERSION}\n../lib/python{VERSION}/lib-dynload\n../../{SITE}\nimport site\n"
    (runtime / f"{BIN}._pth").write_text(pth)
    ship_libraries(runtime)
    return runtime


def fetch_pip(downloads: Path, log=print) -> Path:
    """The pinned pip wheel, fetched once with the host's pip (its index settings apply) and sha256-checked."""
    name, version, sha = PIP
    wheel = downloads / f"{name}-{version}-py3-none-any.whl"
    if wheel.is_file() and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha:
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    log(f"fetching {name}=={version} (the agent runtime's pip)")
    why = ""
    for python in dict.fromkeys((source_python(), sys.executable)):  # whichever of the two has a pip
        argv = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(downloads)]
        try:
            _run([*argv, f"{name}=={version}"], f"`{python} -m pip download {name}=={version}`")
            break
        except AgentError as e:
            why = str(e)
    else:
        raise AgentError("install", why)
    got = hashlib.sha256(wheel.read_bytes()).hexdigest() if wheel.is_file() else "nothing"
    if got != sha:
        raise AgentError("install", f"{wheel.name}: sha256 {got[:16]}… is not the pinned {sha[:16]}…")
    return wheel


def pip_install(dest: Path, pins: tuple[str, ...], downloads: Path, log=print) -> None:
    """The pinned packages (a full list: no resolution) into ``dest/site`` by the runtime's own pip."""
    wheel = fetch_pip(downloads, log)
    argv = [*python_command(str(dest)).split(), f"{wheel}/pip", "install", "--target", str(dest / SITE)]
    argv += ["--no-deps", "--only-binary", ":all:", "--no-compile", "--disable-pip-version-check", "--no-input"]
    _run([*argv, "-q", *pins], f"`pip install --target {dest / SITE}` ({len(pins)} pinned packages)", 1800)
    shutil.rmtree(dest / SITE / "bin", ignore_errors=True)  # console scripts: their shebangs name this host's paths


def compile_all(dest: Path) -> None:
    """Every module as a hash-checked .pyc that is never rechecked (a read-only bundle starts without compiling)."""
    argv = [*python_command(str(dest)).split(), "-m", "compileall", "-q", "-j0", "--invalidation-mode"]
    _run([*argv, "unchecked-hash", str(dest / RUNTIME / "lib" / f"python{VERSION}"), str(dest / SITE)], "compileall")


def self_test(dest: Path, imports: str) -> str:
    """Run the built runtime here: it starts, isolated, and imports ``imports``; its sys.path."""
    code = f"import sys, {imports}; print(sys.flags.isolated, sys.path)"
    return _run([*python_command(str(dest)).split(), "-c", code], "the agent runtime's self-test", 120).strip()
