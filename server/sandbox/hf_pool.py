"""`hf-pool` sandbox backend: `huggingface_hub.SandboxPool` — many sandboxes (a uid + Landlock each) packed into a few
HF Job hosts, one pool per task image (a pool serves one image; an RL group of 8-16 rollouts shares one task).

- Pools: created lazily, one per image, in a process-wide registry (`pool_for`), closed at server shutdown
  (`close_pools`, from the app's lifespan). Configuration from the environment, checked at first use
  (`pool_config`): SWE_GYM_HF_POOL_SANDBOXES_PER_HOST (8), SWE_GYM_HF_POOL_WARM_UP (0: the first rollout boots the
  first host; N: N hosts booted together when the pool is made), SWE_GYM_HF_POOL_MAX_HOSTS (none),
  SWE_GYM_HF_POOL_IDLE_TIMEOUT_S (600: an empty host shuts down after this long).
- Names: `SandboxPool` takes no labels, so the pool's name (its `hf-sandbox-pool` label) says whose it is:
  `swegym-<server id>-<host hash>-<pid>-<image slug>-<image hash>` (`pool_name`). `reap_orphans` cancels the hosts
  of this server id and host whose pid is gone: a restarted server clears what a killed one left.
- Each sandbox works on its own copy of the image's work tree: pool sandboxes share the host's filesystem and can
  write only under their own home (the file API's root). At create the backend finds that home, copies
  `spec.workdir` (/testbed) into it, and maps the usual layout onto it as `landlock` does (`PathMap`):
  spec.workdir, /home/agent, /tmp and the bundle mount points → `<home>/<path>`, in command strings, cwd, env
  values, file API paths, and the content of files written with an exec bit (scripts the pipeline runs: grading's
  `cd /testbed` lands in the copy). `agent_workdir` is the copy's real path, which the agent's prompt names.
- Commands, files, bundle delivery, failures: as `hf` (this subclasses `HFSandbox`); a pool sandbox's job is its
  host's. Pool sandboxes cannot bind TCP ports (the agent and grading need none).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import shlex
import threading
import time
import uuid
from dataclasses import dataclass

from swe_gym_env.core.tempdirs import HOST, INCARNATION, owner_dead, server_id
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.hf import HFSandbox, in_thread
from swe_gym_env.server.sandbox.hf import preflight as hf_preflight
from swe_gym_env.server.sandbox.remote import own_timeout_s

log = logging.getLogger(__name__)

AGENT_HOME = "/home/agent"
SHELL_SAFE = re.compile(r"^/[A-Za-z0-9_./+@=:-]+$")
HOME_MARK = "/.swe-gym-home"  # written through the file API (rooted at the home) to find the home from inside
POOL_PREFIX = "swegym"
EDITABLE = (  # the sys.path entries the image's site-packages add inside the work tree (one a line)
    "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path {workdir} \\) -prune -o \\( -name '*.pth' "
    "-o -name '*.egg-link' \\) -path '*-packages/*' -print 2>/dev/null | while read -r f; do "
    'grep -h -x -E {pattern} "$f"; done | sort -u; true'
)
ENV = "SWE_GYM_HF_POOL_"


@dataclass(frozen=True)
class PoolConfig:
    sandboxes_per_host: int = 8
    warm_up: int = 0
    max_hosts: int | None = None
    idle_timeout_s: int = 600


def _env_int(name: str, default: int | None, low: int) -> int | None:
    raw = os.environ.get(ENV + name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SandboxError(f"{ENV}{name}={raw[:40]!r} is not a whole number (>= {low})") from None
    if value < low:
        raise SandboxError(f"{ENV}{name}={value} is below {low}")
    return value


def pool_config() -> PoolConfig:
    """The pool settings from the environment; a bad value is a `SandboxError` naming the variable."""
    cfg = PoolConfig(
        sandboxes_per_host=_env_int("SANDBOXES_PER_HOST", 8, 1) or 8,
        warm_up=_env_int("WARM_UP", 0, 0) or 0,
        max_hosts=_env_int("MAX_HOSTS", None, 1),
        idle_timeout_s=_env_int("IDLE_TIMEOUT_S", 600, 60) or 600,
    )
    if cfg.max_hosts is not None and cfg.warm_up > cfg.max_hosts:
        raise SandboxError(f"{ENV}WARM_UP={cfg.warm_up} is over {ENV}MAX_HOSTS={cfg.max_hosts}")
    return cfg


def _owner_prefix() -> str:
    sid = re.sub(r"[^A-Za-z0-9]", "", server_id())[:16] or "x"
    return f"{POOL_PREFIX}-{sid}-{hashlib.sha256(HOST.encode()).hexdigest()[:6]}-"


def pool_name(image: str) -> str:
    """This process's pool for `image`: at most 64 characters of [a-z0-9-], parseable back to its owner."""
    slug = re.sub(r"[^a-z0-9]+", "-", image.lower().rsplit("/", 1)[-1]).strip("-")[:8].strip("-") or "image"
    owner = f"{os.getpid()}-{INCARNATION[:6]}"  # the pid alone repeats in a restarted container (1, 7…)
    return f"{_owner_prefix()}{owner}-{slug}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


