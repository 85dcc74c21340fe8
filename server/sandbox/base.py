"""The sandbox protocol. Backends know nothing of agents; the rollout pipeline composes them.

A backend is a class with ``async create(spec) -> instance`` whose instances offer what `Sandbox` lists. Most of it
is shared here (`SandboxBase`): a backend implements `_spawn` (start a shell script in the sandbox as a
`Process`), `write_file`, `read_file` and `_teardown`; `exec`, background processes, argv quoting, env, cwd,
secrets, deadlines, uploads and an idempotent `close` come from the base.

Agent bundles (content-addressed trees among the read-only mounts) are checked or delivered at boot by the
`bundles.BundleBoot` mixin, and their cost recorded in `bundle_bytes` / `bundle_s`.

Error tree: `SandboxError` (creating or using a sandbox failed; the message names the fix where there is one)
  └── `SandboxUnavailable` (the backend cannot run here at all: binary, daemon, credentials, SDK or image missing)
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self, TypedDict, Unpack

from swe_gym_env.server.sandbox.bundles import BundleBoot
from swe_gym_env.server.sandbox.errors import SandboxError, SandboxUnavailable

__all__ = ["SandboxError", "SandboxUnavailable"]  # defined in errors.py; callers import them from here

OUTPUT_LIMIT = 256 * 1024
TRUNCATED = "\n[... output truncated by swe_gym_env ...]\n"
SECRETS_FILE = "/tmp/.swe-gym/secrets.env"  # mode 0600, sourced by every command; never argv
RELAY_PORT = 18080
LABEL_PREFIX = "swe-gym"


@dataclass(frozen=True)
class Limits:
    cpus: float = 2.0
    memory_mb: int = 4096
    pids: int = 1024


@dataclass(frozen=True)
class SandboxSpec:
    repo_source: str = ""  # a git repository or bundle on the host; "" when the image already holds the repo
    base_commit: str = ""
    workdir: str = "/testbed"
    image: str | None = None  # container backends: the task's image (None: the backend's default)
    capture_socket: Path | None = None  # host unix socket serving /capture only; None: no way out at all
    capture_url: str | None = None  # remote backends: the server's public base URL (they reach its /capture)
    ro_mounts: dict[str, str] = field(default_factory=dict)  # host path -> sandbox path
    env: dict[str, str] = field(default_factory=dict)  # non-secret environment
    secrets: dict[str, str] = field(default_factory=dict)  # written to SECRETS_FILE (0600), never argv
    labels: dict[str, str] = field(default_factory=dict)  # registry adds server id, incarnation, host, pid
    limits: Limits = field(default_factory=Limits)
    deadline_s: float = 3600.0  # the sandbox expires by itself this long after creation
    strip_history: bool = True  # drop refs/objects past base_commit before anyone uses the repo


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def clip(data: bytes | str, limit: int = OUTPUT_LIMIT) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text if len(text) <= limit else text[: limit // 2] + TRUNCATED + text[-limit // 2 :]


def as_shell(cmd: str | list[str]) -> str:
    """A shell string is taken as is (the caller quoted it); an argv list is quoted here."""
    if isinstance(cmd, str):
        return cmd
    if not cmd or not all(isinstance(a, str) for a in cmd):
        raise SandboxError("argv must be a non-empty list of strings")
    return shlex.join(cmd)


def strip_history_script(workdir: str, base_commit: str) -> str:
    """Shell that leaves only `base_commit` and its ancestors: no branches, tags, remotes, reflogs or stashes that
    could hold the fix, and unreachable objects pruned, so `git log --all` shows nothing past the base."""
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            f"cd {q(workdir)}",
            "export GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0",
            f"git -c advice.detachedHead=false checkout -q -f --detach {q(base_commit)}",
            'for r in $(git remote); do git remote remove "$r"; done',
            "git for-each-ref --format='%(refname)' | while read -r ref; do git update-ref -d \"$ref\"; done",
            "git checkout -q -b main",
            "rm -f .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/packed-refs.lock",
            "git reflog expire --expire=now --all",
            "git gc -q --prune=now",
        ]
    )


class Process(Protocol):
    """A command running in a sandbox. `kill` stops its whole process tree."""

    async def poll(self) -> int | None: ...

    async def wait(self, timeout: float | None = None) -> ExecResult: ...

    async def kill(self) -> None: ...


class RunOptions(TypedDict, total=False):
    """How `exec` / `start` run a command: `relay` starts the in-sandbox relay to /capture first; `env` and `cwd` are
    its environment additions and directory (default `spec.workdir`); `ptys` the pty pairs it asks for."""

    relay: bool
    env: dict[str, str] | None
    cwd: str | None
    ptys: int


class Sandbox(Protocol):
    capture_base_url: str | None  # where, inside the sandbox, /capture answers
    expires_at: float  # epoch seconds
    bundle_bytes: int  # agent-bundle bytes uploaded at boot (0 where mounted)
    bundle_s: float  # seconds boot spent delivering and checking agent bundles

    @property
    def agent_workdir(self) -> str: ...  # where the agent finds the work tree (what its prompt names)

    async def exec(
        self, cmd: str | list[str], *, timeout: float, stdin: bytes | None = None, **opts: Unpack[RunOptions]
    ) -> ExecResult: ...

    async def start(self, cmd: str | list[str], **opts: Unpack[RunOptions]) -> Process: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes: ...

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None: ...

    async def download(self, path: str, local: Path, limit: int = 1 << 30) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc) -> None: ...


class SandboxBase(BundleBoot):
    """Shared behaviour; backends fill in `create`, `_spawn`, `write_file`, `read_file`, `_teardown`, their
    capabilities below, and `preflight` / `reap_orphans` where they have something to check or clean up."""

    # -- what a backend can do, as class attributes: callers read these, never probe a backend with hasattr ----
    host_mounts: ClassVar[bool] = False  # spec.ro_mounts (host paths) are mounted; else the image brings them
    takes_repo_source: ClassVar[bool] = False  # clones spec.repo_source (a repository on the host)
    uses_image: ClassVar[bool] = False  # runs spec.image (the task's image, which may hold the repo)
    needs_image: ClassVar[bool] = False  # needs spec.image: no default image of its own
    capture_via_url: ClassVar[bool] = False  # reaches /capture at the server's public URL (else its unix socket)
    has_ptys: ClassVar[bool] = True  # a command can make a new pty (/dev/ptmx and its peer): agents' terminals need one
    # else: a command that asks (`ptys=N`) is handed N pty pairs opened for it outside its confinement (`_spawn_ptys`)
    gives_ptys: ClassVar[bool] = False

    capture_base_url: str | None = None
    relay_prefix: str = ""  # shell that starts the in-sandbox relay to /capture (backends with a socket)
    bundle_bytes: int = 0  # agent-bundle bytes uploaded at boot (0 where the bundle is mounted)
    bundle_s: float = 0.0  # seconds boot spent delivering and checking agent bundles

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.expires_at = time.time() + spec.deadline_s
        self._live: set[Process] = set()
        self._closed = False

    @property
    def agent_workdir(self) -> str:
        """Where the agent finds the work tree (what its prompt names): `spec.workdir`, unless a backend cannot put
        it there (no mount namespace) and says where it is instead."""
        return self.spec.workdir

    # -- what a backend implements -------------------------------------------------------------------------
    @classmethod
    async def create(cls, spec: SandboxSpec) -> Self:
        raise NotImplementedError

    @staticmethod
    def preflight() -> tuple[bool, str]:
        """Whether the backend can run here now: (ok, detail or the reason it cannot)."""
        return True, "nothing to check"

    @staticmethod
    def reap_orphans() -> list[str]:
        """Remove what server processes that died left behind; returns what was removed."""
        return []

    async def _spawn(self, script: str, stdin: bytes | None) -> Process:
        raise NotImplementedError

    async def _spawn_ptys(self, script: str, stdin: bytes | None, ptys: int) -> Process:
        """`_spawn`, the command handed `ptys` pty pairs opened before its confinement (their descriptors named in
        $SWE_GYM_PTYS, "master:slave,..."): backends that `gives_ptys` implement it. Called only with ptys > 0."""
        raise NotImplementedError

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        raise NotImplementedError

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        raise NotImplementedError

    async def _teardown(self) -> None:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------------------------
    async def _boot(self, *steps: Callable[[], Awaitable[object]]) -> Self:
        """Run a new sandbox's boot steps in order and return it; a step that fails (or is cancelled) closes it."""
        try:
            for step in steps:
                await step()
        except BaseException:
            await self.close()
            raise
        return self

    def remaining(self) -> float:
        return max(0.0, self.expires_at - time.time())

    def script(self, cmd: str | list[str], relay: bool, env: dict[str, str] | None, cwd: str | None) -> str:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if relay and not self.relay_prefix and self.capture_base_url is None:
            raise SandboxError("this sandbox has no capture relay")
        lines = []
        if self.spec.secrets:
            lines.append(f"set -a; . {SECRETS_FILE}; set +a")
        for k, v in (env or {}).items():
            if not k.isidentifier():
                raise SandboxError(f"bad environment variable name: {k[:50]!r}")
            lines.append(f"export {k}={shlex.quote(v)}")
        lines.append(f"cd {shlex.quote(cwd or self.spec.workdir)} || exit 96")
        if relay:
            lines.append(self.relay_prefix)
        lines.append(as_shell(cmd))
        return "\n".join(line for line in lines if line)

    def secrets_file(self) -> bytes:
        return "".join(f"{k}={shlex.quote(v)}\n" for k, v in self.spec.secrets.items()).encode()

    def _spawner(self, ptys: int):
        """How to start a command that asks for `ptys` pty pairs: a backend that can make ptys inside (`has_ptys`)
        ignores the number (the command opens its own); one that `gives_ptys` opens them for it."""
        if not isinstance(ptys, int) or ptys < 0:
            raise SandboxError(f"ptys must be a non-negative int, not {ptys!r}")
        if ptys and self.gives_ptys:
            return lambda script, stdin: self._spawn_ptys(script, stdin, ptys)
        return self._spawn

    def _prepared(self, cmd: str | list[str], opts: RunOptions):
        """(how to spawn, the script) for `cmd` run as `opts` say; the caller spawns it at once (no await between)."""
        if unknown := opts.keys() - RunOptions.__annotations__.keys():
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        spawn = self._spawner(opts.get("ptys", 0))
        return spawn, self.script(cmd, opts.get("relay", False), opts.get("env"), opts.get("cwd"))

    async def start(self, cmd: str | list[str], **opts: Unpack[RunOptions]) -> Process:
        if self.remaining() <= 0:
            raise SandboxError("sandbox deadline passed")
        spawn, script = self._prepared(cmd, opts)
        proc = await spawn(script, None)
        self._live.add(proc)
        return proc

    async def exec(
        self, cmd: str | list[str], *, timeout: float, stdin: bytes | None = None, **opts: Unpack[RunOptions]
    ) -> ExecResult:
        spawn, script = self._prepared(cmd, opts)
        timeout = min(timeout, self.remaining())
        if timeout <= 0:
            return ExecResult(124, "", "sandbox deadline passed", timed_out=True)
        proc = await spawn(script, stdin)
        self._live.add(proc)
        try:
            return await proc.wait(timeout)
        finally:
            if await proc.poll() is None:
                await proc.kill()
            self._live.discard(proc)

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        await self.write_file(path, await asyncio.to_thread(Path(local).read_bytes), mode)

    async def download(self, path: str, local: Path, limit: int = 1 << 30) -> None:
        data = await self.read_file(path, limit)
        await asyncio.to_thread(Path(local).write_bytes, data)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in list(self._live):
            try:
                await proc.kill()
            except Exception:  # the teardown below removes whatever is left
                pass
        self._live.clear()
        await self._teardown()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


