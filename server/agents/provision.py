"""Harnesses on first use.

`swe-gym-env setup` prepares only Pi (the demo's agent); `setup --harness X` or `setup --all` prepare the others
ahead of time. A rollout that asks for a harness whose bundle is not built installs it first (npm install + its
bundle, `server/agents/bundle.py`), with progress lines (`<harness> <version>: NN% <step>`) in the server's log and
in the rollout's progress. A server that cannot install it — installing on first use switched off
(`SWE_GYM_INSTALL_ON_USE=0`), or missing what that harness's install takes (`install_refusal`: for the npm ones, an
`npm` on its PATH that is not set offline; for the Python ones, what their runtime is built with) — refuses the
rollout at `validate`, naming the command that installs it ahead of time; an install that is tried and fails (no
registry, a bad pin) fails the rollout at `install`, naming the same command. The same setting governs the pypi
split and the task venvs a rollout would build on first use (server/rollout/pipeline.py); the time a first-use
install takes does not count against the rollout's deadline (`timings`: `install.harness`, `install.split`,
`install.env`).

One install per harness at a time: threads of this process wait on a lock, other processes (servers sharing the
cache) on a file lock; whoever comes second finds the bundle built.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from swe_gym_env.core.names import HARNESSES as _NAMES
from swe_gym_env.core.procs import file_lock
from swe_gym_env.core.settings import setting
from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AgentError, Harness
from swe_gym_env.server.agents.bundle import Bundle, build_bundle, bundles_dir, ensure_bundle, find_bundle

INSTALL_ON_USE_ENV = "SWE_GYM_INSTALL_ON_USE"  # "0" / "false" / "no" / "off": never install on first use
SETUP_ALL = "swe-gym-env setup --all"
_OFF = ("0", "false", "no", "off")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def install_on_use_from_env() -> bool:
    """Whether this server may install what a rollout needs on first use ($SWE_GYM_INSTALL_ON_USE, default yes)."""
    return setting("install_on_use")  # INSTALL_ON_USE_ENV


def setup_command(name: str) -> str:
    """The command that installs harness ``name`` ahead of time (its row in `swe_gym_env.core.names.HARNESSES`)."""
    return _NAMES[name].install if name in _NAMES else f"swe-gym-env setup --harness {name}"


def installed(h: Harness) -> bool:
    """Its current bundle is there (cheap: the pointer, the metadata and the manifest's digest)."""
    return find_bundle(h) is not None


def install_refusal(allowed: bool, harness: Harness | None = None) -> str | None:
    """Why this server cannot install ``harness`` on first use (None: it can try), from what its install takes
    (its `installer`): npm for the npm ones, what their runtime is built with for the Python ones (`_python_refusal`).
    Without a harness: what the npm ones take."""
    if not allowed:
        return f"installing on first use is off here ({INSTALL_ON_USE_ENV}=0)"
    if harness is not None and harness.python_runtime is not None:
        return _python_refusal(harness.python_runtime)
    return _npm_refusal()


def _npm_refusal() -> str | None:
    if shutil.which("npm") is None:
        return "there is no npm on the server's PATH to install it with"
    offline = os.environ.get("npm_config_offline") or os.environ.get("NPM_CONFIG_OFFLINE") or ""
    if offline.strip().lower() not in ("", *_OFF):
        return "npm is set offline here (npm_config_offline)"
    return None


def pip_downloads() -> Path:
    """Where the Python harnesses' runtime pip wheel is fetched to (`pyruntime.fetch_pip`), once for all of them."""
    return bundles_dir() / ".downloads" / "pip"


def _runs(argv: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _pip_fetched() -> bool:
    name, version, sha = pyruntime.PIP
    wheel = pip_downloads() / f"{name}-{version}-py3-none-any.whl"
    return wheel.is_file() and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha


def _python_refusal(runtime: str) -> str | None:
    """What the agent runtime of a Python harness is built with: for a "host" runtime (`pyruntime.build_runtime`)
    the source Python it is copied from (`pyruntime.source_python`: Python 3.11, runnable here) and ldd (to find the
    libraries it ships); for a "debian" one (`pyruntime.build_debian_runtime`) apt-get and dpkg-deb (to fetch and
    unpack Debian's packages); for both a pip to fetch the runtime's own pip with (unless fetched already), and pip
    not set offline (it installs the agent's pinned wheels from the index)."""
    source = pyruntime.source_python()
    if runtime == "debian":
        if missing := [t for t in ("apt-get", "dpkg-deb") if shutil.which(t) is None]:
            return f"there is no {' or '.join(missing)} on the server's PATH (the agent runtime is Debian's packages)"
        return _pip_refusal(source)
    how = f"set {pyruntime.SOURCE_ENV} to a Python {pyruntime.VERSION}"
    r = _runs([source, "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    if r is None or r.returncode != 0:
        return f"the agent runtime's source Python ({source}) does not run here ({how})"
    if (version := r.stdout.strip()) != pyruntime.VERSION:
        return f"the agent runtime's source Python ({source}) is Python {version}, not {pyruntime.VERSION} ({how})"
    if shutil.which("ldd") is None:
        return "there is no ldd on the server's PATH (the agent runtime ships the libraries ldd finds)"
    return _pip_refusal(source)


def _pip_refusal(source: str) -> str | None:
    has_pip = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pip') is None)"
    pythons = dict.fromkeys((source, sys.executable))  # as `pyruntime.fetch_pip` tries them
    if not _pip_fetched() and not any(getattr(_runs([p, "-c", has_pip]), "returncode", 1) == 0 for p in pythons):
        return f"there is no pip to fetch the agent runtime's pip with (none in {', '.join(pythons)})"
    no_index = os.environ.get("PIP_NO_INDEX") or ""
    if no_index.strip().lower() not in ("", *_OFF) and not os.environ.get("PIP_FIND_LINKS"):
        return "pip is set offline here (PIP_NO_INDEX, and no PIP_FIND_LINKS)"
    return None


def not_installed(h: Harness, why: str) -> str:
    """The `validate` error of a rollout whose harness is missing on a server that cannot install it."""
    return (
        f"harness {h.name!r} ({h.package}@{h.version}) is not installed on this server and cannot be installed on "
        f"first use: {why}. Install it ahead of time: `{setup_command(h.name)}` (or `{SETUP_ALL}` for every "
        "harness), then retry"
    )


@contextlib.contextmanager
def _one_install(name: str) -> Iterator[None]:
    with _locks_guard:
        lock = _locks.setdefault(name, threading.Lock())
    with lock, file_lock(bundles_dir() / f".install-{name}.lock"):
        yield


def install(h: Harness, log=print) -> Bundle:
    """Install harness ``h`` on first use (blocking: run it in a thread); the bundle. Another caller's install
    that finished meanwhile is used as it is. AgentError("install") naming the setup command when it fails."""
    with _one_install(h.name):
        found = find_bundle(h)
        if found is not None:
            return found
        log(
            f"{h.name} {h.version} is not installed on this server: installing it now, on first use "
            f"(`{setup_command(h.name)}` installs it ahead of time)"
        )
        try:
            return build_bundle(h, log)
        except (AgentError, OSError) as e:
            raise AgentError("install", f"installing {h.name} on first use failed: {e}; {_run(h)}") from e


def prepare(h: Harness, log=print) -> Bundle:
    """For `swe-gym-env setup`: install and bundle ``h`` unless a current, fully checked bundle is there (and the
    npm install beside it, which the tests' fixtures look for)."""
    with _one_install(h.name):
        bundle = ensure_bundle(h, log)
        h.ensure_installed(log)
        return bundle


def _run(h: Harness) -> str:
    return f"install it on the server with `{setup_command(h.name)}` (or `{SETUP_ALL}`)"
