"""Shared test helpers: the built-in engine in process, and SSE parsing."""

from __future__ import annotations

import json

import httpx

from swe_gym_env.server.assets import tokenizer_file
from swe_gym_env.server.engine.app import Engine, create_engine_app
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import make_policy

MODEL = "smollm2-135m-instruct"

PI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "strict": False,
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Edit a file",
            "strict": False,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "edits": {"type": "array", "items": {"type": "object"}}},
            },
        },
    },
]


def engine_app(policy: str = "oracle"):
    return create_engine_app(Engine(ChatRenderer(tokenizer_file()), make_policy(policy), MODEL))


def engine_client(policy: str = "oracle") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=engine_app(policy)), base_url="http://engine")


def sse_events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out
