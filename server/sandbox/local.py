"""`local` sandbox backend: bubblewrap.

Each sandbox is a private host directory (testbed, HOME, TMPDIR) that every command sees through a fresh `bwrap`
with its own pid, mount, ipc, uts and network namespaces, inside the sandbox's cgroup (CPU / memory / pid limits,
where the host allows cgroups). The network namespace has only loopback; when a command needs the model, a relay
inside it forwards 127.0.0.1:RELAY_PORT to the server's capture unix socket, which serves /capture and nothing else.
Nothing of the server's files or environment is visible: only /usr, a few /etc files, the Python runtime and the
read-only mounts the spec names. Secrets reach the sandbox as files, never argv; the environment given to bwrap
holds only the spec's non-secret variables.

Expiry: every command runs under `timeout -s KILL <time left>` inside the sandbox and `--die-with-parent`, so a
server killed with SIGKILL takes its commands with it; its dirs and cgroups (named by its pid) are removed by the
next server's `reap_orphans`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from swe_gym_env.core import procs
from swe_gym_env.core.assets import RUNTIME_MOUNT, package_file, task_runtime_dir
from swe_gym_env.core.tempdirs import owned_dir, reap_orphans
from swe_gym_env.server.sandbox import cgroups, pristine
from swe_gym_env.server.sandbox.base import (
    RELAY_PORT,
    SECRETS_FILE,
    PipeProcess,
    SandboxBase,
    SandboxSpec,
    strip_history_script,
)
from swe_gym_env.server.sandbox.errors import SandboxError, SandboxUnavailable

RELAY_SCRIPT = package_file("swe_gym_env.server.sandbox", "relay.py")  # bind-mounted read-only into sandboxes
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
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def relay_prefix(python: str) -> str:
    """Shell that starts the in-sandbox relay (127.0.0.1:RELAY_PORT → the mounted capture socket) and waits for it."""
    return (
        f"{python} /opt/swe-gym/relay.py {RELAY_PORT} {SOCKET_DIR}/capture.sock /tmp/.swe-gym/relay-ready-$$ &\n"
        "i=0; while [ ! -f /tmp/.swe-gym/relay-ready-$$ ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n"
        "[ -f /tmp/.swe-gym/relay-ready-$$ ] || { echo 'capture relay did not start' >&2; exit 97; }\n"
        "rm -f /tmp/.swe-gym/relay-ready-$$"
    )


def system_binds() -> list[str]:
    """bwrap arguments for the host's system files a sandbox sees read-only: /usr, the /bin, /lib, /lib64 and /sbin
    links (or dirs) and the few /etc files in ETC_FILES."""
    return procs.system_binds(ETC_FILES)


def _reap_orphans() -> list[str]:
    """Sandbox dirs and cgroups left by server processes that no longer exist (e.g. killed mid-rollout)."""
    return reap_orphans(DIR_PREFIX) + cgroups.reap_orphans(DIR_PREFIX)


def host_binary(name: str, fix: str) -> str:
    """The path of the host's ``name`` command; `SandboxUnavailable` saying ``fix`` where it has none."""
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(fix)
    return path


def bwrap_path() -> str:
    return host_binary(
        "bwrap", "bubblewrap is not installed: `apt-get install bubblewrap` (the local sandbox needs it)"
    )


