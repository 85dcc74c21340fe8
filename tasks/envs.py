"""Task environments: where a task's tests (and its agent) run with the dependencies the task declares.

- In an image (SWE-Gym, SWE-bench, SWE-rebench and our stand-ins): the image's own env, conda `testbed` at
  /opt/miniconda3/envs/testbed, activated by `source /opt/miniconda3/bin/activate && conda activate testbed`.
- On `local` (and the docker backend's default image), for a task with an `install_config` and a local repository:
  a venv per distinct requirement set (python, packages, pip_packages, pre_install, install; plus the repo and
  base_commit when `install` or requirements files read the repo), built once on the host side with network and kept
  under the task runtime (`task_runtime_dir()/envs/<key>`), which both backends already mount read-only at
  `/opt/swe-gym/runtime`: so the venv is at `/opt/swe-gym/runtime/envs/<key>` inside every such sandbox and
  nothing else needs mounting. Two tasks' dependencies never collide: each activates only its own key.

The venv is built inside a bubblewrap box that sees the network but nothing of the host's files except /usr, a few
/etc files, the host Python's prefix (read-only), the venv (at its in-sandbox path), a clone of the repository at
base_commit (at the task's workdir) and a pip cache: row data is untrusted, and `install` runs the repo's build.
Because the box mounts both at the paths the sandbox uses, the venv's scripts and the repo's editable install
(`pip install -e .` → a .pth / finder pointing at /testbed) are valid inside sandboxes as they are.

`Task.env_activation` (set by the loader, one shell line) chooses at run time: the image's conda env when
/opt/miniconda3/bin/activate exists, else this venv (exit 86 with a message when it was never built). Grading and
the task's setup script run it first; the agent's process must be started after it too (rollout pipeline).

A declared dependency that cannot be installed is an `EnvError` naming it (and the field that declared it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swe_gym_env.core.assets import RUNTIME_MOUNT, cache_dir, task_runtime_dir
from swe_gym_env.core.procs import file_lock, system_binds
from swe_gym_env.tasks.models import InstallConfig, Task

ENVS_MOUNT = f"{RUNTIME_MOUNT}/envs"  # RUNTIME_MOUNT: where `local` and docker's default image mount task_runtime_dir()
CONDA_ACTIVATE_SCRIPT = "/opt/miniconda3/bin/activate"
CONDA_ACTIVATE = f"source {CONDA_ACTIVATE_SCRIPT} && conda activate testbed"
SCHEMA = 1  # bump when the way envs are built changes (a new key for every env)
STEP_TIMEOUT_S = 1200
SYSTEM_PKG_RE = re.compile(r"^\s*(?:sudo\s+)?(apt-get|apt|yum|dnf|apk|conda|mamba)\b")
APT_INSTALL_RE = re.compile(r"\b(?:apt-get|apt)\s+(?:-\S+\s+)*install\b(.*)")
PIP_CULPRIT_RES = [
    re.compile(r"No matching distribution found for ([^\s]+)"),
    re.compile(r"Could not find a version that satisfies the requirement ([^\s]+)"),
    re.compile(r"Failed to build ([^\s]+)"),
    re.compile(r"Failed building wheel for ([^\s]+)"),
    re.compile(r"Invalid requirement: '([^']+)'"),
]
ETC_FILES = ["passwd", "group", "nsswitch.conf", "hosts", "resolv.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d"]
ETC_FILES += ["localtime", "alternatives", "ssl", "ca-certificates", "mime.types", "gai.conf", "host.conf"]
PASSED_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "PIP_INDEX_URL")


class EnvError(RuntimeError):
    """A task environment cannot be built; the message names the dependency or command and the field declaring it."""


@dataclass(frozen=True)
class TaskEnv:
    key: str
    host_path: Path  # on the host (under task_runtime_dir()/envs)
    sandbox_path: str  # inside `local` / docker-default sandboxes
    activation: str  # one shell line: activates this venv (what Task.env_activation runs on local)
    python: str = ""  # the Python version the venv runs
    notes: tuple[str, ...] = field(default_factory=tuple)  # e.g. a requested Python that is not available here


def envs_root() -> Path:
    return task_runtime_dir() / "envs"


def needs_repo(cfg: InstallConfig) -> bool:
    """Whether building the env reads the repository (then its identity is part of the requirement set)."""
    return bool(cfg.install or cfg.reqs_path or any(not SYSTEM_PKG_RE.match(line) for line in cfg.pre_install))


def requirement_set(cfg: InstallConfig, repo: str, base_commit: str) -> dict[str, Any]:
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "host_python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "host_prefix": str(Path(sys.base_prefix).resolve()),
        **cfg.model_dump(mode="json"),
    }
    if needs_repo(cfg):
        data |= {"repo": repo, "base_commit": base_commit}
    return data


def env_key(cfg: InstallConfig, repo: str, base_commit: str) -> str:
    blob = json.dumps(requirement_set(cfg, repo, base_commit), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def local_activation(key: str) -> str:
    """Shell line that activates the `local` venv `key`, or stops with a message when it was never built."""
    d = f"{ENVS_MOUNT}/{key}"
    return (
        f'SWE_GYM_TASK_ENV={d}; if [ -x "$SWE_GYM_TASK_ENV/bin/python" ]; then export VIRTUAL_ENV="$SWE_GYM_TASK_ENV" '
        f'PATH="$SWE_GYM_TASK_ENV/bin:$PATH"; unset PYTHONHOME; else echo "swe-gym: task environment '
        f'$SWE_GYM_TASK_ENV is not built (prepare_env builds it on the host)" >&2; exit 86; fi'
    )


def activation_for(cfg: InstallConfig | None, repo: str, base_commit: str, image: bool, local: bool) -> str | None:
    """The env_activation line of a row: the image's conda env where the image has one; the `local` venv of its
    requirement set where the row can run on `local` (a local repository) and no conda env is there."""
    conda = f"if [ -f {CONDA_ACTIVATE_SCRIPT} ]; then {CONDA_ACTIVATE}; fi"
    if cfg is None or not local:
        return conda if image else None
    key = env_key(cfg, repo, base_commit)
    if not image:
        return local_activation(key)
    return f"if [ -f {CONDA_ACTIVATE_SCRIPT} ]; then {CONDA_ACTIVATE}; else {local_activation(key)}; fi"


def task_env(task: Task) -> TaskEnv | None:
    """The `local` venv a task uses (built or not); None when the task has none (no install_config or no repo)."""
    if task.install_config is None or not task.repo_source:
        return None
    key = env_key(task.install_config, task.repo, task.base_commit)
    host = envs_root() / key
    meta = read_meta(host)
    return TaskEnv(
        key=key,
        host_path=host,
        sandbox_path=f"{ENVS_MOUNT}/{key}",
        activation=local_activation(key),
        python=meta.get("python", ""),
        notes=tuple(meta.get("notes", [])),
    )


def read_meta(host: Path) -> dict[str, Any]:
    try:
        return json.loads((host / "swe-gym-env.json").read_text())
    except (OSError, ValueError):
        return {}


def env_ready(task: Task) -> bool:
    env = task_env(task)
    return env is not None and (env.host_path / ".ready").is_file()


async def prepare_env(task: Task) -> TaskEnv | None:
    """Build (once; cached by key) the `local` venv of a task; None when the task needs none. Raises `EnvError`."""
    import asyncio

    env = task_env(task)
    if env is None:
        return None
    if not (env.host_path / ".ready").is_file():
        await asyncio.to_thread(build_env, task)
    return task_env(task)


# -- building ---------------------------------------------------------------------------------------------------------


def _host_python(requested: str | None) -> tuple[str, str, list[str]]:
    """(interpreter path, its X.Y version, notes): the requested version where this host has it, else the host's."""
    own = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    if not requested or requested == own or requested.startswith(own + "."):
        return base, own, []
    want = ".".join(requested.split(".")[:2])
    for d in ("/usr/bin", "/usr/local/bin"):
        cand = Path(d) / f"python{want}"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand), want, []
    return base, own, [f"python {requested} requested; not available on this host: the venv runs python {own}"]


