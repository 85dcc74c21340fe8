"""Render chat requests with our ChatML+tools template and tokenise them with SmolLM2's real tokenizer.

Rendering follows what vLLM does before it applies a template (checked against a real vLLM in
tests/test_vllm_real.py): tool-call `arguments` strings are decoded into objects (vLLM re-serialises them), tools
are rebuilt in vLLM's key order, and Jinja runs with transformers' settings
(trim_blocks, lstrip_blocks, a `tojson` that keeps non-ASCII characters).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from swe_gym_env.core.assets import TEMPLATE_PATH

EOS_TOKEN = "<|im_end|>"


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _decode_arguments(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:
            m = {**m, "tool_calls": [_decode_call(c) for c in calls]}
        out.append(m)
    return out


def _decode_call(call: dict) -> dict:
    """Tool-call arguments as vLLM hands them to the template: a JSON object, `{}` when empty or not one."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args else {}
        except ValueError:
            args = {}
    return {**call, "function": {**fn, "arguments": args if isinstance(args, dict) else {}}}


def normalize_tool(tool: dict) -> dict:
    """A tool as vLLM rebuilds it before rendering: fixed key order, missing fields null, unknown keys dropped."""
    fn = tool.get("function") or {}
    out_fn = {"name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")}
    if fn.get("strict") is not None:
        out_fn["strict"] = fn["strict"]
    defer = fn.get("defer_loading") if fn.get("defer_loading") is not None else tool.get("defer_loading")
    if defer is not None:
        out_fn["defer_loading"] = defer
    out = {"type": "function", "function": out_fn}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


class ChatRenderer:
    def __init__(self, tokenizer_path: Path, template_path: Path = TEMPLATE_PATH) -> None:
        self.tokenizer_path = tokenizer_path
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"], undefined=jinja2.Undefined
        )
        env.filters["tojson"] = _tojson
        self.template = env.from_string(template_path.read_text())

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))

    @cached_property
    def eos_token_id(self) -> int:
        eos = self.tokenizer.token_to_id(EOS_TOKEN)
        if eos is None:
            raise ValueError(f"the tokenizer has no {EOS_TOKEN!r} token")
        return eos

    def render(self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = True) -> str:
        return self.template.render(
            messages=_decode_arguments(messages),
            tools=[normalize_tool(t) for t in tools] if tools else None,
            add_generation_prompt=add_generation_prompt,
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id])

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render(messages, tools))
