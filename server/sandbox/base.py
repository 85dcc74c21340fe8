"""The sandbox protocol. Backends know nothing of agents; the rollout pipeline composes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

OUTPUT_LIMIT = 256 * 1024
TRUNCATED = "\n[... output truncated by swe_gym_env ...]\n"


class SandboxError(RuntimeError):
    """Creating or using a sandbox failed; the message says what and, where it can, how to fix it."""


@dataclass(frozen=True)
class SandboxSpec:
    repo_source: str  # a git repository or bundle on the host (the local backend)
    base_commit: str
    workdir: str = "/testbed"
    capture_socket: Path | None = None  # host unix socket serving /capture only; None: no way out at all
    ro_mounts: dict[str, str] = field(default_factory=dict)  # host path -> sandbox path
    env: dict[str, str] = field(default_factory=dict)  # non-secret environment (secrets go through files)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def clip(data: bytes, limit: int = OUTPUT_LIMIT) -> str:
    text = data.decode("utf-8", "replace")
    return text if len(text) <= limit else text[: limit // 2] + TRUNCATED + text[-limit // 2 :]


class Sandbox(Protocol):
    capture_base_url: str | None  # where, inside the sandbox, /capture answers

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float,
        stdin: bytes | None = None,
        relay: bool = False,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, limit: int = 64 * 1024 * 1024) -> bytes: ...

    async def close(self) -> None: ...