def _system_lines(cfg: InstallConfig) -> tuple[list[str], list[str]]:
    """(system package lines, other pre_install lines)."""
    system = [line for line in cfg.pre_install if SYSTEM_PKG_RE.match(line)]
    return system, [line for line in cfg.pre_install if line not in system]


def check_system_packages(lines: list[str], instance_id: str) -> None:
    """`local` cannot run a row's apt-get: the packages it names must already be on the host (else: named)."""
    missing: list[str] = []
    for line in lines:
        tool = SYSTEM_PKG_RE.match(line)
        assert tool is not None
        if tool.group(1) not in ("apt-get", "apt"):
            raise EnvError(
                f"task environment for {instance_id}: install_config.pre_install runs {tool.group(1)!r} "
                f"({line[:120]!r}), which the local backend cannot do: use an image backend"
            )
        m = APT_INSTALL_RE.search(line)
        if not m:
            continue  # apt-get update and the like
        for pkg in re.split(r"[\s;&|]+", m.group(1)):
            if not pkg or pkg.startswith("-") or not re.match(r"^[a-z0-9][a-z0-9.+:=~-]*$", pkg):
                continue
            name = pkg.split("=")[0]
            r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
            if r.returncode != 0 or "install ok installed" not in r.stdout:
                missing.append(name)
    if missing:
        raise EnvError(
            f"task environment for {instance_id}: system packages from install_config.pre_install are not installed "
            f"on this host: {', '.join(missing)} (the local backend cannot apt-get them: install them on the host, "
            "or use an image backend)"
        )