@functools.cache
def bwrap_works() -> str | None:
    """Run a trivial sandbox once (cached): None when bwrap can create its namespaces here, else its error. Inside a
    container without privileges (the Space image: uid 1000, docker's default seccomp) it cannot, though installed."""
    argv = [bwrap_path(), "--die-with-parent", "--unshare-all", "--new-session", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    return None if r.returncode == 0 else (r.stderr.strip()[-300:] or f"exit {r.returncode}")


def preflight() -> tuple[bool, str]:
    if shutil.which("bwrap") is None:
        return False, "bubblewrap missing: apt-get install bubblewrap"
    if (err := bwrap_works()) is not None:
        return False, f"bwrap cannot create its sandbox here ({err}): use the landlock backend or a remote one"
    if not (task_runtime_dir() / ".ready").is_file():
        return False, f"task runtime missing at {task_runtime_dir()}: run `swe-gym-env setup`"
    cg = cgroups.mode()
    return True, f"bwrap; limits via cgroup {cg}" if cg else "bwrap; cgroups not writable: no CPU/memory/pid limits"


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class LocalSandbox(SandboxBase):
    reap_orphans = staticmethod(_reap_orphans)
    preflight = staticmethod(preflight)
    host_mounts = True
    takes_repo_source = True  # and needs one: the host's Python runs the tests, there is no image

    def __init__(self, spec: SandboxSpec, root: Path) -> None:
        super().__init__(spec)
        self.root = root
        self.cgroup: cgroups.CgroupSet | None = None
        if spec.capture_socket is not None:
            self.capture_base_url = f"http://127.0.0.1:{RELAY_PORT}/capture"
            self.relay_prefix = relay_prefix("python3")

    @classmethod
    async def create(cls, spec: SandboxSpec) -> LocalSandbox:
        bwrap_path()
        runtime = task_runtime_dir()
        if not (runtime / "bin" / "python").exists():
            raise SandboxUnavailable(f"task runtime missing at {runtime}: run `swe-gym-env setup`")
        if not spec.repo_source:
            raise SandboxError("the local backend needs a repository source (this task needs an image backend)")
        root = owned_dir(DIR_PREFIX)
        sbx = cls(spec, root)
        return await sbx._boot(sbx._lay_out)

    async def _lay_out(self) -> None:
        """The sandbox's dirs, labels, secrets file, cgroup and clone of the repository."""
        root, spec = self.root, self.spec
        for d in ("testbed", "home", "tmp", "tmp/.swe-gym"):
            (root / d).mkdir()
        (root / "labels.json").write_text(json.dumps({**spec.labels, "expires_at": str(int(self.expires_at))}))
        if spec.secrets:
            await self.write_file(SECRETS_FILE, self.secrets_file(), 0o600)
        self.cgroup = await asyncio.to_thread(cgroups.CgroupSet.create, root.name, spec.limits)
        await self._clone()

    async def _clone(self) -> None:
        """The work tree: a copy of the task's pristine tree (cloned and stripped once per task: `pristine`), or a
        clone of its own where the tree cannot be shared (history kept, or a base commit that is not an object id)."""
        testbed, spec = self.root / "testbed", self.spec
        if pristine.cacheable(spec.repo_source, spec.base_commit, spec.strip_history):
            await pristine.copy_into(testbed, spec.repo_source, spec.base_commit, self._prepare)
        else:
            await self._prepare(testbed)
        (self.root / "home" / ".gitconfig").write_text(
            "[user]\n\tname = agent\n\temail = agent@sandbox.invalid\n[safe]\n\tdirectory = *\n"
        )

    async def _prepare(self, testbed: Path) -> None:
        """Clone the spec's repository into the empty dir ``testbed`` at its base commit (history stripped)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **GIT_ENV, "GIT_CONFIG_GLOBAL": "/dev/null"}
        env["HOME"] = str(testbed.parent)
        git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false"]
        steps = [[*git, "clone", "-q", "--no-checkout", "--", self.spec.repo_source, str(testbed)]]
        if self.spec.strip_history:
            steps.append(["/bin/sh", "-c", strip_history_script(str(testbed), self.spec.base_commit)])
        else:
            steps.append([*git, "-C", str(testbed), "checkout", "-q", self.spec.base_commit])
        for argv in steps:  # killed with the rollout: a clone that hangs must not outlive its deadline
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
            )
            try:
                async with asyncio.timeout(300):
                    _, err = await proc.communicate()
            except BaseException as e:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                if isinstance(e, TimeoutError):
                    raise SandboxError(f"preparing the repository timed out: {argv[-1][:60]}") from e
                raise
            if proc.returncode != 0:
                stderr = err.decode("utf-8", "replace").strip()[:500]
                raise SandboxError(f"preparing the repository failed: {argv[-1][:60]}: {stderr}")

    def _argv(self) -> list[str]:
        runtime = task_runtime_dir()
        base = Path(sys.base_prefix).resolve()
        args = [bwrap_path(), "--die-with-parent", "--unshare-all", "--new-session", "--cap-drop", "ALL"]
        args += system_binds()
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
        env = {"PATH": path, "HOME": "/home/agent", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "USER": "agent", **GIT_ENV}
        args += ["--clearenv"]
        for k, v in {**env, **self.spec.env}.items():  # non-secret values only (argv is visible in ps)
            args += ["--setenv", k, v]
        return [*args, "--chdir", self.spec.workdir]

    async def _spawn(self, script: str, stdin: bytes | None) -> PipeProcess:
        left = max(1, math.ceil(self.remaining()))
        argv = [*self._argv(), "--", "timeout", "-s", "KILL", str(left), "/bin/sh", "-c", script]
        return await PipeProcess.spawn(self._in_cgroup(argv), stdin, _kill_group)

    def _in_cgroup(self, argv: list[str]) -> list[str]:
        """``argv`` started inside the sandbox's cgroup, where it has one."""
        if self.cgroup is None:
            return argv
        return ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *self.cgroup.procs_files, "--", *argv]

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

    async def _teardown(self) -> None:
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)
        await asyncio.to_thread(shutil.rmtree, self.root, True)
