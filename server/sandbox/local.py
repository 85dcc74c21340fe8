"""`local` sandbox backend: bubblewrap.

Each sandbox is a private host directory (testbed, HOME, TMPDIR) that every command sees through a fresh `bwrap`
with its own pid, mount, ipc, uts and network namespaces. The network namespace has only loopback; when a command
needs the model, a relay inside it forwards 127.0.0.1:RELAY_PORT to the server's capture unix socket, which serves
/capture and nothing else. Nothing of the server's files or environment is visible: only /usr, a few /etc files,
the Python runtime and the read-only mounts the spec names. Secrets reach the sandbox as files, never argv.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from swe_gym_env.server.assets import task_runtime_dir
from swe_gym_env.server.sandbox.base import ExecResult, SandboxError, SandboxSpec, clip
from swe_gym_env.server.tempdirs import owned_dir, reap_orphans

RELAY_PORT = 18080
RUNTIME_MOUNT = "/opt/swe-gym/runtime"
RELAY_SCRIPT = Path(__file__).resolve().parent / "relay.py"
SOCKET_DIR = "/run/swe-gym"
ETC_FILES = [
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "mime.types",
]
DIR_PREFIX = "swe-gym-sbx-"


def _reap_orphans() -> list[str]:
    """Sandbox dirs left by server processes that no longer exist (e.g. killed mid-rollout)."""
    return reap_orphans(DIR_PREFIX)


GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


def bwrap_path() -> str:
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxError("bubblewrap is not installed: `apt-get install bubblewrap` (the local sandbox needs it)")
    return path


class LocalSandbox:
    def __init__(self, spec: SandboxSpec, root: Path) -> None:
        self.spec = spec
        self.root = root
        self.capture_base_url = f"http://127.0.0.1:{RELAY_PORT}/capture" if spec.capture_socket else None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._closed = False

    reap_orphans = staticmethod(_reap_orphans)

    @classmethod
    async def create(cls, spec: SandboxSpec) -> LocalSandbox:
        bwrap_path()
        runtime = task_runtime_dir()
        if not (runtime / "bin" / "python").exists():
            raise SandboxError(f"task runtime missing at {runtime}: run `swe-gym-env setup`")
        root = owned_dir(DIR_PREFIX)
        sbx = cls(spec, root)
        try:
            for d in ("testbed", "home", "tmp"):
                (root / d).mkdir()
            await asyncio.to_thread(sbx._clone)
        except BaseException:
            await sbx.close()
            raise
        return sbx

    def _clone(self) -> None:
        testbed = self.root / "testbed"
        env = {**os.environ, **GIT_ENV, "GIT_CONFIG_GLOBAL": "/dev/null"}
        git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false"]
        for args in (
            ["clone", "-q", "--no-checkout", "--", self.spec.repo_source, str(testbed)],
            ["-C", str(testbed), "checkout", "-q", self.spec.base_commit],
            ["-C", str(testbed), "remote", "remove", "origin"],
        ):
            r = subprocess.run([*git, *args], env=env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise SandboxError(f"preparing the repository failed: git {args[0]}: {r.stderr.strip()[:500]}")
        (self.root / "home" / ".gitconfig").write_text(
            "[user]\n\tname = agent\n\temail = agent@sandbox.invalid\n[safe]\n\tdirectory = *\n"
        )

    def _argv(self, env: dict[str, str]) -> list[str]:
        runtime = task_runtime_dir()
        base = Path(sys.base_prefix).resolve()
        args = [
            bwrap_path(),
            "--die-with-parent",
            "--unshare-all",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for link in ("bin", "lib", "lib64", "sbin"):
            p = Path("/") / link
            if p.is_symlink():
                args += ["--symlink", os.readlink(p), str(p)]
            elif p.exists():
                args += ["--ro-bind", str(p), str(p)]
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        # The sandbox's own writable dirs first: a later bind may sit under /tmp on the host (a runtime or a
        # Python prefix there must not be hidden by the sandbox's /tmp).
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--bind", str(self.root / "tmp"), "/tmp", "--bind", str(self.root / "home"), "/home/agent"]
        args += ["--bind", str(self.root / "testbed"), self.spec.workdir]
        args += ["--ro-bind", str(base), str(base), "--ro-bind", str(runtime), RUNTIME_MOUNT]
        args += ["--ro-bind", str(RELAY_SCRIPT), "/opt/swe-gym/relay.py"]
        for host, inside in self.spec.ro_mounts.items():
            args += ["--ro-bind", host, inside]
        if self.spec.capture_socket is not None:
            args += ["--ro-bind", str(self.spec.capture_socket), f"{SOCKET_DIR}/capture.sock"]
        path = f"{RUNTIME_MOUNT}/bin:/usr/local/bin:/usr/bin:/bin"
        full_env = {
            "PATH": path,
            "HOME": "/home/agent",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "USER": "agent",
            **GIT_ENV,
            **self.spec.env,
            **env,
        }
        args += ["--clearenv"]
        for k, v in full_env.items():
            args += ["--setenv", k, v]
        args += ["--chdir", self.spec.workdir]
        return args

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float,
        stdin: bytes | None = None,
        relay: bool = False,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if relay:
            if self.spec.capture_socket is None:
                raise SandboxError("this sandbox has no capture relay")
            cmd = (
                f"python3 /opt/swe-gym/relay.py {RELAY_PORT} {SOCKET_DIR}/capture.sock /tmp/.relay-ready &\n"
                "i=0; while [ ! -f /tmp/.relay-ready ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
                "[ -f /tmp/.relay-ready ] || { echo 'capture relay did not start' >&2; exit 97; }\n"
                f"{cmd}"
            )
        argv = [*self._argv(env or {}), "--", "/bin/sh", "-c", cmd]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._procs.add(proc)
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
            return ExecResult(proc.returncode or 0, clip(out), clip(err))
        except TimeoutError:
            await self._kill(proc)
            return ExecResult(124, "", f"timed out after {timeout:.0f}s", timed_out=True)
        finally:
            if proc.returncode is None:
                await self._kill(proc)
            self._procs.discard(proc)
            if relay:
                (self.root / "tmp" / ".relay-ready").unlink(missing_ok=True)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            pass

    def _host_path(self, path: str) -> Path:
        root = self.root
        mounts = {self.spec.workdir: root / "testbed", "/home/agent": root / "home", "/tmp": root / "tmp"}
        for inside, host in mounts.items():
            if path == inside or path.startswith(inside + "/"):
                target = (host / path[len(inside) :].lstrip("/")).resolve()
                if target != host.resolve() and host.resolve() not in target.parents:
                    raise SandboxError(f"path escapes the sandbox: {path}")
                return target
        raise SandboxError(f"not a writable sandbox path: {path}")

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self._host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(target, mode)

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        target = self._host_path(path)
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read(limit)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in list(self._procs):
            await self._kill(proc)
        await asyncio.to_thread(shutil.rmtree, self.root, True)

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
