"""Harnesses on first use.

`swe-gym-env setup` prepares only Pi (the demo's agent); `setup --harness X` or `setup --all` prepare the others
ahead of time. A rollout that asks for a harness whose bundle is not built installs it first (npm install + its
bundle, `server/agents/bundle.py`), with progress lines (`<harness> <version>: NN% <step>`) in the server's log and
in the rollout's progress. A server that cannot install it — installing on first use switched off
(`SWE_GYM_INSTALL_ON_USE=0`), no `npm` on its PATH, npm set offline (`npm_config_offline`) — refuses the rollout
at `validate`, naming the command that installs it ahead of time; an install that is tried and fails (no registry,
a bad pin) fails the rollout at `install`, naming the same command. The same setting governs the pypi split and the
task venvs a rollout would build on first use (server/rollout/pipeline.py); the time a first-use install takes does
not count against the rollout's deadline (`timings`: `install.harness`, `install.split`, `install.env`).

One install per harness at a time: threads of this process wait on a lock, other processes (servers sharing the
cache) on a file lock; whoever comes second finds the bundle built.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator

from swe_gym_env.names import HARNESSES as _NAMES
from swe_gym_env.procs import file_lock
from swe_gym_env.server.agents.base import AgentError, Harness
from swe_gym_env.server.agents.bundle import Bundle, build_bundle, bundles_dir, ensure_bundle, find_bundle

INSTALL_ON_USE_ENV = "SWE_GYM_INSTALL_ON_USE"  # "0" / "false" / "no" / "off": never install on first use
SETUP_ALL = "swe-gym-env setup --all"
_OFF = ("0", "false", "no", "off")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def install_on_use_from_env() -> bool:
    """Whether this server may install what a rollout needs on first use ($SWE_GYM_INSTALL_ON_USE, default yes)."""
    return os.environ.get(INSTALL_ON_USE_ENV, "1").strip().lower() not in _OFF


def setup_command(name: str) -> str:
    """The command that installs harness ``name`` ahead of time (its row in `swe_gym_env.names.HARNESSES`)."""
    return _NAMES[name].install if name in _NAMES else f"swe-gym-env setup --harness {name}"


def installed(h: Harness) -> bool:
    """Its current bundle is there (cheap: the pointer, the metadata and the manifest's digest)."""
    return find_bundle(h) is not None


def install_refusal(allowed: bool) -> str | None:
    """Why this server cannot install a harness on first use (None: it can try)."""
    if not allowed:
        return f"installing on first use is off here ({INSTALL_ON_USE_ENV}=0)"
    if shutil.which("npm") is None:
        return "there is no npm on the server's PATH to install it with"
    offline = os.environ.get("npm_config_offline") or os.environ.get("NPM_CONFIG_OFFLINE") or ""
    if offline.strip().lower() not in ("", *_OFF):
        return "npm is set offline here (npm_config_offline)"
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
