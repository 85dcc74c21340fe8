"""What the cloud backends (hf, e2b) share: every command runs detached, as its own session under
`timeout -s KILL <time left>`, with stdin/stdout/stderr/exit code in files under /tmp/.swe-gym; the server polls for
the exit code and reads the files back. A long foreground call is not activity for a cloud sandbox (HF's idle
timeout), and a detached command survives a dropped connection. `kill` stops the whole session by its pid file.
"""

from __future__ import annotations

import asyncio
import math
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable

from swe_gym_env.core.settings import setting
from swe_gym_env.core.tempdirs import owner_dead, server_id
from swe_gym_env.server.sandbox.base import (
    LABEL_PREFIX,
    SECRETS_FILE,
    ExecResult,
    SandboxBase,
    SandboxError,
    SandboxSpec,
    clip,
    strip_history_script,
)
from swe_gym_env.server.sandbox.errors import SandboxGone

STATE_DIR = "/tmp/.swe-gym"
POLL_S = 1.0  # the longest wait between polls; the first comes after FIRST_POLL_S, doubling up to it
FIRST_POLL_S = 0.05


OWN_TIMEOUT_FLOOR_ENV = "SWE_GYM_REMOTE_TIMEOUT_FLOOR_S"


def own_timeout_s(deadline_s: float) -> int:
    """A cloud sandbox's own limit (HF idle timeout, E2B lifetime): the rollout's deadline, at least a minute (the
    floor is ``SWE_GYM_REMOTE_TIMEOUT_FLOOR_S``, 60 by default, 1 at least), so a sandbox whose server is gone shuts
    itself down within one deadline."""
    floor = max(1, setting("remote_timeout_floor_s"))  # OWN_TIMEOUT_FLOOR_ENV; a bad value names it
    return max(floor, math.ceil(deadline_s))


def detached(script: str, left: float, with_stdin: bool) -> tuple[str, str]:
    """(process id, shell command that runs `script` detached with its output in files)."""
    pid_id = uuid.uuid4().hex[:12]
    p = f"{STATE_DIR}/{pid_id}"
    inner = f'echo $$ > {p}.pid; exec timeout -s KILL {max(1, math.ceil(left))} /bin/sh -c "$1"'
    stdin = f"{p}.in" if with_stdin else "/dev/null"
    cmd = (
        f"mkdir -p {STATE_DIR}; setsid -w /bin/sh -c {shlex.quote(inner)} sh {shlex.quote(script)} "
        f"< {stdin} > {p}.out 2> {p}.err; echo $? > {p}.rc.tmp && mv {p}.rc.tmp {p}.rc"
    )
    return pid_id, cmd


def provider_labels(labels: dict[str, str]) -> dict[str, str]:
    """A spec's labels as the provider keeps them (prefixed)."""
    return {f"{LABEL_PREFIX}-{k}": v for k, v in labels.items()}


def our_labels() -> dict[str, str]:
    """The provider labels that pick this server's sandboxes."""
    return provider_labels({"server": server_id()})


def kill_orphans(
    found: Iterable[tuple[str, dict[str, str] | None]], kill: Callable[[str], object], name: str
) -> list[str]:
    """Kill each sandbox of ``found`` ((its id, its provider labels)) whose owner process is gone; "name:id" each."""
    killed = []
    for sid, kept in found:
        if owner_dead({k.removeprefix(f"{LABEL_PREFIX}-"): v for k, v in (kept or {}).items()}):
            kill(sid)
            killed.append(f"{name}:{sid}")
    return killed


def kill_script(pid_id: str) -> str:
    return f"[ -f {STATE_DIR}/{pid_id}.pid ] && kill -9 -$(cat {STATE_DIR}/{pid_id}.pid); true"