# -- the registry: one pool per image, per process ---------------------------------------------------------------
_pools: dict[str, object] = {}
_building: dict[str, threading.Lock] = {}
_registry_lock = threading.Lock()


def pool_for(image: str):
    """The pool serving `image`, made on first use (its constructor boots the warm-up hosts: this blocks)."""
    from huggingface_hub import SandboxPool

    with _registry_lock:
        lock = _building.setdefault(image, threading.Lock())
    with lock:
        pool = _pools.get(image)
        if pool is None:
            cfg = pool_config()
            try:
                pool = SandboxPool(
                    image,
                    sandboxes_per_host=cfg.sandboxes_per_host,
                    warm_up=max(1, cfg.warm_up),  # the SDK boots >= 1 host when made; 0 = made at first use
                    max_hosts=cfg.max_hosts,
                    name=pool_name(image),
                    idle_timeout=cfg.idle_timeout_s,
                )
            except Exception as e:
                raise SandboxError(f"starting the HF sandbox pool for {image} failed: {type(e).__name__}: {e}") from e
            with _registry_lock:
                _pools[image] = pool
        return pool


def close_pools() -> list[str]:
    """Cancel every pool host this process started (server shutdown); returns the pools closed. A later rollout
    (another app in the same process) makes a new pool."""
    with _registry_lock:
        pools, closed = list(_pools.items()), []
        _pools.clear()
    for image, pool in pools:
        try:
            pool.close()  # type: ignore[attr-defined]
            closed.append(image)
        except Exception as e:  # the hosts' idle timeout, then `reap_orphans` after a restart, remove them
            log.warning("closing the HF sandbox pool for %s failed: %s", image, e)
    return closed


def reap_orphans() -> list[str]:
    """Cancel pool hosts of this server id and host whose owning process is gone (found by the pool's name)."""
    try:
        from huggingface_hub import HfApi, get_token
        from huggingface_hub._sandbox import MODE_LABEL, MODE_POOL, POOL_LABEL
    except ImportError:
        return []
    if not get_token():
        return []
    api, prefix, killed = HfApi(), _owner_prefix(), []
    for job in api.list_jobs(status=["RUNNING", "SCHEDULING"], labels={MODE_LABEL: MODE_POOL}):
        name = (job.labels or {}).get(POOL_LABEL, "")
        pid, _, rest = name[len(prefix) :].partition("-")
        owner = {"host": HOST, "pid": pid, "incarnation": rest.partition("-")[0]}
        if name.startswith(prefix) and owner_dead(owner):
            api.cancel_job(job_id=job.id)
            killed.append(f"hf-pool:{job.id}")
    return killed


def preflight() -> tuple[bool, str]:
    ok, why = hf_preflight()
    if not ok:
        return ok, why
    try:
        from huggingface_hub import SandboxPool  # noqa: F401
    except ImportError:
        return False, "huggingface_hub with SandboxPool (>= 1.22) is needed: pip install -U huggingface_hub"
    try:
        cfg = pool_config()
    except SandboxError as e:
        return False, str(e)
    cap = f", at most {cfg.max_hosts} hosts" if cfg.max_hosts else ""
    return True, f"huggingface_hub SandboxPool: {cfg.sandboxes_per_host} sandboxes per host{cap}; token present"