Proc = asyncio.subprocess.Process


class PipeProcess:
    """A `Process` backed by a host subprocess whose stdout/stderr are pipes, read into bounded buffers."""

    def __init__(self, proc: asyncio.subprocess.Process, stdin: bytes | None, killer) -> None:
        self.proc = proc
        self._killer = killer  # async callable that kills the tree
        self._out = bytearray()
        self._err = bytearray()
        self._readers = [
            asyncio.ensure_future(self._read(proc.stdout, self._out)),
            asyncio.ensure_future(self._read(proc.stderr, self._err)),
        ]
        self._feeder = asyncio.ensure_future(self._feed(stdin)) if proc.stdin is not None else None

    @classmethod
    async def spawn(
        cls, argv: list[str], stdin: bytes | None, kill: Callable[[Proc], Awaitable[None]], **kwargs: Any
    ) -> PipeProcess:
        """Start ``argv`` on the host in a session of its own, stdout and stderr piped (stdin too where there is
        input); ``kill(proc)`` kills its tree."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **kwargs,
        )
        return cls(proc, stdin, functools.partial(kill, proc))

    async def _feed(self, data: bytes | None) -> None:
        assert self.proc.stdin is not None
        try:
            if data:
                self.proc.stdin.write(data)
                await self.proc.stdin.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.proc.stdin.close()

    @staticmethod
    async def _read(stream, buf: bytearray) -> None:
        while chunk := await stream.read(65536):
            if len(buf) < 2 * OUTPUT_LIMIT:  # keep head and tail for `clip`
                buf += chunk
            else:
                del buf[OUTPUT_LIMIT : OUTPUT_LIMIT + len(chunk)]
                buf += chunk

    async def poll(self) -> int | None:
        return self.proc.returncode

    async def wait(self, timeout: float | None = None) -> ExecResult:
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
            return ExecResult(124, clip(bytes(self._out)), f"timed out after {timeout:.0f}s", timed_out=True)
        await asyncio.wait(self._readers, timeout=5)
        return ExecResult(self.proc.returncode or 0, clip(bytes(self._out)), clip(bytes(self._err)))

    async def kill(self) -> None:
        if self.proc.returncode is None:
            await self._killer()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            pass
        for task in self._readers:
            task.cancel()
        if self._feeder is not None:
            self._feeder.cancel()