class RemoteProcess:
    """A detached command in a cloud sandbox; the backend supplies how to poll, read, run and cancel."""

    def __init__(
        self,
        pid_id: str,
        finished: Callable[[], Awaitable[bool]],
        read: Callable[[str], Awaitable[bytes]],
        run_short: Callable[[str], Awaitable[None]],
        cancel: Callable[[], Awaitable[None]],
        check_alive: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.pid_id = pid_id
        self._finished, self._read, self._run_short, self._cancel = finished, read, run_short, cancel
        self._check_alive = check_alive  # raises SandboxGone when the sandbox itself is dying or gone
        self.returncode: int | None = None

    async def poll(self) -> int | None:
        if self.returncode is None and await self._finished():
            try:
                code = int((await self._read(f"{STATE_DIR}/{self.pid_id}.rc")).strip() or b"137")
            except SandboxGone:  # the sandbox died, not the command: there is no exit code to report
                raise
            except Exception:  # killed before it could write its exit code
                code = 137
            if code == 137 and self._check_alive is not None:
                # SIGKILL: the command's own doing, or its sandbox shutting down (an idle timeout kills every
                # process, then the server exits): the latter is SandboxGone, never a command that exited 137
                await self._check_alive()
            self.returncode = code
        return self.returncode

    async def _output(self, name: str) -> str:
        try:
            return clip(await self._read(f"{STATE_DIR}/{self.pid_id}.{name}"))
        except Exception:
            return ""

    async def wait(self, timeout: float | None = None) -> ExecResult:
        end = time.monotonic() + (timeout if timeout is not None else 1e9)
        pause = FIRST_POLL_S  # most commands are short: look again soon, then less and less often
        while await self.poll() is None:
            if time.monotonic() >= end:
                await self.kill()
                out = await self._output("out")
                return ExecResult(124, out, f"timed out after {timeout:.0f}s", timed_out=True)
            await asyncio.sleep(min(pause, max(0.05, end - time.monotonic())))
            pause = min(POLL_S, pause * 2)
        return ExecResult(self.returncode or 0, await self._output("out"), await self._output("err"))

    async def kill(self) -> None:
        try:
            await self._run_short(kill_script(self.pid_id))
        finally:
            await self._cancel()
            if self.returncode is None:
                self.returncode = 137


class RemoteSandbox(SandboxBase):
    """What the cloud backends' sandboxes share: the provider's handle (`sbx`), /capture at the server's public URL,
    the boot that prepares the sandbox, and detached commands."""

    uses_image = needs_image = True  # the repo comes in it; the agent bundle is uploaded at boot
    capture_via_url = True

    def __init__(self, spec: SandboxSpec, sbx) -> None:
        super().__init__(spec)
        self.sbx = sbx
        url = spec.capture_url or setting("public_url")  # SWE_GYM_PUBLIC_URL
        self.capture_base_url = f"{url.rstrip('/')}/capture" if url else None

    async def _prepare(self) -> None:
        """The secrets file, the state dir and the agent's HOME, the history stripped, the agent bundles delivered."""
        spec = self.spec
        if spec.secrets:  # first: every command sources it (the file API makes its directory)
            await self.write_file(SECRETS_FILE, self.secrets_file(), 0o600)
        steps = [f"mkdir -p {STATE_DIR} /home/agent"]
        if spec.base_commit and spec.strip_history:
            steps.append(strip_history_script(spec.workdir, spec.base_commit))
        res = await self.exec("set -e\n" + "\n".join(steps), timeout=600, cwd="/")
        if not res.ok:
            raise SandboxError(f"preparing the sandbox failed: {(res.stderr or res.stdout)[-500:]}")
        await self.deliver_bundles()

    async def _detach(self, script: str, stdin: bytes | None) -> tuple[str, str]:
        """(process id, the command that runs ``script`` detached); its stdin, if any, written where it reads it."""
        pid_id, cmd = detached(script, self.remaining(), stdin is not None)
        if stdin is not None:
            await self.write_file(f"{STATE_DIR}/{pid_id}.in", stdin, 0o600)
        return pid_id, cmd
