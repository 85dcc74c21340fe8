"""`docker` sandbox backend: one container per sandbox from the task's image (e.g. SWE-Gym's
`xingyaoww/sweb.eval.x86_64.*`), driven with the docker CLI.

- Network: `--network none`; the only way out is the server's capture unix socket mounted at
  /run/swe-gym/capture.sock, to which an in-container relay forwards 127.0.0.1:RELAY_PORT (needs python3 in the
  image: /usr/bin/python3 or SWE-Gym's /opt/miniconda3/bin/python3).
- Mounts (read-only): the capture socket, the relay script, the agent bundle (spec.ro_mounts) and, for a task with
  a local repository, its git bundle (cloned inside at start). Images without a repo source must hold the repo at
  the workdir (SWE-Gym images: /testbed). The host's task runtime (Python venv with pytest, plus the host Python's own
  prefix when it is not under /usr) is mounted and put on PATH only for the default image (built by
  scripts/setup_docker.sh from Debian bookworm, the host's distribution, so host binaries run in it).
- The agent in any image: its bundle (server/agents/bundle.py) carries its own runtime (Pi: Node; OpenCode: its
  binary and ripgrep), so the image needs no Node, curl or pip; boot checks the image's glibc against the bundle's
  floor and runs the bundle's probe (`check_bundles`: a clear boot error otherwise; the cost is in `bundle_s`).
- Environment through `--env-file` (never `-e K=V`, which is argv); secrets through a 0600 file in the container.
- Expiry: the container's main process is `sleep <deadline>` under docker-init with `--rm`, so it removes itself at
  its deadline even if no server is left; labels `swe-gym.server/host/pid/rollout/expires` let a restarted
  server reap containers whose server process is gone (`reap_orphans`).
- Every command runs as its own session under `timeout -s KILL`; its session id is kept in a pid file so `kill`
  stops the whole tree inside the container (killing the `docker exec` client alone would not).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from swe_gym_env.core.assets import task_runtime_dir
from swe_gym_env.core.settings import setting
from swe_gym_env.core.tempdirs import owner_dead, server_id
from swe_gym_env.server.sandbox.base import (
    LABEL_PREFIX,
    RELAY_PORT,
    SECRETS_FILE,
    ExecResult,
    PipeProcess,
    SandboxBase,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    strip_history_script,
)
from swe_gym_env.server.sandbox.local import RELAY_SCRIPT, RUNTIME_MOUNT, SOCKET_DIR, host_binary, relay_prefix

BUNDLE_MOUNT = "/opt/swe-gym/repo"
HOME = "/home/agent"
FIND_PYTHON = "PY=$(command -v python3 || echo /opt/miniconda3/bin/python3); "


def default_image() -> str:
    """The base image of a sandbox whose spec names none ($SWE_GYM_DOCKER_IMAGE, read at use)."""
    return setting("docker_image")


def docker_bin() -> str:
    return host_binary(
        "docker", "the docker CLI is missing: apt-get install docker.io (or run scripts/setup_docker.sh)"
    )


async def docker(*args: str, stdin: bytes | None = None, timeout: float = 120) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        docker_bin(),
        *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SandboxError(f"docker {args[0]} timed out after {timeout:.0f}s") from None
    return proc.returncode or 0, out, err


def _sync_docker(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([docker_bin(), *args], capture_output=True, text=True, timeout=timeout)


def preflight(wait_s: float = 10) -> tuple[bool, str]:
    """Whether dockerd answers and has the default image. ``wait_s`` bounds each docker call: the server's probes
    keep the default; a caller that may wait for a daemon busy with a build (the test setup) passes more."""
    try:
        r = _sync_docker("version", "--format", "{{.Server.Version}}", timeout=wait_s)
        if r.returncode != 0:
            return False, f"no docker daemon: {r.stderr.strip()[:200]}; start one (scripts/setup_docker.sh)"
        image = default_image()
        have = _sync_docker("image", "inspect", image, timeout=wait_s).returncode == 0
    except SandboxUnavailable as e:
        return False, str(e)
    except subprocess.TimeoutExpired as e:
        return (
            False,
            f"the docker daemon does not answer `docker {e.cmd[1]}` within {wait_s:.0f} s: start dockerd "
            "(scripts/setup_docker.sh) or wait for its current work",
        )
    if not have:
        return False, (
            f"dockerd {r.stdout.strip()} answers, but the default image {image} is MISSING: build it "
            "(scripts/setup_docker.sh)"
        )
    return True, f"dockerd {r.stdout.strip()}; default image {image} present"


def reap_orphans() -> list[str]:
    """Containers labelled with this server's id whose server process is gone, or past their deadline."""
    try:
        r = _sync_docker(
            "ps",
            "-a",
            "--filter",
            f"label={LABEL_PREFIX}.server={server_id()}",
            "--format",
            f'{{{{.ID}}}} {{{{.Label "{LABEL_PREFIX}.host"}}}} {{{{.Label "{LABEL_PREFIX}.pid"}}}} '
            f'{{{{.Label "{LABEL_PREFIX}.expires"}}}}',
        )
    except (SandboxUnavailable, subprocess.TimeoutExpired):
        return []
    if r.returncode != 0:
        return []
    doomed = []
    for line in r.stdout.splitlines():
        cid, host, pid, expires = [*line.split(), "", "", "", ""][:4]
        if owner_dead({"host": host, "pid": pid}) or (expires.isdigit() and int(expires) < time.time()):
            doomed.append(cid)
    if doomed:
        _sync_docker("rm", "-f", *doomed, timeout=120)
    return [f"docker:{c}" for c in doomed]


