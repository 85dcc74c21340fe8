"""OpenEnv's wire shapes: JSON-RPC requests and replies, MCP step actions and observations, state, metadata and the
websocket messages (openenv 0.10.0: `openenv/core/env_server/mcp_types.py`, `types.py`)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from swe_gym_env.wire import Capabilities, RolloutResult, RolloutSummary, TaskPage, TaskView

ENV_NAME = "swe_gym_env"


# -- JSON-RPC (openenv/core/env_server/mcp_types.py: JsonRpcErrorCode, JsonRpcRequest, JsonRpcResponse) ----------
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000


class JsonRpcRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


def rpc_result(request_id: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


# -- MCP step actions and observations (openenv/core/env_server/mcp_types.py, types.py) ----------------------------
class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the action")


class CallToolAction(_Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str = Field(description="Name of the tool to call, e.g. run_rollout")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Tool arguments; run_rollout takes RolloutRequest's fields"
    )


class ListToolsAction(_Action):
    type: Literal["list_tools"] = "list_tools"


StepAction = Annotated[CallToolAction | ListToolsAction, Field(discriminator="type")]
STEP_ACTION = TypeAdapter(StepAction)


class ToolErrorInfo(BaseModel):
    error_type: Literal["execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"]
    message: str


class ToolCallResult(BaseModel):
    """What a tool call returns on every OpenEnv path (fastmcp's CallToolResult, as OpenEnv serialises it)."""

    content: list[dict[str, Any]]
    structured_content: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    data: RolloutResult | RolloutSummary | list[RolloutSummary] | TaskPage | TaskView | Capabilities | bool | None
    is_error: bool = False


class Observation(BaseModel):
    done: bool = False
    reward: float | None = Field(default=None, description="run_rollout's reward once the rollout is graded")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ToolSpec(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any]


class CallToolObservation(Observation):
    tool_name: str
    result: ToolCallResult | None = None
    error: ToolErrorInfo | None = None


class ListToolsObservation(Observation):
    tools: list[ToolSpec]


class EnvState(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)
    session_id: str | None = None
    rollouts_in_flight: int = Field(
        default=0, ge=0, description="Rollouts running on this server, all sessions together"
    )


class EnvironmentMetadata(BaseModel):
    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


# -- websocket messages (openenv/core/env_server/types.py WS*Message; plus our optional request_id) ---------------
RequestId = Annotated[str, Field(max_length=255)] | int


class WSMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    request_id: RequestId | None = Field(default=None, description="Echoed in every reply to this message")


class WSResetMessage(WSMessage):
    type: Literal["reset"] = "reset"
    data: dict[str, Any] = Field(default_factory=dict)


class WSStepMessage(WSMessage):
    type: Literal["step"] = "step"
    data: dict[str, Any]


class WSStateMessage(WSMessage):
    type: Literal["state"] = "state"


class WSCloseMessage(WSMessage):
    type: Literal["close"] = "close"


class WSMCPMessage(WSMessage):
    type: Literal["mcp"] = "mcp"
    data: dict[str, Any]


WS_MESSAGES: dict[str, type[WSMessage]] = {
    "reset": WSResetMessage,
    "step": WSStepMessage,
    "state": WSStateMessage,
    "close": WSCloseMessage,
    "mcp": WSMCPMessage,
}


def ws_error(message: str, code: str, **extra: Any) -> dict:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def validation_errors(e: ValidationError) -> list[dict]:
    return json.loads(e.json())
