"""What the Python agents (mini-swe-agent, OpenHands) share: a launcher script of ours run by the bundle's own
Python (`pyruntime`), which logs every socket the agent's Python opens (`AUDIT`, read back by the network tests), the
agent's config as a 0600 file, the session key in a 0600 env file sourced by the command (never argv), and the
variables that keep the agent and litellm offline (`quiet`) exported, those that would turn telemetry on (`unset`)
removed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AGENT_HOME, BUNDLE_MOUNT, AgentConfig, AgentError
from swe_gym_env.server.agents.bundle import BundledHarness

KEY_FILE = f"{AGENT_HOME}/.capture.env"
# the launcher's first lines: every connect / name lookup / datagram of the agent's Python, one JSON line each, to
# the file $SWE_GYM_NET_LOG names (the variable is taken out before the agent runs)
AUDIT = """import json, os, sys
NET = os.environ.pop("SWE_GYM_NET_LOG")
def _audit(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.sendto"):
        try:
            with open(NET, "a") as f:
                f.write(json.dumps([event, repr(args[1] if event == "socket.connect" else args[:2])]) + "\\n")
        except OSError:
            pass
sys.addaudithook(_audit)
"""


class PythonAgent(BundledHarness):
    """A Python agent run by its launcher (`launcher`, written to `launch_path` per rollout) on the bundle's Python
    `python_version`, its output to `log_path`, its sockets to `net_path`."""

    installer: ClassVar[str] = "pip install"
    needs_node: ClassVar[bool] = False
    min_glibc: ClassVar[str] = "2.17"  # its own loader and C library: the image's glibc is never used
    bundle_verifier: ClassVar[str | None] = None
    python_version: ClassVar[str] = pyruntime.VERSION
    key_env: ClassVar[str] = "OPENAI_API_KEY"  # litellm's openai provider reads it at call time
    launcher: ClassVar[str]  # the script: AUDIT, then the agent's own start
    launch_path: ClassVar[str]
    config_path: ClassVar[str]
    net_path: ClassVar[str]
    log_path: str
    quiet: ClassVar[dict[str, str]] = {}
    unset: ClassVar[tuple[str, ...]] = ()

    def finished_install(self) -> Path:
        """Its install directory, holding a finished install (`ensure_installed` marks it last), else AgentError."""
        root = self.install_dir()
        if not (root / ".installed").is_file():
            raise AgentError("install", f"{root} holds no finished install of {self.name}")
        return root

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        raise NotImplementedError

    def extra_files(self) -> dict[str, tuple[bytes, int]]:
        return {}

    def launch_args(self, cfg: AgentConfig) -> str:
        raise NotImplementedError

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        return {
            self.config_path: (self.config_text(cfg, prompt), 0o600),
            self.launch_path: (self.launcher.encode(), 0o600),
            **self.extra_files(),
            KEY_FILE: (f"{self.key_env}={shlex.quote(key)}\n".encode(), 0o600),
        }

    def command(self, cfg: AgentConfig) -> str:
        quiet = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.quiet.items())
        unset = f"unset {' '.join(self.unset)}\n" if self.unset else ""
        return (
            f"set -a; . {KEY_FILE}; set +a\n{unset}"
            f"export {quiet} SWE_GYM_NET_LOG={self.net_path} XDG_CONFIG_HOME={AGENT_HOME}/.config "
            f"XDG_CACHE_HOME={AGENT_HOME}/.cache\n"
            f"{pyruntime.python_command(BUNDLE_MOUNT, self.python_version)} {self.launch_path} {self.launch_args(cfg)} "
            f"< /dev/null > {self.log_path} 2>&1"
        )
