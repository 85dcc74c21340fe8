"""The sandbox protocol. Backends know nothing of agents; the rollout pipeline composes them.

A backend is a class with ``async create(spec) -> instance`` whose instances offer what `Sandbox` lists. Most of it
is shared here (`SandboxBase`): a backend implements `_spawn` (start a shell script in the sandbox as a
`Process`), `write_file`, `read_file` and `_teardown`; `exec`, background processes, argv quoting, env, cwd,
secrets, deadlines, uploads and an idempotent `close` come from the base.

Agent bundles: a read-only mount whose host directory holds `bundle.json` is a content-addressed tree (built by
`server/agents/bundle.py`; the backends know its format, not what is in it). Backends that mount host paths mount it
and check the image can run it (`check_bundles`); the others upload it as a tarball, unpack it and check its digest
inside (`deliver_bundles`). Either way boot checks the image's glibc against the bundle's floor and runs its probe,
and records the cost in `bundle_bytes` / `bundle_s`.

Error tree: `SandboxError` (creating or using a sandbox failed; the message names the fix where there is one)
  └── `SandboxUnavailable` (the backend cannot run here at all: binary, daemon, credentials, SDK or image missing)
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, Self

OUTPUT_LIMIT = 256 * 1024
TRUNCATED = "\n[... output truncated by swe_gym_env ...]\n"
SECRETS_FILE = "/tmp/.swe-gym/secrets.env"  # mode 0600, sourced by every command; never argv
RELAY_PORT = 18080
LABEL_PREFIX = "swe-gym"
BUNDLE_META = "bundle.json"  # marks a content-addressed tree among spec.ro_mounts
BUNDLE_SUMS = "SHA256SUMS"  # `sha256sum -c` lines for every other file; the tree's digest is this file's sha256
GLIBC_PROBE = "getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1"
# The digest check where the image has no sha256sum, run by the bundle's own JS runtime (`verifier` in bundle.json)
VERIFY_JS = (
    "const f=require('fs'),c=require('crypto'),[d,want]=process.argv.slice(1),h=b=>c.createHash('sha256')"
    ".update(b).digest('hex'),s=f.readFileSync(d+'/SHA256SUMS');if(h(s)!==want){console.log('SHA256SUMS: FAILED');"
    "process.exit(1)}const bad=[];for(const l of s.toString().split('\\n')){if(!l)continue;let ok=false;"
    "try{ok=h(f.readFileSync(d+'/'+l.slice(66)))===l.slice(0,64)}catch(e){}if(!ok)bad.push(l.slice(66)+': FAILED')}"
    "if(bad.length){console.log(bad.slice(0,20).join('\\n'));process.exit(1)}"
)
_archive_lock = threading.Lock()


class SandboxError(RuntimeError):
    """Creating or using a sandbox failed; the message says what and, where it can, how to fix it."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run here (binary, daemon, credentials, SDK or image missing)."""


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


