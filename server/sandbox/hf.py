"""`hf` sandbox backend: `huggingface_hub.Sandbox` (experimental, huggingface_hub >= 1.22), one HF Job per sandbox.

- `Sandbox.create(image, idle_timeout, env, labels, token)`: the task's image; `idle_timeout` is the rollout deadline,
  so a sandbox whose server is gone (no more API calls) shuts itself down within one deadline; labels carry the
  server id, host, pid and rollout id (`reap_orphans` kills this server id's sandboxes whose process is gone).
- Every command runs detached (`run(..., background=True)`) and is polled through `processes()`: a long foreground
  `run` is not activity, so a sandbox could be shut down under it. Output comes back through `files.read`.
- Files: `files.write(path, data, mode)` / `files.read(path)`; teardown: `kill()` (`close()` would leave it running).
- The sandbox reaches the server's public URL (a public Space), whose /capture rejects unknown session keys.
- The agent: its bundle (a content-addressed tree in spec.ro_mounts) is uploaded as a tarball (`files.upload`,
  ranged and parallel for large files), unpacked at its mount path and checked against its digest inside, after the
  image's glibc was checked (`deliver_bundles`). The image needs no Node; its user must be able to create the mount
  path (root, or a pre-made empty dir as in space_app/sandbox.Dockerfile).

Failures (shared with `hf-pool`, which subclasses this): every SDK call runs on this module's own threads with a
time limit (`_call`), and whatever it raises becomes our `SandboxError`: a missing file says so; a call that fails or
gets no answer looks the job up (`inspect_job`) and, when the job is no longer RUNNING (it died, was cancelled, its
idle timeout fired), names the job and its stage — and every later call fails at once with the same error.
The SDK is imported on first use; the calls and arguments are pinned by tests/test_sandbox_contracts.py.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from swe_gym_env.core.settings import setting
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.errors import SandboxGone
from swe_gym_env.server.sandbox.remote import (
    RemoteProcess,
    RemoteSandbox,
    kill_orphans,
    our_labels,
    own_timeout_s,
    provider_labels,
)

SHORT_TIMEOUT = 60
CALL_TIMEOUT = 90.0  # over the SDK's own 60 s request timeout: past it the job is looked up and named
POLL_TIMEOUT = 30.0  # a poll of a command's state that takes longer: the server stopped answering
TRANSFER_TIMEOUT = 900.0  # uploads and reads of large files
STAGE_LAG_S = 3.0  # a call refused while the job still reads RUNNING: look again this much later
# SDK calls block; they run here, not on asyncio's default executor (a few threads on a small machine, shared with
# everything else), so 16 concurrent rollouts polling their sandboxes do not queue behind each other.
_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="swe-gym-hf")


def _sdk():
    try:
        from huggingface_hub import Sandbox
    except ImportError as e:
        raise SandboxUnavailable(
            "huggingface_hub with Sandbox (>= 1.22) is needed: pip install -U huggingface_hub"
        ) from e
    return Sandbox


def public_url() -> str | None:
    return setting("public_url")  # SWE_GYM_PUBLIC_URL


async def in_thread(fn, *args, limit: float = CALL_TIMEOUT, **kwargs) -> Any:
    """A blocking SDK call on this module's threads; TimeoutError past `limit` s (the thread is left to finish)."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(_EXECUTOR, functools.partial(fn, *args, **kwargs)), limit)


def job_stage(job_id: str) -> tuple[str, str]:
    """(stage, message) of an HF Job, or ("UNKNOWN", why) when the Jobs API cannot say."""
    try:
        from huggingface_hub import HfApi

        status = HfApi().inspect_job(job_id=job_id).status
        return str(status.stage), str(status.message or "")
    except Exception as e:
        return "UNKNOWN", f"inspect_job failed: {type(e).__name__}: {str(e)[:200]}"


def stage_error(job_id: str, what: str, stage: str, message: str) -> str:
    """What a caller reads when the job behind a sandbox is no longer running."""
    why = {
        "COMPLETED": "it exited by itself (the sandbox server's idle timeout fired, or it was shut down)",
        "CANCELED": "it was cancelled (killed by us, `reap_orphans`, or someone else)",
        "ERROR": "it failed (the container died or could not start)",
        "DELETED": "it was deleted",
    }.get(stage, "it is not running")
    said = f": {message}" if message else ""
    return f"HF sandbox job {job_id} is {stage} ({why}{said}); {what} cannot run"


