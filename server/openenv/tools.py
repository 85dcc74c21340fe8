"""The MCP-tool bridge: OpenEnv's paths call the same FastMCP tools in process (`mcp.call_tool`), so a tool behaves
the same on every path; results in OpenEnv's shapes. Tool names OpenEnv reserves are never listed or called."""

from __future__ import annotations

import logging
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import NotFoundError
from fastmcp.exceptions import ValidationError as ToolArgumentsError
from fastmcp.tools.base import ToolResult

from swe_gym_env.server.mcp_tools import RESERVED_TOOL_NAMES, result_form_default
from swe_gym_env.server.openenv.models import INTERNAL_ERROR, INVALID_PARAMS

log = logging.getLogger(__name__)


class ToolCallError(Exception):
    def __init__(self, error_type: str, message: str, rpc_code: int = INTERNAL_ERROR) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.rpc_code = rpc_code


def _content_block(block: Any) -> dict:
    d = block.model_dump(mode="json") if hasattr(block, "model_dump") else dict(block)
    if "_meta" in d:
        d["meta"] = d.pop("_meta")
    d.setdefault("annotations", None)
    d.setdefault("meta", None)
    return d


def tool_result_payload(res: ToolResult) -> dict:
    """fastmcp's client-side CallToolResult as OpenEnv serialises it: content, structured_content, meta, data
    (the structured result, unwrapped when fastmcp wrapped a non-object return), is_error."""
    sc = res.structured_content
    meta = res.meta
    data = None
    if sc is not None:
        wrapped = isinstance(meta, dict) and bool((meta.get("fastmcp") or {}).get("wrap_result"))
        data = sc.get("result") if wrapped else sc
    return {
        "content": [_content_block(b) for b in res.content],
        "structured_content": sc,
        "meta": meta,
        "data": data,
        "is_error": bool(res.is_error),
    }


class ToolBridge:
    def __init__(self, mcp: FastMCP) -> None:
        self.mcp = mcp

    async def tools(self) -> list:
        tools = []
        for t in await self.mcp.list_tools():
            if t.name in RESERVED_TOOL_NAMES:
                log.warning("tool %r uses a name OpenEnv reserves; not offered", t.name)
                continue
            tools.append(t)
        return tools

    async def list_wire(self) -> list[dict]:
        """tools/list entries as OpenEnv's HTTP /mcp returns them (mcp's Tool, field names as on the wire)."""
        out = []
        for t in await self.tools():
            d = t.to_mcp_tool().model_dump(mode="json", by_alias=True)
            d["meta"] = d.pop("_meta", None)
            out.append(
                {
                    "name": d.get("name"),
                    "title": d.get("title"),
                    "description": d.get("description"),
                    "inputSchema": d.get("inputSchema") or {},
                    "outputSchema": d.get("outputSchema"),
                    "icons": d.get("icons"),
                    "annotations": d.get("annotations"),
                    "meta": d.get("meta"),
                    "execution": d.get("execution"),
                }
            )
        return out

    async def list_specs(self) -> list[dict]:
        """list_tools step observation entries (OpenEnv's Tool: name, description, input_schema)."""
        return [
            {"name": t.name, "description": t.description or "", "input_schema": t.parameters or {}}
            for t in await self.tools()
        ]

    async def call(self, name: str, arguments: dict[str, Any]) -> dict:
        """Call a tool; its result in OpenEnv's shape, or ToolCallError."""
        if name in RESERVED_TOOL_NAMES:
            raise ToolCallError(
                "tool_not_found",
                f"Tool name {name!r} is reserved by OpenEnv ({', '.join(sorted(RESERVED_TOOL_NAMES))})",
                INVALID_PARAMS,
            )
        try:
            with result_form_default("compact"):  # OpenEnv's clients get the whole result, as before
                res = await self.mcp.call_tool(name, arguments)
        except NotFoundError as e:
            raise ToolCallError("tool_not_found", str(e)) from e
        except ToolArgumentsError as e:
            raise ToolCallError("invalid_args", str(e)) from e
        except Exception as e:  # the tool's own failure, as fastmcp reports it
            raise ToolCallError("execution_error", str(e) or type(e).__name__) from e
        if res.is_error:
            text = "\n".join(getattr(b, "text", "") for b in res.content) or "tool reported an error"
            raise ToolCallError("execution_error", text)
        return tool_result_payload(res)
