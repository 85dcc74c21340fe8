"""Process helpers shared by the CLI, the benchmarks, the vLLM launcher and the tests: a free loopback port, waiting
until a server answers its health URL, starting and stopping a server subprocess, finding the side venvs that
`scripts/setup_*.sh` make in the checkout, and `pip download` by this Python's pip.

Stdlib only, no project imports (import-linter checks it).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any
from urllib.error import URLError
from urllib.request import ProxyHandler, build_opener

CHECKOUT_ENV = "SWE_GYM_CHECKOUT"
_DIRECT = build_opener(ProxyHandler({}))  # health checks go to loopback: never through an HTTP(S)_PROXY


class NotReady(RuntimeError):
    """A server did not answer its health URL in time, or its process exited first (``exited``)."""

    def __init__(self, message: str, exited: bool = False) -> None:
        super().__init__(message)
        self.exited = exited


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created with its folder) held across processes for the ``with`` body."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` answers 200 right now."""
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            return r.status == 200
    except (URLError, OSError, ValueError):
        return False


def _describe(proc: subprocess.Popen) -> str:
    args = proc.args
    argv = [str(a) for a in args] if isinstance(args, Sequence) and not isinstance(args, str | bytes) else [str(args)]
    return shlex.join(argv[:4]) + (" …" if len(argv) > 4 else "")


def wait_healthy(
    url: str,
    proc: subprocess.Popen | None = None,
    timeout: float = 60.0,
    interval: float = 0.1,
    name: str | None = None,
) -> float:
    """Poll ``url`` until it answers 200; returns the seconds waited. Raises `NotReady` at ``timeout``, or as soon
    as ``proc`` (the server's process, when given) has exited."""
    start = time.monotonic()
    while not healthy(url, timeout=min(2.0, max(0.5, interval * 10))):
        if proc is not None and proc.poll() is not None:
            what = name or _describe(proc)
            raise NotReady(f"{what} exited with {proc.returncode} before it was ready", exited=True)
        if time.monotonic() - start > timeout:
            raise NotReady(f"{name or url} not healthy after {timeout:.0f}s")
        time.sleep(interval)
    return time.monotonic() - start


def stop(proc: subprocess.Popen, grace: float = 10.0, group: bool = False) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. ``group``: signal the process group the process leads
    (started with ``start_new_session``), and SIGKILL whatever of the group is left even after the leader exits."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                os.kill(proc.pid, sig)

    if proc.poll() is None or group:
        send(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    if proc.poll() is None or group:
        send(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def start(
    argv: Sequence[str],
    health: str,
    *,
    stack: ExitStack | None = None,
    env: Mapping[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    timeout: float = 60.0,
    grace: float = 10.0,
) -> subprocess.Popen:
    """Start a server process (``env`` added to this process's environment) and wait until ``health`` answers 200.

    With ``stack`` the process is stopped when the stack closes; it is stopped at once if it never becomes healthy.
    """
    proc = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, stdout=stdout, stderr=stderr)
    try:
        wait_healthy(health, proc, timeout)
    except BaseException:
        stop(proc, grace)
        raise
    if stack is not None:
        stack.callback(stop, proc, grace)
    return proc


# -- the checkout and the side venvs scripts/setup_*.sh make in it ------------------------------------------------
def _is_checkout(path: Path) -> bool:
    try:
        with open(path / "pyproject.toml", "rb") as f:
            return tomllib.load(f).get("project", {}).get("name") == "swe_gym_env"
    except (OSError, tomllib.TOMLDecodeError):
        return False


def checkout_dir(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The source checkout of this project: ``explicit``, else ``$SWE_GYM_CHECKOUT``, else the current directory or
    the nearest parent of it whose pyproject.toml names ``swe_gym_env``. None when there is none (an installed
    package runs without a checkout). An explicit path or variable that is not a checkout raises ValueError."""
    given = explicit or os.environ.get(CHECKOUT_ENV)
    if given:
        path = Path(given).expanduser().resolve()
        if not _is_checkout(path):
            source = "" if explicit else f"${CHECKOUT_ENV}="
            raise ValueError(f"{source}{given} is not a swe_gym_env checkout (no pyproject.toml naming swe_gym_env)")
        return path
    here = Path.cwd().resolve()
    return next((p for p in (here, *here.parents) if _is_checkout(p)), None)


def side_python(venv: str) -> Path | None:
    """``<checkout>/<venv>/bin/python`` (e.g. ``.vllm-venv``, ``.trl-venv``) when the checkout has that venv; see
    `checkout_dir` for how the checkout is found (ValueError for a ``$SWE_GYM_CHECKOUT`` that is not one)."""
    root = checkout_dir()
    python = root / venv / "bin" / "python" if root is not None else None
    return python if python is not None and python.is_file() else None


def system_binds(etc_files: Iterable[str]) -> list[str]:
    """bwrap arguments for the host's system files a box sees read-only: /usr, the /bin, /lib, /lib64 and /sbin links
    (or dirs) and the given /etc files (those that exist)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        p = Path("/") / link
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.exists():
            args += ["--ro-bind", str(p), str(p)]
    for name in etc_files:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def pip_download(
    dest: str | os.PathLike[str], requirements: Sequence[str], *options: str, **run: Any
) -> subprocess.CompletedProcess:
    """`pip download -q --no-deps` by this Python's pip: ``requirements`` (none of their dependencies) into ``dest``,
    with ``options`` (which distributions: sdists only, wheels for a platform); ``run`` goes to `subprocess.run`."""
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *options, "-d", os.fspath(dest)]
    return subprocess.run([*argv, *requirements], **run)
