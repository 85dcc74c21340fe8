"""`e2b` sandbox backend: the `e2b` SDK's `AsyncSandbox` (extra `sandboxes`).

- A template per image: `SWE_GYM_E2B_TEMPLATES` (JSON `{"image": "template"}`) names them; an image without an entry
  is used as the template name itself. `create(template, timeout=deadline, metadata=labels, envs=env)`: the
  provider's TTL is the deadline, so the sandbox dies by itself at its deadline.
- Commands run detached (`commands.run(cmd, background=True, timeout=0)`), polled through the handle's exit code,
  and killed (`handle.kill()` plus the whole session by pid file); files through `files.write/read`;
  `get_host(port)` is how a caller reaches a port inside; teardown `kill()`.
- Orphans: `Sandbox.list(query=SandboxQuery(metadata={server}))` and `Sandbox.kill(sandbox_id)`.
- The agent: its bundle (a content-addressed tree in spec.ro_mounts) is uploaded as a tarball (streamed from the
  file), unpacked at its mount path (with `sudo -n` where the template's user cannot create it) and checked against
  its digest inside, after the image's glibc was checked (`deliver_bundles`). The template needs no Node.
The SDK is imported on first use; the calls and arguments are pinned by tests/test_sandbox_contracts.py.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from swe_gym_env.core.settings import setting
from swe_gym_env.server.sandbox import remote
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec, SandboxUnavailable


def _sdk():
    try:
        import e2b
    except ImportError as e:
        raise SandboxUnavailable("the e2b SDK is needed: pip install 'swe_gym_env[sandboxes]'") from e
    return e2b


def template_for(image: str) -> str:
    return setting("e2b_templates").get(image, image)  # SWE_GYM_E2B_TEMPLATES


def preflight() -> tuple[bool, str]:
    try:
        _sdk()
    except SandboxUnavailable as e:
        return False, str(e)
    if not os.environ.get("E2B_API_KEY"):
        return False, "no E2B credentials: set E2B_API_KEY"
    if not setting("public_url"):
        return False, "SWE_GYM_PUBLIC_URL is not set: E2B sandboxes reach /capture at the server's public URL"
    return True, "e2b SDK; E2B_API_KEY present"


def reap_orphans() -> list[str]:
    if not os.environ.get("E2B_API_KEY"):
        return []
    e2b = _sdk()
    from e2b.sandbox.sandbox_api import SandboxQuery

    pages = e2b.Sandbox.list(query=SandboxQuery(metadata=remote.our_labels()))

    def listed():
        while pages.has_next:
            yield from ((info.sandbox_id, info.metadata) for info in pages.next_items())

    return remote.kill_orphans(listed(), e2b.Sandbox.kill, "e2b")


class E2BSandbox(remote.RemoteSandbox):
    """Mapped to an E2B template, which holds the repo; the agent bundle is uploaded."""

    reap_orphans = staticmethod(reap_orphans)
    preflight = staticmethod(preflight)

    @classmethod
    async def create(cls, spec: SandboxSpec) -> E2BSandbox:
        e2b = _sdk()
        if not spec.image:
            raise SandboxError("the e2b backend needs the task's image (mapped to an E2B template)")
        if spec.repo_source:
            raise SandboxError("the e2b backend takes the repository from the template (no local repository source)")
        try:
            sbx = await e2b.AsyncSandbox.create(
                template=template_for(spec.image),
                timeout=remote.own_timeout_s(spec.deadline_s),
                metadata=remote.provider_labels(spec.labels),
                envs=dict(spec.env),
            )
        except Exception as e:
            raise SandboxError(f"creating the E2B sandbox failed: {type(e).__name__}: {e}") from e
        self = cls(spec, sbx)
        return await self._boot(self._prepare)

    def host(self, port: int) -> str:
        """Where a port inside the sandbox answers from outside."""
        return self.sbx.get_host(port)

    async def _run_short(self, cmd: str) -> None:
        try:
            await self.sbx.commands.run(cmd, timeout=60)
        except Exception:  # a non-zero exit raises in the SDK; a kill that finds nothing is fine
            pass

    async def _spawn(self, script: str, stdin: bytes | None) -> remote.RemoteProcess:
        pid_id, cmd = await self._detach(script, stdin)
        handle = await self.sbx.commands.run(cmd, background=True, timeout=0)

        async def finished() -> bool:
            return handle.exit_code is not None

        async def cancel() -> None:
            try:
                await handle.kill()
            except Exception:
                pass

        return remote.RemoteProcess(pid_id, finished, self.read_file, self._run_short, cancel)

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        await self.sbx.files.write(path, data)
        await self._run_short(f"chmod {mode:o} '{path}'" if "'" not in path else "true")

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes:
        if self._closed:
            raise SandboxError("sandbox is closed")
        return bytes(await self.sbx.files.read(path, format="bytes"))[:limit]

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
        f = await asyncio.to_thread(open, local, "rb")  # streamed from the file, not read into memory first
        try:
            await self.sbx.files.write(path, f)
        finally:
            f.close()
        await self._run_short(f"chmod {mode:o} '{path}'" if "'" not in path else "true")

    async def _teardown(self) -> None:
        try:
            await self.sbx.kill()
        except Exception:  # the provider's TTL and `reap_orphans` remove it
            pass