def bundle_meta(host_dir: str | Path) -> dict | None:
    """The metadata of a content-addressed tree (None: a plain directory, or no readable metadata)."""
    try:
        meta = json.loads((Path(host_dir) / BUNDLE_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and re.fullmatch(r"[0-9a-f]{64}", str(meta.get("digest"))) else None


def glibc_version(text: str) -> tuple[int, int] | None:
    """The glibc version in `getconf GNU_LIBC_VERSION` ("glibc 2.35") or `ldd --version` output ("ldd (Ubuntu GLIBC
    2.35-0ubuntu3.8) 2.35", "ldd (GNU libc) 2.17"); None for anything else (musl's ldd, no ldd at all)."""
    first = (text.strip().splitlines() or [""])[0]
    m = re.match(r"glibc (\d+)\.(\d+)", first) or (
        re.search(r"(\d+)\.(\d+)\s*$", first) if re.search(r"GLIBC|GNU libc", first, re.I) else None
    )
    return (int(m.group(1)), int(m.group(2))) if m else None


def glibc_problem(text: str, need: str) -> str | None:
    """Why an image whose glibc probe printed `text` cannot run a bundle that needs glibc >= `need` (None: it can)."""
    found = glibc_version(text)
    if found is None:
        seen = text.strip().splitlines()[0][:100] if text.strip() else "no output"
        return f"the image has no glibc the agent bundle can use ({seen!r}); it needs glibc >= {need}"
    if found < tuple(int(x) for x in need.split(".")[:2]):
        return f"the image's glibc is {found[0]}.{found[1]}; the agent bundle needs glibc >= {need}"
    return None


def bundle_archive(host_dir: str | Path) -> Path:
    """The tree as a gzipped tarball beside it (`<dir>.tar.gz`), made once: the upload for backends without host
    mounts. Paths sorted, owners and times normalised; what it holds is checked against SHA256SUMS inside."""
    src = Path(host_dir)
    out = src.with_name(src.name + ".tar.gz")
    with _archive_lock:
        if out.is_file():
            return out
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")

        def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 1_700_000_000
            info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
            return info

        try:
            with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
                for path in sorted(src.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(src)), recursive=False, filter=norm)
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


class Process(Protocol):
    """A command running in a sandbox. `kill` stops its whole process tree."""

    async def poll(self) -> int | None: ...

    async def wait(self, timeout: float | None = None) -> ExecResult: ...

    async def kill(self) -> None: ...


class Sandbox(Protocol):
    capture_base_url: str | None  # where, inside the sandbox, /capture answers
    expires_at: float  # epoch seconds
    bundle_bytes: int  # agent-bundle bytes uploaded at boot (0 where mounted)
    bundle_s: float  # seconds boot spent delivering and checking agent bundles

    @property
    def agent_workdir(self) -> str: ...  # where the agent finds the work tree (what its prompt names)

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        relay: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def start(
        self, cmd: str | list[str], *, relay: bool = False, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> Process: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes: ...

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None: ...

    async def download(self, path: str, local: Path, limit: int = 1 << 30) -> None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc) -> None: ...


class SandboxBase:
    """Shared behaviour; backends fill in `create`, `_spawn`, `write_file`, `read_file`, `_teardown`, their
    capabilities below, and `preflight` / `reap_orphans` where they have something to check or clean up."""

    # -- what a backend can do, as class attributes: callers read these, never probe a backend with hasattr ----
    host_mounts: ClassVar[bool] = False  # spec.ro_mounts (host paths) are mounted; else the image brings them
    takes_repo_source: ClassVar[bool] = False  # clones spec.repo_source (a repository on the host)
    uses_image: ClassVar[bool] = False  # runs spec.image (the task's image, which may hold the repo)
    needs_image: ClassVar[bool] = False  # needs spec.image: no default image of its own
    capture_via_url: ClassVar[bool] = False  # reaches /capture at the server's public URL (else its unix socket)

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

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        raise NotImplementedError

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        raise NotImplementedError

    async def _teardown(self) -> None:
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------------------------------
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

    async def start(
        self, cmd: str | list[str], *, relay: bool = False, env: dict[str, str] | None = None, cwd: str | None = None
    ) -> Process:
        if self.remaining() <= 0:
            raise SandboxError("sandbox deadline passed")
        proc = await self._spawn(self.script(cmd, relay, env, cwd), None)
        self._live.add(proc)
        return proc

    async def exec(
        self,
        cmd: str | list[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        relay: bool = False,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        script = self.script(cmd, relay, env, cwd)
        timeout = min(timeout, self.remaining())
        if timeout <= 0:
            return ExecResult(124, "", "sandbox deadline passed", timed_out=True)
        proc = await self._spawn(script, stdin)
        self._live.add(proc)
        try:
            return await proc.wait(timeout)
        finally:
            if await proc.poll() is None:
                await proc.kill()
            self._live.discard(proc)

    def _bundles(self) -> list[tuple[str, str, dict]]:
        return [(h, inside, m) for h, inside in self.spec.ro_mounts.items() if (m := bundle_meta(h)) is not None]

    @staticmethod
    def _probe_script(meta: dict, inside: str) -> str:
        """Shell that runs the bundle's probe in its directory and prints `probe-exit=N` and its last lines."""
        probe = meta.get("probe") or "true"
        return (
            f"rc=0; out=$(cd {shlex.quote(inside)} && {{ {probe}; }} 2>&1) || rc=$?\n"
            'echo "probe-exit=$rc"; printf \'%s\\n\' "$out" | tail -n 5'
        )

    @staticmethod
    def _glibc_and_tools(meta: dict, inside: str, lines: list[str]) -> set[str]:
        """Fail (SandboxError: phase boot) when the image's glibc is below the bundle's floor; the tools it has."""
        if (why := glibc_problem("\n".join(lines[:1]), str(meta.get("glibc") or "2.28"))) is not None:
            raise SandboxError(f"cannot run the agent bundle {meta.get('name', '?')} at {inside}: {why}")
        return set(lines[1:])

    @staticmethod
    def _probe_result(meta: dict, lines: list[str]) -> None:
        at = next((i for i, line in enumerate(lines) if line.startswith("probe-exit=")), None)
        rc = lines[at].partition("=")[2] if at is not None else "?"
        if rc != "0":
            said = " | ".join(lines[at + 1 :] if at is not None else lines[-5:])[-400:]
            raise SandboxError(
                f"the agent bundle {meta.get('name', '?')} does not run in this image "
                f"(`{meta.get('probe')}` exit {rc}): {said}"
            )

    async def check_bundles(self) -> None:
        """Mounted bundles (host_mounts backends): the image's glibc and the bundle's probe, in one command. The
        digest was checked on the host when the bundle was built (`swe-gym-env setup`); its directory is named by
        it."""
        t = time.monotonic()
        for _, inside, meta in self._bundles():
            r = await self.exec(f'echo "$({GLIBC_PROBE})"\n{self._probe_script(meta, inside)}', timeout=120, cwd="/")
            lines = r.stdout.splitlines()
            self._glibc_and_tools(meta, inside, lines[:1])
            self._probe_result(meta, lines)
        self.bundle_s += time.monotonic() - t

    async def deliver_bundles(self) -> None:
        """Bundles for backends without host mounts: glibc first (before any upload), then the tarball uploaded,
        unpacked at the mount path, every file checked against the digest inside the sandbox, and the probe."""
        t = time.monotonic()
        for host, inside, meta in self._bundles():
            tools = "for t in sha256sum tar gzip; do command -v $t >/dev/null && echo $t; done"
            r = await self.exec(f'echo "$({GLIBC_PROBE})"; {tools}', timeout=60, cwd="/")
            have = self._glibc_and_tools(meta, inside, r.stdout.splitlines())
            if not {"tar", "gzip"} <= have:
                raise SandboxError(f"the image lacks {sorted({'tar', 'gzip'} - have)}: cannot unpack the agent bundle")
            q, digest = shlex.quote(inside), meta["digest"]
            if "sha256sum" in have:
                check = f'echo "{digest}  {BUNDLE_SUMS}" | sha256sum -c --quiet --strict - && '
                check += f"sha256sum -c --quiet --strict {BUNDLE_SUMS}"
            elif re.fullmatch(r"[A-Za-z0-9_./= -]+", str(meta.get("verifier") or "")):
                check = f"{meta['verifier']} -e {shlex.quote(VERIFY_JS)} {q} {digest}"
            else:
                raise SandboxError("the image has no sha256sum and the agent bundle no verifier: cannot check it")
            archive = await asyncio.to_thread(bundle_archive, host)
            remote = f"/tmp/.swe-gym/bundle-{digest[:16]}.tar.gz"
            await self.upload(archive, remote, 0o600)
            self.bundle_bytes += archive.stat().st_size
            script = "\n".join(
                [
                    "set -e",
                    f'mkdir -p {q} 2>/dev/null || sudo -n install -d -o "$(id -u)" {q} 2>/dev/null || '
                    f'{{ echo "cannot create {inside} as uid $(id -u) (no write access, no sudo): the image must '
                    'let its user create it, or hold it empty and writable" >&2; exit 3; }',
                    f'[ -z "$(ls -A {q})" ] || {{ echo "{inside} exists and is not empty" >&2; exit 3; }}',
                    f"tar -xzf {remote} -C {q} && rm -f {remote}",
                    f"cd {q}",
                    check,
                    f"chmod -R a-w {q}",
                    self._probe_script(meta, inside),
                ]
            )
            r = await self.exec(script, timeout=600, cwd="/")
            if not r.ok:
                out = (r.stdout.strip() + "\n" + r.stderr.strip()).strip()[-600:]
                raise SandboxError(f"delivering the agent bundle {meta.get('name', '?')} to {inside} failed: {out}")
            self._probe_result(meta, r.stdout.splitlines())
        self.bundle_s += time.monotonic() - t

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
