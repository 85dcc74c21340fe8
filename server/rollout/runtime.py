"""What the running server learns at start and passes down, apart from its configuration (which never changes once
built): the addresses it serves /capture on to sandboxes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Sockets:
    """Set by the app's lifespan once the capture-only listeners run; None before (a sandbox then has no way out)."""

    capture: Path | None = None  # the unix socket; its TCP port is written beside it (landlock's way in)
