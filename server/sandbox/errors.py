"""The sandbox error tree (its own module, so that every sandbox module can raise it without an import cycle).

`SandboxError` (creating or using a sandbox failed; the message names the fix where there is one)
  ├── `SandboxUnavailable` (the backend cannot run here at all: binary, daemon, credentials, SDK or image missing)
  └── `SandboxGone` (the sandbox itself is dead or silent: its job died, expired or stopped answering)
"""

from __future__ import annotations


class SandboxError(RuntimeError):
    """Creating or using a sandbox failed; the message says what and, where it can, how to fix it."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run here (binary, daemon, credentials, SDK or image missing)."""


class SandboxGone(SandboxError):
    """The sandbox itself is gone (its job died, expired or stopped answering): no call on it can succeed any more,
    so a command in it has no exit code to read (never mistake this for a command that exited)."""
