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
The SDK is imported on first use; the calls and arguments are pinned by tests/test_sandbox_contracts.py.
"""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path

from swe_gym_env.server.sandbox.base import (
    LABEL_PREFIX,
    SECRETS_FILE,
    SandboxBase,
    SandboxError,
    SandboxSpec,
    SandboxUnavailable,
    strip_history_script,
)
from swe_gym_env.server.sandbox.remote import STATE_DIR, RemoteProcess, detached
from swe_gym_env.server.tempdirs import owner_dead, server_id

SHORT_TIMEOUT = 60


def _sdk():
    try:
        from huggingface_hub import Sandbox
    except ImportError as e:
        raise SandboxUnavailable(
            "huggingface_hub with Sandbox (>= 1.22) is needed: pip install -U huggingface_hub"
        ) from e
    return Sandbox


def _labels(spec_labels: dict[str, str]) -> dict[str, str]:
    return {f"{LABEL_PREFIX}-{k}": v for k, v in spec_labels.items()}


def public_url() -> str | None:
    return os.environ.get("SWE_GYM_PUBLIC_URL") or None


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
    killed = []
    jobs = HfApi().list_jobs(status="RUNNING", labels={f"{LABEL_PREFIX}-server": server_id()})
    for job in jobs:
        labels = {k.removeprefix(f"{LABEL_PREFIX}-"): v for k, v in (job.labels or {}).items()}
        if owner_dead(labels):
            Sandbox.kill(job.id)
            killed.append(f"hf:{job.id}")
    return killed


class HFSandbox(SandboxBase):
    reap_orphans = staticmethod(reap_orphans)
    preflight = staticmethod(preflight)
    uses_image = needs_image = True  # the repo comes in it; the agent bundle is uploaded at boot
    capture_via_url = True

    def __init__(self, spec: SandboxSpec, sbx) -> None:
        super().__init__(spec)
        self.sbx = sbx
        url = spec.capture_url or public_url()
        self.capture_base_url = f"{url.rstrip('/')}/capture" if url else None

    @classmethod
    async def create(cls, spec: SandboxSpec) -> HFSandbox:
        Sandbox = _sdk()
        if not spec.image:
            raise SandboxError("the hf backend needs the task's image (this task has none)")
        try:
            sbx = await asyncio.to_thread(
                Sandbox.create,
                spec.image,
                idle_timeout=max(60, math.ceil(spec.deadline_s)),
                env=dict(spec.env),
                labels=_labels(spec.labels),
            )
        except Exception as e:
            raise SandboxError(f"creating the HF sandbox failed: {type(e).__name__}: {e}") from e
        self = cls(spec, sbx)
        try:
            await self._prepare()
        except BaseException:
            await self.close()
            raise
        return self

    async def _run_short(self, cmd: str) -> None:
        await asyncio.to_thread(self.sbx.run, cmd, timeout=SHORT_TIMEOUT, check=False)

    async def _prepare(self) -> None:
        steps = [f"mkdir -p {STATE_DIR} /home/agent"]
        if self.spec.repo_source:
            raise SandboxError("the hf backend takes the repository from the image (no local repository source)")
        if self.spec.base_commit and self.spec.strip_history:
            steps.append(strip_history_script(self.spec.workdir, self.spec.base_commit))
        res = await self.exec("set -e\n" + "\n".join(steps), timeout=600, cwd="/")
        if not res.ok:
            raise SandboxError(f"preparing the sandbox failed: {(res.stderr or res.stdout)[-500:]}")
        if self.spec.secrets:
            await self.write_file(SECRETS_FILE, self.secrets_file(), 0o600)
        await self.deliver_bundles()

    async def _spawn(self, script: str, stdin: bytes | None) -> RemoteProcess:
        pid_id, cmd = detached(script, self.remaining(), stdin is not None)
        if stdin is not None:
            await self.write_file(f"{STATE_DIR}/{pid_id}.in", stdin, 0o600)
        handle = await asyncio.to_thread(self.sbx.run, cmd, background=True)

        async def finished() -> bool:
            procs = await asyncio.to_thread(self.sbx.processes)
            return not any(p.id == handle.id and p.running for p in procs)  # not listed any more: gone

        async def cancel() -> None:
            await asyncio.to_thread(handle.kill)

        async def read(path: str) -> bytes:
            return await self.read_file(path)

        return RemoteProcess(pid_id, finished, read, self._run_short, cancel)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        await asyncio.to_thread(self.sbx.files.write, path, data, mode=f"{mode:04o}")

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        if self._closed:
            raise SandboxError("sandbox is closed")
        return (await asyncio.to_thread(self.sbx.files.read, path))[:limit]

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        await asyncio.to_thread(self.sbx.files.upload, str(local), path, mode=f"{mode:04o}")

    async def _teardown(self) -> None:
        try:
            await asyncio.to_thread(self.sbx.kill)
        except Exception:  # idle_timeout and `reap_orphans` remove it
            pass