_closing: dict[str, int] = {}  # image -> its pool sandboxes being removed now (one event loop: no lock)
_admitted: dict[str, int] = {}  # image -> creates let through `_slot` and not yet placed by the pool
CLOSE_WAIT_S = 120.0  # each removal is one bounded call; under load it can take tens of seconds


@contextlib.asynccontextmanager
async def _slot(image: str, pool):
    """Around `pool.create`: when every host of the pool is full and sandboxes of it are being removed, wait
    (bounded) for one of those slots rather than let the pool boot another host for a moment's shortage. Creates let
    through count against the free slots until the pool placed them, so one freed slot lets one create through."""
    end = time.monotonic() + CLOSE_WAIT_S
    while _closing.get(image, 0) > 0 and time.monotonic() < end:
        if pool.num_sandboxes + _admitted.get(image, 0) < pool.num_hosts * pool.sandboxes_per_host:
            break
        await asyncio.sleep(0.05)
    _admitted[image] = _admitted.get(image, 0) + 1
    try:
        yield
    finally:
        _admitted[image] -= 1


class PathMap:
    """The usual layout's paths → a sandbox's real ones. In text, a path counts where it starts after a character
    that cannot be part of one; real paths map to themselves, so mapping twice changes nothing."""

    def __init__(self, root: str, insides: list[str]) -> None:
        self.root = root
        self.paths = {p: root + p for p in insides}
        table = {root: root, **{r: r for r in self.paths.values()}, **self.paths}
        alternatives = "|".join(re.escape(p) for p in sorted(table, key=len, reverse=True))
        self._table = table
        self._re = re.compile(rf"(?<![\w.~/-])({alternatives})(?![\w.~-])")

    def text(self, text: str) -> str:
        return self._re.sub(lambda m: self._table[m.group(1)], text)

    def path(self, path: str) -> str:
        if path == self.root or path.startswith(self.root + "/"):
            return path
        for inside in sorted(self.paths, key=len, reverse=True):
            if path == inside or path.startswith(inside + "/"):
                return self.paths[inside] + path[len(inside) :]
        return path


