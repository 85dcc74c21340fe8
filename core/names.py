"""The one list of harness and sandbox-backend names.

Everything else derives from these tables: the registries load the classes from them lazily
(`server/agents/registry.py`, `server/sandbox/registry.py`), `wire.py` builds its `Harness` / `SandboxBackend`
Literals from their keys, the CLI takes its `choices` from them, and `capabilities` / `info` list the registries.
Adding a harness or a backend is one class plus one row here.

Stdlib only and no project imports: `wire.py` (which the light client uses) imports this module.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, NamedTuple


class Plugin(NamedTuple):
    target: str  # "module:Class", imported on first use
    install: str  # what to install when the class cannot load (its SDK, binary or daemon is missing)

    def load(self) -> Any:
        """The class, imported on first use (the registries' one lazy loader). Raises ImportError naming what to
        install."""
        try:
            return _import(self.target)
        except ImportError as e:
            raise ImportError(f"{e}; install: {self.install}") from e


@functools.cache
def _import(target: str) -> Any:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def _harness(name: str, module: str, cls: str) -> tuple[str, Plugin]:
    """A harness's row: its class in `server/agents/harnesses/<module>.py`, installed by `setup --harness <name>`."""
    return name, Plugin(f"swe_gym_env.server.agents.harnesses.{module}:{cls}", f"swe-gym-env setup --harness {name}")


HARNESSES: dict[str, Plugin] = dict(
    [
        _harness("pi", "pi", "PiHarness"),
        _harness("opencode", "opencode", "OpenCodeHarness"),
        _harness("codex", "codex", "CodexHarness"),
        _harness("claude-code", "claude_code", "ClaudeCodeHarness"),
        _harness("gemini-cli", "gemini_cli", "GeminiCliHarness"),
        _harness("mini-swe-agent", "mini_swe_agent", "MiniSweAgentHarness"),
        _harness("openhands", "openhands", "OpenHandsHarness"),
        _harness("kilocode", "kilocode", "KiloCodeHarness"),
        _harness("qwen-code", "qwen_code", "QwenCodeHarness"),
        _harness("cline", "cline", "ClineHarness"),
        _harness("kimi-cli", "kimi_cli", "KimiCliHarness"),
        _harness("mistral-vibe", "mistral_vibe", "MistralVibeHarness"),
        _harness("aider", "aider", "AiderHarness"),
        _harness("hermes", "hermes", "HermesHarness"),
        _harness("terminus-2", "terminus2", "Terminus2Harness"),
        _harness("droid", "droid", "DroidHarness"),
        _harness("openclaw", "openclaw", "OpenClawHarness"),
    ]
)

# The harnesses whose bundles the Space image carries (`swe-gym-env setup --harness image`); the others are built on
# a rollout's first use there, with progress (the other ten bundles are 3.2 GiB: the image grows by none of it).
IMAGE_HARNESSES: tuple[str, ...] = (
    "pi",
    "opencode",
    "codex",
    "claude-code",
    "gemini-cli",
    "mini-swe-agent",
    "openhands",
)

SANDBOXES: dict[str, Plugin] = {
    "local": Plugin("swe_gym_env.server.sandbox.local:LocalSandbox", "apt-get install bubblewrap; swe-gym-env setup"),
    "landlock": Plugin("swe_gym_env.server.sandbox.landlock:LandlockSandbox", "Linux >= 6.12 (Landlock ABI 6)"),
    "docker": Plugin(
        "swe_gym_env.server.sandbox.docker:DockerSandbox", "scripts/setup_docker.sh (docker.io + dockerd)"
    ),
    "hf": Plugin("swe_gym_env.server.sandbox.hf:HFSandbox", "pip install 'huggingface_hub>=1.22' and an HF token"),
    "hf-pool": Plugin(
        "swe_gym_env.server.sandbox.hf_pool:HFPoolSandbox", "pip install 'huggingface_hub>=1.22' and an HF token"
    ),
    "e2b": Plugin("swe_gym_env.server.sandbox.e2b:E2BSandbox", "pip install 'swe_gym_env[sandboxes]' and E2B_API_KEY"),
}

DEFAULT_HARNESS = "pi"
DEFAULT_SANDBOX = "local"