def _image_path(inspect_env: bytes) -> str | None:
    """PATH from `docker image inspect --format '{{json .Config.Env}}'` output (None: the image sets none)."""
    try:
        env = json.loads(inspect_env or b"null") or []
    except ValueError:
        return None
    path = next((e.partition("=")[2] for e in env if isinstance(e, str) and e.startswith("PATH=")), None)
    return path if path and "\n" not in path else None


class DockerSandbox(SandboxBase):
    reap_orphans = staticmethod(reap_orphans)
    preflight = staticmethod(preflight)
    host_mounts = True
    takes_repo_source = True  # a git bundle mounted and cloned inside; or the repo already in the task's image
    uses_image = True  # the task's image, else the default one (scripts/setup_docker.sh)

    def __init__(self, spec: SandboxSpec, name: str, image: str) -> None:
        super().__init__(spec)
        self.name = name
        self.image = image
        self._started = False
        if spec.capture_socket is not None:
            self.capture_base_url = f"http://127.0.0.1:{RELAY_PORT}/capture"
            self.relay_prefix = FIND_PYTHON + relay_prefix('"$PY"')  # the image's Python, wherever it is

    @classmethod
    async def create(cls, spec: SandboxSpec) -> DockerSandbox:
        image = spec.image or default_image()
        rc, out, err = await docker("image", "inspect", "--format", "{{json .Config.Env}}", image, timeout=120)
        if rc != 0:
            if b"no such image" not in err.lower():
                raise SandboxUnavailable(f"no docker daemon: {err.decode()[:200]}; start one (scripts/setup_docker.sh)")
            raise SandboxUnavailable(
                f"docker image {image!r} is not present and images are not pulled here: `docker pull`/`docker load` "
                "it first (scripts/setup_docker.sh builds the default image)"
            )
        sbx = cls(spec, f"swe-gym-{uuid.uuid4().hex[:16]}", image)
        sbx.image_path = _image_path(out)
        return await sbx._boot(sbx._start, sbx._prepare, sbx.check_bundles)

    def _run_argv(self, env_file: str) -> list[str]:
        spec, lim = self.spec, self.spec.limits
        labels = {**spec.labels, "expires": str(int(self.expires_at))}
        args = ["run", "-d", "--rm", "--init", "--name", self.name, "--network", "none", "--env-file", env_file]
        args += ["--cpus", str(lim.cpus), "--memory", f"{lim.memory_mb}m", "--pids-limit", str(lim.pids)]
        args += ["--security-opt", "no-new-privileges", "--workdir", "/"]
        for k, v in labels.items():
            args += ["--label", f"{LABEL_PREFIX}.{k}={v}"]
        mounts = {str(RELAY_SCRIPT): "/opt/swe-gym/relay.py", **spec.ro_mounts}
        if spec.capture_socket is not None:
            mounts[str(spec.capture_socket)] = f"{SOCKET_DIR}/capture.sock"
        if spec.repo_source:
            mounts[str(Path(spec.repo_source).resolve())] = BUNDLE_MOUNT
        if spec.image is None:  # the host's Python + pytest venv, as `local` mounts them (same distro)
            base = str(Path(sys.base_prefix).resolve())
            mounts[str(task_runtime_dir())] = RUNTIME_MOUNT
            if not base.startswith("/usr"):
                mounts[base] = base
        for host, inside in mounts.items():
            args += ["--mount", f"type=bind,source={host},target={inside},readonly"]
        return [*args, self.image, "sleep", str(max(1, math.ceil(spec.deadline_s)))]

    image_path: str | None = None  # the image's own PATH (e.g. a conda bin dir first), kept for its commands

    def _env(self) -> dict[str, str]:
        path = self.image_path or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if self.spec.image is None:
            path = f"{RUNTIME_MOUNT}/bin:{path}"
        return {
            "PATH": path,
            "HOME": HOME,
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            **self.spec.env,
        }

    async def _start(self) -> None:
        for k, v in self._env().items():
            if "\n" in v or "\n" in k:
                raise SandboxError(f"environment value for {k[:50]!r} has a newline (not allowed in an env file)")
        fd, env_file = tempfile.mkstemp(prefix="swe-gym-env-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in self._env().items()))
            rc, _, err = await docker(*self._run_argv(env_file), timeout=120)
        finally:
            os.unlink(env_file)
        if rc != 0:
            raise SandboxError(f"docker run failed: {err.decode('utf-8', 'replace').strip()[:500]}")
        self._started = True

    async def _root_exec(self, script: str, timeout: float = 300, stdin: bytes | None = None) -> ExecResult:
        args = ["exec", *(["-i"] if stdin is not None else []), self.name, "/bin/sh", "-c", script]
        rc, out, err = await docker(*args, stdin=stdin, timeout=timeout)
        return ExecResult(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def _prepare(self) -> None:
        q = shlex.quote
        spec = self.spec
        steps = [f"mkdir -p {HOME} /tmp/.swe-gym && chmod 1777 /tmp"]
        steps.append(
            f"printf '[user]\\n\\tname = agent\\n\\temail = agent@sandbox.invalid\\n[safe]\\n\\tdirectory = *\\n' "
            f"> {HOME}/.gitconfig"
        )
        if spec.repo_source:
            steps.append(f"rm -rf {q(spec.workdir)} && git clone -q --no-checkout {BUNDLE_MOUNT} {q(spec.workdir)}")
            if not spec.strip_history:
                steps.append(f"git -C {q(spec.workdir)} checkout -q {q(spec.base_commit)}")
        if spec.base_commit and spec.strip_history:
            steps.append(strip_history_script(spec.workdir, spec.base_commit))
        r = await self._root_exec("set -e\n" + "\n".join(steps))
        if not r.ok:
            raise SandboxError(f"preparing the repository failed: {(r.stderr or r.stdout).strip()[-500:]}")
        if spec.secrets:
            await self.write_file(SECRETS_FILE, self.secrets_file(), 0o600)

    async def _spawn(self, script: str, stdin: bytes | None) -> PipeProcess:
        pidfile = f"/tmp/.swe-gym/p-{uuid.uuid4().hex[:12]}.pid"
        left = str(max(1, math.ceil(self.remaining())))
        inner = f'echo $$ > {pidfile}; exec timeout -s KILL {left} /bin/sh -c "$1"'
        argv = ["exec", *(["-i"] if stdin is not None else []), self.name]
        argv += ["setsid", "-w", "/bin/sh", "-c", inner, "sh", script]

        async def kill(proc: asyncio.subprocess.Process) -> None:
            try:
                script = f"[ -f {pidfile} ] && kill -9 -$(cat {pidfile})"
                await docker("exec", self.name, "/bin/sh", "-c", script, timeout=30)
            except SandboxError:
                pass
            if proc.returncode is None:
                proc.kill()

        return await PipeProcess.spawn([docker_bin(), *argv], stdin, kill)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        script = f'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod {mode:o} "$1"'
        rc, _, err = await docker("exec", "-i", self.name, "/bin/sh", "-c", script, "sh", path, stdin=data)
        if rc != 0:
            raise SandboxError(f"writing {path} failed: {err.decode('utf-8', 'replace').strip()[:300]}")

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        if self._closed:
            raise SandboxError("sandbox is closed")
        script = f'[ -f "$1" ] || exit 44; head -c {int(limit)} -- "$1"'
        rc, out, err = await docker("exec", self.name, "/bin/sh", "-c", script, "sh", path)
        if rc == 44:
            raise FileNotFoundError(path)
        if rc != 0:
            raise SandboxError(f"reading {path} failed: {err.decode('utf-8', 'replace').strip()[:300]}")
        return out

    async def _teardown(self) -> None:
        if self._started:
            try:
                await docker("rm", "-f", self.name, timeout=60)
            except SandboxError:
                pass  # `reap_orphans` and the container's own deadline remove it