def preflight() -> tuple[bool, str]:
    try:
        _sdk()
        from huggingface_hub import get_token
    except (SandboxUnavailable, ImportError) as e:
        return False, str(e)
    if not get_token():
        return False, "no Hugging Face token: set HF_TOKEN (or `hf auth login`)"
    if not public_url():
        return False, "SWE_GYM_PUBLIC_URL is not set: HF sandboxes reach /capture at the server's public URL"
    return True, "huggingface_hub Sandbox; token present"


def reap_orphans() -> list[str]:
    try:
        Sandbox = _sdk()
        from huggingface_hub import HfApi, get_token
    except (SandboxUnavailable, ImportError):
        return []
    if not get_token():
        return []
    jobs = HfApi().list_jobs(status="RUNNING", labels=our_labels())
    return kill_orphans(((job.id, job.labels) for job in jobs), Sandbox.kill, "hf")


class HFSandbox(RemoteSandbox):
    reap_orphans = staticmethod(reap_orphans)
    preflight = staticmethod(preflight)

    def __init__(self, spec: SandboxSpec, sbx, job_id: str) -> None:
        super().__init__(spec, sbx)
        self.job_id = job_id  # the HF Job behind it (a pool sandbox: its host's)
        self._gone: str | None = None  # set once the job is found not running: every later call fails with it

    @classmethod
    async def create(cls, spec: SandboxSpec) -> HFSandbox:
        Sandbox = _sdk()
        if not spec.image:
            raise SandboxError("the hf backend needs the task's image (this task has none)")
        try:
            sbx = await in_thread(
                Sandbox.create,
                spec.image,
                idle_timeout=own_timeout_s(spec.deadline_s),
                env=dict(spec.env),
                labels=provider_labels(spec.labels),
                limit=300.0,
            )
        except TimeoutError as e:
            raise SandboxError("creating the HF sandbox got no answer within 300s") from e
        except Exception as e:
            raise SandboxError(f"creating the HF sandbox failed: {type(e).__name__}: {e}") from e
        self = cls(spec, sbx, sbx.id)
        return await self._boot(self._prepare)

    # -- every SDK call goes through here ------------------------------------------------------------------
    async def _call(self, what: str, fn, *args, limit: float = CALL_TIMEOUT, **kwargs) -> Any:
        """`fn(*args, **kwargs)` on the SDK's threads; what it raises becomes a `SandboxError` that says what failed
        and, when the job is no longer running or its server stopped answering, which job and its stage."""
        if self._gone:
            raise SandboxGone(self._gone)
        try:
            return await in_thread(fn, *args, limit=limit, **kwargs)
        except TimeoutError:
            err, no_answer = f"no answer within {limit:.0f}s", True
        except Exception as e:
            vanished = getattr(e, "status_code", None) == 404
            if vanished and await self._alive():
                raise SandboxError(f"{what}: no such file or directory in the sandbox") from e
            err, no_answer = f"{type(e).__name__}: {str(e)[:300]}", "Timeout" in type(e).__name__
            raise self._error(await self._failure(what, err, no_answer, vanished)) from e
        raise self._error(await self._failure(what, err, no_answer, False))

    def _error(self, message: str) -> SandboxError:
        return SandboxGone(message) if message == self._gone else SandboxError(message)

    async def _alive(self) -> bool:
        """Whether the sandbox itself still answers (a 404 then means the path, not the sandbox, is missing)."""
        try:
            await in_thread(self.sbx.processes, limit=POLL_TIMEOUT)
            return True
        except Exception:
            return False

    async def _failure(self, what: str, err: str, no_answer: bool, vanished: bool) -> str:
        """The error for a failed call. A job that is not RUNNING, a sandbox its server no longer knows, or a server
        that did not answer, is final: every later call fails at once with the same error (never one time limit per
        call, which adds up to a hang)."""
        stage, message = await asyncio.to_thread(job_stage, self.job_id)
        if stage == "RUNNING" and not (no_answer or vanished):  # refused or reset: the Jobs API may lag a death
            await asyncio.sleep(STAGE_LAG_S)
            stage, message = await asyncio.to_thread(job_stage, self.job_id)
        if stage not in ("RUNNING", "UNKNOWN"):
            self._gone = stage_error(self.job_id, what, stage, message) + f" [{err}]"
        elif vanished:
            self._gone = (
                f"HF sandbox {self.sbx_id} no longer exists on job {self.job_id} ({stage}): its idle timeout fired "
                f"or it was removed ({what}: {err})"
            )
        elif no_answer:
            self._gone = (
                f"HF sandbox job {self.job_id} is {stage} but its sandbox server stopped answering ({what}: {err})"
            )
        else:
            return f"HF sandbox {self.sbx_id}: {what} failed: {err} (job {self.job_id} is {stage})"
        return self._gone

    @property
    def sbx_id(self) -> str:
        return str(getattr(self.sbx, "id", self.job_id))

    # -- boot ------------------------------------------------------------------------------------------------
    async def _run_short(self, cmd: str) -> None:
        try:
            await self._call(
                "a short command",
                self.sbx.run,
                self._command(cmd),
                timeout=SHORT_TIMEOUT,
                check=False,
                limit=SHORT_TIMEOUT + 15,
            )
        except SandboxError:  # a kill that finds nothing is fine; a dead job shows on the next call
            pass

    async def _prepare(self) -> None:
        if self.spec.repo_source:
            raise SandboxError("the hf backends take the repository from the image (no local repository source)")
        await super()._prepare()

    # -- commands, files -------------------------------------------------------------------------------------
    async def _spawn(self, script: str, stdin: bytes | None) -> RemoteProcess:
        pid_id, cmd = await self._detach(script, stdin)
        handle = await self._call("starting a command", self.sbx.run, self._command(cmd), background=True)

        async def finished() -> bool:
            procs = await self._call("polling a command", self.sbx.processes, limit=POLL_TIMEOUT)
            return not any(p.id == handle.id and p.running for p in procs)  # not listed any more: gone

        async def cancel() -> None:
            try:
                await self._call("stopping a command", handle.kill, limit=SHORT_TIMEOUT)
            except SandboxError:  # already gone, or the job is: nothing left to stop
                pass

        return RemoteProcess(pid_id, finished, self.read_file, self._run_short, cancel, self._check_running)

    async def _check_running(self) -> None:
        """SandboxGone when the job is no longer RUNNING, or stops within the Jobs API's lag (a command killed by
        the sandbox's own shutdown is seen before the job's stage changes)."""
        for wait in (0.0, STAGE_LAG_S):
            await asyncio.sleep(wait)
            stage, message = await asyncio.to_thread(job_stage, self.job_id)
            if stage not in ("RUNNING", "UNKNOWN"):
                self._gone = stage_error(self.job_id, "a command", stage, message) + " [killed with its sandbox]"
                raise SandboxGone(self._gone)

    def _command(self, cmd: str) -> str:
        """The shell command as the sandbox runs it (`hf-pool` maps its paths)."""
        return cmd

    def _path(self, path: str) -> str:
        """A path as the file API takes it (`hf-pool` maps it into the sandbox's home)."""
        return path

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        limit = CALL_TIMEOUT if len(data) < (8 << 20) else TRANSFER_TIMEOUT
        await self._call(
            f"writing {path}", self.sbx.files.write, self._path(path), data, mode=f"{mode:04o}", limit=limit
        )

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        if self._closed:
            raise SandboxError("sandbox is closed")
        data = await self._call(f"reading {path}", self.sbx.files.read, self._path(path), limit=TRANSFER_TIMEOUT)
        return data[:limit]

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        await self._call(
            f"uploading to {path}", self.sbx.files.upload, str(local), self._path(path), mode=f"{mode:04o}",
            limit=TRANSFER_TIMEOUT,
        )  # fmt: skip

    async def close(self) -> None:
        """One call: removing the sandbox (the job, or the pool sandbox with its uid's processes) stops whatever it
        still runs, so its commands are not stopped one by one first (two calls each, on a possibly dead job)."""
        self._live.clear()
        await super().close()

    async def _teardown(self) -> None:
        try:
            await in_thread(self.sbx.kill, limit=SHORT_TIMEOUT)
        except Exception:  # idle_timeout and `reap_orphans` remove it
            pass
