"""`GET /metadata` (OpenEnv's EnvironmentMetadata) and `GET /schema` (SchemaResponse, from wire.py's models)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from importlib.metadata import metadata as dist_metadata

from fastapi import FastAPI
from pydantic import TypeAdapter

from swe_gym_env.server.openenv.models import (
    ENV_NAME,
    STEP_ACTION,
    CallToolObservation,
    EnvironmentMetadata,
    EnvState,
    ListToolsObservation,
    Observation,
)
from swe_gym_env.wire import RolloutRequest

DIST = "swe_gym_env"  # the distribution whose version and README /metadata reports
DESCRIPTION = (
    "Coding-agent RL rollouts on real software tasks: run_rollout boots a sandbox, runs the agent with "
    "every model call captured (prompt/completion token ids, logprobs), grades its diff with the task's "
    "tests and returns the reward and the token-level trace."
)


def _readme() -> str | None:
    """The project README as the installed distribution carries it (its long description, from pyproject's
    `readme`), so an installed wheel has it as well as a checkout."""
    try:
        return dist_metadata(DIST)["Description"] or None
    except (PackageNotFoundError, KeyError):
        return None


def _metadata() -> EnvironmentMetadata:
    try:
        ver = version(DIST)
    except PackageNotFoundError:
        ver = None
    return EnvironmentMetadata(name=ENV_NAME, description=DESCRIPTION, readme_content=_readme(), version=ver)


def _schemas() -> dict:
    action = STEP_ACTION.json_schema()
    action.setdefault("$defs", {})["RolloutRequest"] = RolloutRequest.model_json_schema()
    action["description"] = (
        "A step is one MCP tool call: call_tool (run_rollout takes RolloutRequest's fields as arguments) or list_tools."
    )
    return {
        "action": action,
        "observation": TypeAdapter(CallToolObservation | ListToolsObservation).json_schema(),
        "state": EnvState.model_json_schema(),
        "reset_observation": Observation.model_json_schema(),
    }


def install_info_routes(app: FastAPI) -> None:
    """Add /metadata and /schema to ``app``."""

    @app.get("/metadata", tags=["Environment Info"])
    async def metadata() -> EnvironmentMetadata:
        return _metadata()

    @app.get("/schema", tags=["Schema"])
    async def schema() -> dict:
        return _schemas()