def _bwrap_argv(env_dir: Path, mount: str, clone: Path | None, workdir: str, pip_cache: Path) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise EnvError("bubblewrap is not installed: `apt-get install bubblewrap` (task environments build in it)")
    args = [bwrap, "--die-with-parent", "--unshare-all", "--share-net", "--new-session", "--cap-drop", "ALL"]
    args += system_binds(ETC_FILES)
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    base = str(Path(sys.base_prefix).resolve())
    args += ["--ro-bind", base, base, "--bind", str(env_dir), mount, "--bind", str(pip_cache), "/tmp/pip-cache"]
    if clone is not None:
        args += ["--bind", str(clone), workdir]
    env = {
        "PATH": f"{mount}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp/home",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "VIRTUAL_ENV": mount,
        "PIP_CACHE_DIR": "/tmp/pip-cache",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_PROGRESS_BAR": "off",
        "PIP_RETRIES": "2",
        "PIP_DEFAULT_TIMEOUT": "60",
        "PIP_CONFIG_FILE": "/dev/null",  # the host's pip configuration (indexes, constraints) is not the task's
        **{k: os.environ[k] for k in PASSED_ENV if k in os.environ},
    }
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        env["PIP_CERT"] = env["SSL_CERT_FILE"] = "/etc/ssl/certs/ca-certificates.crt"
    args += ["--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    return [*args, "--chdir", workdir if clone is not None else "/tmp"]


def _run(argv: list[str], script: str) -> tuple[int, str]:
    try:
        r = subprocess.run(
            [*argv, "/bin/sh", "-c", script],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=STEP_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {STEP_TIMEOUT_S}s"
    return r.returncode, r.stdout.decode("utf-8", "replace")


def _pip_culprit(output: str, candidates: list[str]) -> str:
    for rx in PIP_CULPRIT_RES:
        if m := rx.search(output):
            return m.group(1)
    return " / ".join(candidates)


def _last_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-800:]


def _clone(repo_source: str, base_commit: str, dest: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    env["HOME"] = str(dest.parent)
    git = ["git", "-c", "core.hooksPath=/dev/null", "-c", "advice.detachedHead=false"]
    for argv in (
        [*git, "clone", "-q", "--no-checkout", "--", repo_source, str(dest)],
        [*git, "-C", str(dest), "checkout", "-q", base_commit],
    ):
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise EnvError(f"could not check out {base_commit[:12]} of {repo_source}: {r.stderr.strip()[:300]}")


def build_env(task: Task, log=None) -> Path:
    """Build the `local` venv of ``task`` (blocking; a no-op when built). Raises `EnvError` naming what failed."""
    env = task_env(task)
    cfg = task.install_config
    if env is None or cfg is None:
        raise EnvError(f"task {task.instance_id} declares no environment (no install_config or no local repository)")
    with file_lock(envs_root() / f".{env.key}.lock"):
        if not (env.host_path / ".ready").is_file():
            _build_locked(task, env, cfg, log)
    return env.host_path


def _build_locked(task: Task, env: TaskEnv, cfg: InstallConfig, log) -> None:
    """The venv built in a scratch folder beside the envs, then renamed into place (under the env's lock)."""
    t0 = time.monotonic()
    system, other_pre = _system_lines(cfg)
    check_system_packages(system, task.instance_id)
    if cfg.env_yml_path or (cfg.packages or "").strip().endswith((".yml", ".yaml")):
        raise EnvError(
            f"task environment for {task.instance_id}: install_config names a conda environment file "
            f"({cfg.env_yml_path or cfg.packages}), which the local backend cannot build: use an image backend"
        )
    python, version, notes = _host_python(cfg.python)
    envs_root().mkdir(parents=True, exist_ok=True)
    pip_cache = cache_dir() / "pip-cache"
    pip_cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=envs_root(), prefix=f".build-{env.key}-") as tmp:
        work = Path(tmp)
        venv_dir = work / "venv"
        venv_dir.mkdir()
        clone = None
        if needs_repo(cfg) and task.repo_source:
            clone = work / "repo"
            _clone(task.repo_source, task.base_commit, clone)
        step = _Steps(task.instance_id, _bwrap_argv(venv_dir, env.sandbox_path, clone, task.workdir, pip_cache), log)
        step(f"{shlex.quote(python)} -m venv {shlex.quote(env.sandbox_path)}", "python (creating the venv)")
        _install(step, cfg, other_pre)
        freeze = step("python -m pip freeze --all", "python (listing the venv)")
        real = step("python -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", "python").strip()
        meta = {
            "key": env.key,
            "instance_id": task.instance_id,
            "requirement_set": requirement_set(cfg, task.repo, task.base_commit),
            "python": real or version,
            "notes": notes,
            "freeze": [line for line in freeze.splitlines() if line.strip()],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_s": round(time.monotonic() - t0, 1),
        }
        (venv_dir / "swe-gym-env.json").write_text(json.dumps(meta, indent=1) + "\n")
        (venv_dir / ".ready").write_text("ok\n")
        if env.host_path.exists():  # a half-built leftover (no .ready): replace it
            shutil.rmtree(env.host_path)
        os.rename(venv_dir, env.host_path)


class _Steps:
    """One build step: a script run in the build box; a failure names the install_config field it came from."""

    def __init__(self, instance_id: str, argv: list[str], log) -> None:
        self.instance_id, self.argv, self.log = instance_id, argv, log

    def __call__(self, script: str, what: str, culprits: list[str] | None = None) -> str:
        if self.log:
            self.log(f"{self.instance_id}: {what}")
        rc, out = _run(self.argv, script)
        if rc == 0:
            return out
        where = f"task environment for {self.instance_id}"
        if culprits is not None:
            raise EnvError(
                f"{where}: could not install {_pip_culprit(out, culprits)} (declared in "
                f"install_config.{what}): {_last_lines(out)}"
            )
        raise EnvError(f"{where}: install_config.{what} failed (exit {rc}): {_last_lines(out)}")


def _install(step: _Steps, cfg: InstallConfig, other_pre: list[str]) -> None:
    """The row's packages, requirement files, pre-install lines and install command, in that order."""
    q = shlex.quote
    pip = "python -m pip install"
    conda_names = [] if not cfg.packages or cfg.packages == "requirements.txt" else cfg.packages.split()
    reqs = [*cfg.pip_packages, *conda_names]
    if reqs:
        step(f"{pip} {' '.join(q(r) for r in reqs)}", "pip_packages", [*reqs])
    if cfg.packages == "requirements.txt" or cfg.reqs_path:
        files = cfg.reqs_path or ["requirements.txt"]
        step(f"{pip} {' '.join('-r ' + q(f) for f in files)}", "reqs_path", files)
    for line in other_pre:
        step(line, f"pre_install ({line[:80]!r})")
    if cfg.install:
        step(cfg.install, f"install ({cfg.install[:80]!r})")


# -- what `info` reports -----------------------------------------------------------------------------------------------


def envs_status(tasks: list[Task] | tuple[Task, ...]) -> tuple[int, int]:
    """(built, needed) `local` task venvs of these tasks (distinct keys)."""
    keys = {e.key: e for t in tasks if (e := task_env(t)) is not None}
    return sum((e.host_path / ".ready").is_file() for e in keys.values()), len(keys)


def images_status(tasks: list[Task] | tuple[Task, ...], timeout: float = 30) -> tuple[int, int, list[str]]:
    """(present, needed, missing names) of the tasks' images in the local docker daemon (docker CLI; no pull)."""
    names = sorted({t.image for t in tasks if t.image})
    if not names:
        return 0, 0, []
    docker = shutil.which("docker")
    if docker is None:
        return 0, len(names), names
    try:
        r = subprocess.run(
            [docker, "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return 0, len(names), names
    have = set(r.stdout.split()) if r.returncode == 0 else set()
    missing = [n for n in names if n not in have and f"{n}:latest" not in have]
    return len(names) - len(missing), len(names), missing
