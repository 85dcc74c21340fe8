"""`landlock` sandbox backend: Landlock + seccomp + rlimits, for hosts and containers where namespaces are not
available (e.g. the Space image: uid 1000 under docker's default seccomp, where bubblewrap cannot start).

Each sandbox is a private host directory (work tree, HOME, TMPDIR), laid out and cloned like `local`'s. Every command
runs under `confine.py` (a launcher run by the server's interpreter): rlimits, capabilities dropped, no_new_privs, a
Landlock domain and a seccomp filter, with the launcher as child subreaper that kills every descendant when the
command ends, at the sandbox's deadline, when asked, or when the server dies.

What a command can reach:
- Files: read+exec on /usr, /bin, /lib*, a few /etc files, /proc, the Python prefix, the task runtime and the agent
  installs (`spec.ro_mounts`, host paths); read-write on its own work tree, HOME and TMPDIR; a few /dev files.
  Nothing else: not the server's data dir (results, capture store), its checkout or config, other sandboxes' trees.
  A grant that would cover the data dir, the results, the capture store or the temp dir is refused at create.
- Network: TCP to 127.0.0.1:<the server's capture-only port> and nothing else, and only for `relay=True` commands
  (the others get no port at all); the connection is made by the launcher from its own copy of the address, so
  Landlock's port-only TCP rule (which would let a remote host on that port number through) is not what decides.
  No bind or listen; no UDP, raw, netlink, vsock or unix sockets (socketpair excepted); abstract unix sockets and
  signals scoped to the sandbox; ptrace (and /proc/<pid>/environ, fd, mem, cwd) of anything outside it refused.
- Limits: RLIMIT_CPU (deadline x cpus), RLIMIT_AS (memory + room for JS runtimes' reservations), RLIMIT_NOFILE,
  RLIMIT_FSIZE; where cgroups are writable (root on a host) also the cgroup CPU / memory / pid limits of `local`.

Paths: without a mount namespace the work tree cannot be at `spec.workdir` (/testbed). The sandbox's real dirs are
`workdir` / `home` / `tmpdir` (attributes), and the sandbox maps the paths of the usual layout onto them at its API:
`spec.workdir` → work tree, /home/agent → HOME, /tmp → TMPDIR, each `ro_mounts` target → its host path, the task
runtime's mount point → the runtime. The mapping applies to `read_file` / `write_file` paths, `cwd`, `env` values,
the command strings given to `exec` / `start`, and the content of files written with an exec bit (scripts the
pipeline writes and then runs); never to other file contents (patches, prompts). A path the agent itself names
(e.g. an absolute /testbed/... from the prompt) is not mapped: commands start in the real work tree.

NOT isolated, compared with `local` (bubblewrap namespaces):
- processes: no pid namespace: /proc lists every host process (pids, command lines, status), though none outside
  the sandbox can be signalled, traced or have its environ / fds / memory / cwd read;
- files: Landlock checks opens, not lookups: stat(), access(), readlink() of any host path work (metadata and
  existence leak, never content); the system dirs are the host's own, not a minimal tree; no /dev/shm; no pty
  can be made inside (`has_ptys` False): a command that asks (`ptys=N`, the pipeline's agent command when its
  harness `needs_pty`: OpenHands) is handed N pairs the launcher opened before applying Landlock (`gives_ptys`;
  confine.py), the ruleset unchanged: /dev/ptmx, /dev/pts and /dev/tty stay closed to it;
- network: the host's network stack is shared (/proc/net shows the host's sockets); nothing inside can listen, so a
  task whose tests start a local server fails here while it passes under `local`;
- resources: without writable cgroups (the Space image) there is no memory (RSS), pid or CPU-share cap, only
  per-process rlimits; RLIMIT_AS must leave room for V8's WebAssembly reservations (Node's fetch needs > 10 GiB);
- identity: commands run as the server's uid (as root on a host: uid 0 without capabilities); the host's hostname,
  SysV IPC namespace (refused by seccomp) and time are shared;
- kernel surface: the host kernel's syscalls minus a short seccomp deny list (io_uring, namespaces, mount, bpf,
  perf, userfaultfd, keyrings, modules, SysV IPC / POSIX mqueues, non-TCP sockets, tty line disciplines);
- paths: /testbed, /home/agent and /tmp are mapped only at the API (see above), so an agent that writes to an
  absolute /testbed path it was told about fails where `local` would succeed.

Kernel needs: Landlock ABI >= 6 (signal and abstract-socket scoping; Linux 6.12) for the full level. Below it the
backend is unavailable unless SWE_GYM_LANDLOCK_PARTIAL=1 (then: ABI 4-5 "fs+net" — the sandbox could signal the
server; ABI 1-3 "fs" — no TCP port rules either, connect() stays supervised by seccomp). `info` shows the level.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from swe_gym_env.core.assets import cache_dir, package_file, task_runtime_dir
from swe_gym_env.core.settings import setting
from swe_gym_env.core.tempdirs import owned_dir
from swe_gym_env.core.tempdirs import reap_orphans as reap_dirs
from swe_gym_env.server.sandbox import cgroups, confine
from swe_gym_env.server.sandbox.base import PipeProcess, SandboxError, SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.local import ETC_FILES, RUNTIME_MOUNT, LocalSandbox

CONFINE = package_file("swe_gym_env.server.sandbox", "confine.py")
DIR_PREFIX = "swe-gym-ll-"
CAPTURE_PORT_FILE = "capture.port"  # beside the capture socket: the server's capture-only loopback TCP port
PARTIAL_ENV = "SWE_GYM_LANDLOCK_PARTIAL"
AGENT_HOME = "/home/agent"
SYSTEM_RO = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sys/devices/system/cpu"]
EXTRA_ETC = ["protocols", "services", "os-release", "terminfo"]
DEVICES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
AS_HEADROOM_MB = 32 * 1024  # V8 reserves ~10 GiB of address space per WebAssembly memory (Node's fetch has one)
NOFILE = 8192
FSIZE = 4 << 30
SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./+@=:-]+$")
SANDBOX_ENV = {"LANG": "C.UTF-8", "USER": "agent", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}


def system_ro() -> list[str]:
    return [*SYSTEM_RO, *(f"/etc/{n}" for n in (*ETC_FILES, *EXTRA_ETC)), str(Path(sys.base_prefix).resolve())]


def _confine_argv(cfg: dict, argv: list[str]) -> list[str]:
    return [sys.executable, "-I", "-S", str(CONFINE), json.dumps(cfg), "--", *argv]


EXPECTED = {  # the launcher's self-test, confined: what a working confinement gives
    "connect allowed port": "ok",
    "connect other port": "EACCES",
    "udp socket": "EACCES",
    "read outside": "EACCES",
    "write inside": "ok",
}


@functools.cache
def probe() -> dict:
    """Confine a trivial command once (cached), with the launcher's self-test: the kernel's Landlock ABI, the level
    it gives, and whether the confinement holds here (what each probe got), or why it fails."""
    with tempfile.TemporaryDirectory(prefix="swe-gym-llprobe-") as d:
        work = os.path.join(d, "work")
        os.mkdir(work)
        cfg = {"probe": True, "partial": True, "ro": system_ro(), "rw": [work], "dev": DEVICES}
        try:
            r = subprocess.run(_confine_argv(cfg, ["/bin/true"]), capture_output=True, text=True, timeout=60, cwd=work)
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"ok": False, "error": f"the confine launcher did not run: {e}"}
    lines = [*r.stdout.splitlines(), "", ""]
    try:
        report = json.loads(lines[0])  # the launcher's report: ABI, level, what is missing
    except ValueError:
        report = {}
    try:
        report["self_test"] = json.loads(lines[1])  # the confined child's
    except ValueError:
        report["self_test"] = {}
    expected = {**EXPECTED, "signal launcher": "EPERM" if report.get("abi", 0) >= confine.FULL_ABI else "ok"}
    wrong = {k: v for k, v in report["self_test"].items() if expected.get(k) != v}
    report["ok"] = r.returncode == 0 and not wrong and bool(report["self_test"])
    if r.returncode != 0:
        report["error"] = r.stderr.strip()[-500:] or f"exit {r.returncode}"
    elif not report["ok"]:
        report["error"] = f"the confinement does not hold here: {wrong or 'no self-test'} (expected {expected})"
    return report


def partial_allowed() -> bool:
    return setting("landlock_partial")  # PARTIAL_ENV


def preflight() -> tuple[bool, str]:
    if not (task_runtime_dir() / ".ready").is_file():
        return False, f"task runtime missing at {task_runtime_dir()}: run `swe-gym-env setup`"
    report = probe()
    abi, lvl = report.get("abi", 0), report.get("level", "none")
    if not report["ok"]:
        return False, f"landlock ABI {abi}: cannot confine here: {report.get('error')}"
    if report.get("missing") and not partial_allowed():
        return False, (
            f"landlock ABI {abi} gives only {lvl!r} isolation (lacks {'; '.join(report['missing'])}): "
            f"refused; set {PARTIAL_ENV}=1 to run with it anyway"
        )
    cg = cgroups.mode()
    limits = f"rlimits + cgroup {cg}" if cg else "rlimits only (no memory/pid cap: cgroups not writable)"
    warn = f"; PARTIAL ({PARTIAL_ENV}=1): lacks {'; '.join(report['missing'])}" if report.get("missing") else ""
    return True, (
        f"landlock ABI {abi}: {lvl} isolation; connect() only to the capture port (made by the launcher); seccomp: "
        f"TCP sockets only, no bind/listen/io_uring/namespaces; {limits}{warn}"
    )


def _kill_inside(root: Path) -> None:
    """SIGKILL processes whose cwd is under `root` (a dead server's sandbox: its launcher died with it)."""
    prefix = str(root) + "/"
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if cwd == str(root) or cwd.startswith(prefix):
                try:
                    os.kill(int(name), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _reap_orphans() -> list[str]:
    for path in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        pid = path.name[len(DIR_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _kill_inside(path)
    return reap_dirs(DIR_PREFIX) + cgroups.reap_orphans(DIR_PREFIX)


def _overlaps(grant: Path, secret: Path) -> bool:
    return grant == secret or grant in secret.parents or secret in grant.parents


class LandlockSandbox(LocalSandbox):
    """`local`'s layout and clone (its work tree, HOME and TMPDIR are host dirs), confined without namespaces."""

    reap_orphans = staticmethod(_reap_orphans)
    preflight = staticmethod(preflight)
    # No pty can be made inside, and no grant makes one safely: /dev/ptmx alone gives a master whose peer
    # (TIOCGPTPEER, what glibc's openpty uses) Landlock refuses to open (EACCES: the peer is /dev/pts/N); granting
    # /dev/pts as well lets the sandbox open every terminal of the host's devpts instance that its uid owns (an
    # operator's shell among them, measured); a private devpts instance needs mount(2) in a mount namespace, which
    # this backend has not. What it can do: hand a command pairs opened before its Landlock domain exists (`ptys=N`).
    has_ptys = False
    gives_ptys = True

    @property
    def agent_workdir(self) -> str:
        return self.workdir  # no mount namespace: the work tree is where it really is

    def __init__(self, spec: SandboxSpec, root: Path, capture_port: int | None) -> None:
        super().__init__(spec, root)
        self.relay_prefix = ""  # no relay: relay commands connect to the capture port directly
        self.capture_port = capture_port
        self.capture_base_url = f"http://127.0.0.1:{capture_port}/capture" if capture_port else None
        self.workdir, self.home, self.tmpdir = str(root / "testbed"), str(root / "home"), str(root / "tmp")
        runtime = task_runtime_dir()
        self.paths = {spec.workdir: self.workdir, AGENT_HOME: self.home, "/tmp": self.tmpdir}
        self.paths[RUNTIME_MOUNT] = str(runtime)
        for host, inside in spec.ro_mounts.items():
            self.paths[inside] = host
        for inside, host in self.paths.items():
            if not SHELL_SAFE.match(host) or not SHELL_SAFE.match(inside):
                raise SandboxError(f"the landlock backend needs plain paths (shell-safe): {inside} -> {host}")
        self.ro = [*system_ro(), str(runtime), *spec.ro_mounts]
        self.rw = [self.workdir, self.home, self.tmpdir]
        self._check_grants()
        # Real paths map to themselves: this sandbox's dirs live under the host's /tmp, which is itself mapped, and a
        # real path must not be mapped again. Longer alternatives are tried first, so a real path wins over /tmp.
        self._map = {**{p: p for p in (str(root), *self.ro, *self.paths.values())}, **self.paths}
        alternatives = "|".join(re.escape(p) for p in sorted(self._map, key=len, reverse=True))
        self._mapping = re.compile(rf"(?<![\w.~/-])({alternatives})(?![\w.~-])")
        self._relay_next = False

    def _check_grants(self) -> None:
        data = Path(setting("data_dir") or cache_dir()).resolve()
        # the grading store holds each task's canaries (the mutants a 1.0 must fail): never the agent's to read
        secrets = [data / "results", data / "capture.sqlite", data / "grading"]
        secrets.append(cache_dir().resolve() / "capture.sqlite")
        tmp = Path(tempfile.gettempdir()).resolve()
        for g in self.ro + self.rw:
            grant = Path(g).resolve()
            hit = [str(s) for s in secrets if _overlaps(grant, s)]
            if grant == tmp or grant in tmp.parents:
                hit.append(f"{tmp} (every sandbox's tree)")
            if hit:
                raise SandboxError(f"refusing to grant {g} to a sandbox: it would expose {', '.join(hit)}")

    def to_host(self, text: str) -> str:
        """The usual layout's paths (spec.workdir, /home/agent, /tmp, mounts) in `text` → this sandbox's real ones."""
        return self._mapping.sub(lambda m: self._map[m.group(1)], text)

    @classmethod
    async def create(cls, spec: SandboxSpec) -> LandlockSandbox:
        ok, why = await asyncio.to_thread(preflight)
        if not ok:
            raise SandboxUnavailable(f"the landlock backend cannot run here: {why}")
        if not spec.repo_source:
            raise SandboxError("the landlock backend needs a repository source (this task needs an image backend)")
        port = None
        if spec.capture_socket is not None:
            port_file = Path(spec.capture_socket).parent / CAPTURE_PORT_FILE
            try:
                port = int(port_file.read_text().strip())
            except (OSError, ValueError) as e:
                raise SandboxError(f"no capture TCP port beside {spec.capture_socket} ({port_file}): {e}") from e
        root = owned_dir(DIR_PREFIX)
        try:
            sbx = cls(spec, root, port)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return await sbx._boot(sbx._lay_out)  # local's layout, closed again if a step fails

    # -- commands ----------------------------------------------------------------------------------------------
    def script(self, cmd: str | list[str], relay: bool, env: dict[str, str] | None, cwd: str | None) -> str:
        text = self.to_host(super().script(cmd, relay, env, cwd))
        self._relay_next = relay  # read by the _spawn that follows at once (no await in between, see base)
        return text

    def _env(self) -> dict[str, str]:
        path = f"{task_runtime_dir()}/bin:/usr/local/bin:/usr/bin:/bin"
        env = {"PATH": path, "HOME": self.home, "TMPDIR": self.tmpdir, **SANDBOX_ENV}
        return {**env, **{k: self.to_host(v) for k, v in self.spec.env.items()}}  # non-secret values only

    def _config(self, relay: bool, ptys: int = 0) -> dict:
        limits = self.spec.limits
        return {
            "ptys": ptys,
            "ro": self.ro,
            "rw": self.rw,
            "dev": DEVICES,
            "ports": [self.capture_port] if relay and self.capture_port else [],
            "deadline": self.expires_at,
            "parent": os.getpid(),
            "partial": partial_allowed(),
            "rlimits": {
                "cpu": math.ceil(limits.cpus * self.spec.deadline_s) + 60,
                "as": (limits.memory_mb + AS_HEADROOM_MB) << 20,
                "nofile": NOFILE,
                "fsize": FSIZE,
            },
        }

    async def _spawn(self, script: str, stdin: bytes | None) -> PipeProcess:
        return await self._spawn_ptys(script, stdin, 0)

    async def _spawn_ptys(self, script: str, stdin: bytes | None, ptys: int) -> PipeProcess:
        relay, self._relay_next = self._relay_next, False
        argv = self._in_cgroup(_confine_argv(self._config(relay, ptys), ["/bin/sh", "-c", script]))

        async def kill(proc: asyncio.subprocess.Process) -> None:
            """The launcher kills every descendant on SIGTERM; if it is stuck, its process group goes."""
            try:
                os.kill(proc.pid, signal.SIGTERM)
                await asyncio.wait_for(proc.wait(), 5)
            except ProcessLookupError:
                return
            except TimeoutError:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        return await PipeProcess.spawn(argv, stdin, kill, env=self._env(), cwd=self.workdir)

    # -- files -------------------------------------------------------------------------------------------------
    def _host_path(self, path: str) -> Path:
        for inside, real in ((self.spec.workdir, self.workdir), (AGENT_HOME, self.home), ("/tmp", self.tmpdir)):
            if path == real or path.startswith(real + "/"):  # the real path of a writable dir: as its usual one
                path = inside + path[len(real) :]
                break
        return super()._host_path(path)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if mode & 0o111:  # a script the pipeline will run: its paths are mapped like a command's
            try:
                data = self.to_host(data.decode("utf-8")).encode("utf-8")
            except UnicodeDecodeError:
                pass
        await super().write_file(path, data, mode)
