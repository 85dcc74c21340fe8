"""The one list of harness and sandbox-backend names.

Everything else derives from these tables: the registries load the classes from them lazily
(`server/agents/registry.py`, `server/sandbox/registry.py`), `wire.py` builds its `Harness` / `SandboxBackend`
Literals from their keys, the CLI takes its `choices` from them, and `capabilities` / `info` list the registries.
Adding a harness or a backend is one class plus one row here.

Stdlib only and no project imports: `wire.py` (which the light client uses) imports this module.
"""

from __future__ import annotations

from typing import NamedTuple


class Plugin(NamedTuple):
    target: str  # "module:Class", imported on first use
    install: str  # what to install when the class cannot load (its SDK, binary or daemon is missing)


HARNESSES: dict[str, Plugin] = {
    "pi": Plugin("swe_gym_env.server.agents.pi:PiHarness", "swe-gym-env setup --harness pi"),
    "opencode": Plugin("swe_gym_env.server.agents.opencode:OpenCodeHarness", "swe-gym-env setup --harness opencode"),
    "codex": Plugin("swe_gym_env.server.agents.codex:CodexHarness", "swe-gym-env setup --harness codex"),
    "claude-code": Plugin(
        "swe_gym_env.server.agents.claude_code:ClaudeCodeHarness", "swe-gym-env setup --harness claude-code"
    ),
    "gemini-cli": Plugin(
        "swe_gym_env.server.agents.gemini_cli:GeminiCliHarness", "swe-gym-env setup --harness gemini-cli"
    ),
    "mini-swe-agent": Plugin(
        "swe_gym_env.server.agents.mini_swe_agent:MiniSweAgentHarness", "swe-gym-env setup --harness mini-swe-agent"
    ),
    "openhands": Plugin(
        "swe_gym_env.server.agents.openhands:OpenHandsHarness", "swe-gym-env setup --harness openhands"
    ),
    "kilocode": Plugin("swe_gym_env.server.agents.kilocode:KiloCodeHarness", "swe-gym-env setup --harness kilocode"),
    "qwen-code": Plugin("swe_gym_env.server.agents.qwen_code:QwenCodeHarness", "swe-gym-env setup --harness qwen-code"),
    "cline": Plugin("swe_gym_env.server.agents.cline:ClineHarness", "swe-gym-env setup --harness cline"),
    "kimi-cli": Plugin("swe_gym_env.server.agents.kimi_cli:KimiCliHarness", "swe-gym-env setup --harness kimi-cli"),
    "mistral-vibe": Plugin(
        "swe_gym_env.server.agents.mistral_vibe:MistralVibeHarness", "swe-gym-env setup --harness mistral-vibe"
    ),
}

# The harnesses whose bundles the Space image carries (`swe-gym-env setup --harness image`); the others are built on
# a rollout's first use there, with progress (their five bundles are ~1.3 GB: the image grows by none of it).
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