class HFPoolSandbox(HFSandbox):
    """A sandbox from the image's pool, working in its own home (see the module docstring)."""

    reap_orphans = staticmethod(reap_orphans)
    preflight = staticmethod(preflight)
    map: PathMap | None = None
    python_path = ""  # the copies of the work-tree dirs the image's Python envs import from (see `_settle`)

    @property
    def agent_workdir(self) -> str:
        return self.map.path(self.spec.workdir) if self.map else self.spec.workdir

    @classmethod
    async def create(cls, spec: SandboxSpec) -> HFPoolSandbox:
        try:
            from huggingface_hub import SandboxPool  # noqa: F401
        except ImportError as e:
            raise SandboxUnavailable("huggingface_hub with SandboxPool (>= 1.22) is needed") from e
        if not spec.image:
            raise SandboxError("the hf-pool backend needs the task's image (this task has none)")
        if spec.repo_source:
            raise SandboxError("the hf-pool backend takes the repository from the image (no local repository source)")
        try:
            pool = await in_thread(pool_for, spec.image, limit=900.0)
            async with _slot(spec.image, pool):
                sbx = await in_thread(pool.create, idle_timeout=own_timeout_s(spec.deadline_s), limit=600.0)
        except TimeoutError as e:
            raise SandboxError(f"no HF pool sandbox for {spec.image} within the time limit") from e
        except SandboxError:
            raise
        except Exception as e:
            raise SandboxError(f"creating the HF pool sandbox failed: {type(e).__name__}: {e}") from e
        self = cls(spec, sbx, sbx.host_id or sbx.id)
        return await self._boot(self._settle, self._prepare)

    async def close(self) -> None:
        """Counted while it runs: a create that finds the pool full waits for it rather than booting a host (the
        pipeline grades in a new sandbox while the agent's is still being removed)."""
        if self._closed:
            return
        _closing[self.spec.image] = _closing.get(self.spec.image, 0) + 1  # before any await
        try:
            await super().close()
        finally:
            _closing[self.spec.image] -= 1

    async def _shell(self, what: str, script: str, timeout: float) -> str:
        """A short foreground command with no path mapping (before the layout exists); its stdout, or the error."""
        r = await self._call(what, self.sbx.run, script, check=False, timeout=timeout, limit=timeout + 30)
        if r.exit_code != 0 or r.timed_out:
            raise SandboxError(f"{what} failed (exit {r.exit_code}): {(r.stderr or r.stdout).strip()[-500:]}")
        return r.stdout

    async def _settle(self) -> None:
        """Find the sandbox's home (the file API's root), lay out the usual paths under it, copy the work tree."""
        mark = uuid.uuid4().hex
        await self._call("marking the sandbox home", self.sbx.files.write, HOME_MARK, mark.encode())
        find = (
            f'for d in "$PWD" "$HOME"; do [ "$(cat "$d{HOME_MARK}" 2>/dev/null)" = {mark} ] && '
            f'{{ cd "$d" && pwd -P; exit 0; }}; done; echo "no {HOME_MARK} in \\$PWD=$PWD or \\$HOME=$HOME" >&2; exit 3'
        )
        home = (await self._shell("finding the pool sandbox's home", find, 60)).strip()
        if not SHELL_SAFE.match(home) or home in ("/", self.spec.workdir):
            raise SandboxError(f"the pool sandbox's home {home[:200]!r} is not a plain directory path")
        insides = [self.spec.workdir, AGENT_HOME, "/tmp", *self.spec.ro_mounts.values()]
        for p in insides:
            if not SHELL_SAFE.match(p):
                raise SandboxError(f"the hf-pool backend needs plain paths (shell-safe): {p[:200]!r}")
        self.map = PathMap(home, insides)
        src, dst = shlex.quote(self.spec.workdir), shlex.quote(self.map.path(self.spec.workdir))
        q = shlex.quote
        copy = (
            f"set -e; rm -f {q(home + HOME_MARK)}; [ -d {src} ] || {{ echo 'the image has no {src}' >&2; exit 3; }}; "
            f"mkdir -p {dst} {q(self.map.path('/tmp'))} {q(self.map.path(AGENT_HOME))}; cp -a {src}/. {dst}/\n"
            + EDITABLE.format(workdir=src, pattern=shlex.quote(f"{re.escape(self.spec.workdir)}(/.*)?"))
        )
        out = await self._shell(f"copying {self.spec.workdir} into the sandbox's home", copy, 600)
        # The image's Python envs import the work tree from where it was installed (editable installs: .pth and
        # .egg-link lines naming spec.workdir): the copies of those dirs go first on PYTHONPATH, so the tests and the
        # agent's commands import the sandbox's own copy, not the image's pristine tree.
        entries = [self.map.path(line) for line in out.split() if SHELL_SAFE.match(line)]
        self.python_path = ":".join(dict.fromkeys(entries))

    # -- the mapping at the API ------------------------------------------------------------------------------
    def script(self, cmd: str | list[str], relay: bool, env: dict[str, str] | None, cwd: str | None) -> str:
        assert self.map is not None
        own = {"HOME": self.map.path(AGENT_HOME), "TMPDIR": self.map.path("/tmp"), **self.spec.env}
        if self.python_path:
            own["PYTHONPATH"] = self.python_path + (f":{own['PYTHONPATH']}" if own.get("PYTHONPATH") else "")
        return super().script(cmd, relay, {**own, **(env or {})}, cwd)

    def _command(self, cmd: str) -> str:
        return self.map.text(cmd) if self.map else cmd

    def _path(self, path: str) -> str:
        if self.map is None:
            raise SandboxError("the pool sandbox is not laid out yet")
        real = self.map.path(path)
        if real != self.map.root and not real.startswith(self.map.root + "/"):
            raise SandboxError(
                f"{path} is outside the pool sandbox's home {self.map.root}: the file API reaches only it"
            )
        return "/" + real[len(self.map.root) :].lstrip("/")

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if mode & 0o111 and self.map is not None:  # a script the pipeline will run: its paths are mapped too
            try:
                data = self.map.text(data.decode("utf-8")).encode("utf-8")
            except UnicodeDecodeError:
                pass
        await super().write_file(path, data, mode)
