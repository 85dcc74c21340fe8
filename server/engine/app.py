"""The built-in vLLM-compatible engine (`swe-gym-env engine`). It is NOT a model.

It speaks vLLM's OpenAI-compatible dialect with vLLM's token-capture fields (`prompt_token_ids`,
`choices[].token_ids`, `logprobs` with the `token_id:N` form) and tokenises with SmolLM2's real tokenizer and our
ChatML+tools template, so its prompt ids are the ones a real vLLM serving that template produces. Its replies come
from a scripted policy (see `policy.py`); its logprobs are deterministic placeholders, not a model's beliefs.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import Policy, Reply

MAX_MODEL_LEN = 8192
MAX_LOGPROBS = 20


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def _fake_logprob(position: int, token_id: int) -> float:
    # Deterministic placeholder in (-0.5, 0): the engine samples nothing, so there is no real distribution.
    h = zlib.crc32(f"{position}:{token_id}".encode())
    return -((h % 5000) + 1) / 10000.0


class Completion:
    """One scripted completion: its text, ids, logprobs and the message the agent sees."""

    def __init__(self, renderer: ChatRenderer, reply: Reply, max_tokens: int, offset: int) -> None:
        self.tool_calls = [
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            }
            for name, args in reply.tool_calls
        ]
        # The completion text is exactly what the template renders for this assistant message, so the next
        # prompt extends this one.
        parts = [reply.content or ""]
        call_texts = [
            '<tool_call>\n{"name": "'
            + c["function"]["name"]
            + '", "arguments": '
            + c["function"]["arguments"]
            + "}\n</tool_call>"
            for c in self.tool_calls
        ]
        self.content_ids = renderer.encode(parts[0]) if parts[0] else []
        sep = renderer.encode("\n")
        self.call_ids: list[list[int]] = []
        for i, text in enumerate(call_texts):
            lead = sep if (i > 0 or parts[0]) else []
            self.call_ids.append(lead + renderer.encode(text))
        ids = self.content_ids + [t for c in self.call_ids for t in c] + [renderer.eos_token_id]
        self.finish_reason = "tool_calls" if self.tool_calls else "stop"
        if len(ids) > max_tokens:
            ids = ids[:max_tokens]
            self.finish_reason = "length"
            self.tool_calls = []
            self.content_ids = ids
            self.call_ids = []
        self.content = reply.content if self.finish_reason != "length" else renderer.decode(ids)
        self.token_ids = ids
        self.logprobs = [_fake_logprob(offset + i, t) for i, t in enumerate(ids)]

    def message(self) -> dict[str, Any]:
        # vLLM's message keys (tests/fixtures/vllm): `tool_calls` only when there are calls.
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": self.content or None,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        msg["reasoning"] = None
        return msg


class Engine:
    def __init__(
        self,
        renderer: ChatRenderer,
        policy: Policy,
        served_model: str,
        delay_s: float = 0.0,
        max_model_len: int = MAX_MODEL_LEN,
    ) -> None:
        self.renderer = renderer
        self.max_model_len = max_model_len  # SmolLM2's 8192 by default; OpenCode's ~7.9k-token prompt needs more
        self.policy = policy
        self.served_model = served_model
        self.delay_s = delay_s  # seconds to wait before each reply (to watch a rollout unfold: UI tests, demos)
        self.capture_level = "tokens"  # "logprobs" / "text": behave like engines that return less (certification)

    def output_budget(self, body: dict, prompt_len: int) -> tuple[int, tuple[str, str] | None]:
        """How many tokens a reply may have, or why vLLM (0.32) refuses the request, as (message, param): as vLLM, only
        a prompt longer than the context, one that fills it, or an output cap larger than the whole context is
        refused; a prompt that fits gets the cap it asked for cut to the room left (`get_max_tokens`), and stops
        there with `finish_reason: length`. The messages are vLLM's, word for word (tests/test_vllm_real.py)."""
        max_len = self.max_model_len
        param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        requested = body.get(param)
        if requested is not None and int(requested) > max_len:
            why = f"{param}={int(requested)} cannot be greater than max_model_len={max_len}. Please request fewer "
            why += "output tokens."
            return 0, (f"{why} (parameter={param}, value={int(requested)})", param)
        if prompt_len > max_len:  # vLLM tokenises at most one token past the context, then says "at least"
            seen = max_len + 1
            return 0, (
                f"This model's maximum context length is {max_len} tokens. However, your prompt contains at least "
                f"{seen} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
                f"length of the input prompt. (parameter=input_tokens, value={seen})",
                "input_tokens",
            )
        room = max_len - prompt_len
        budget = room if requested is None else min(room, int(requested))
        if budget < 1:  # the prompt fills the context exactly: vLLM's sampling params refuse max_tokens=0
            return 0, (
                f"max_tokens must be at least 1, got {budget}. (parameter=max_tokens, value={budget})",
                "max_tokens",
            )
        return budget, None

    def logprob_entries(self, ids: list[int], lps: list[float], as_ids: bool, top: int) -> list[dict]:
        out = []
        for t, lp in zip(ids, lps, strict=True):
            text = self.renderer.token_text(t)
            tok = f"token_id:{t}" if as_ids else text
            entry = {"token": tok, "logprob": lp, "bytes": list(text.encode())}
            entry["top_logprobs"] = [dict(entry)][:top] if top else []
            out.append(entry)
        return out

    def _refusal(self, body: Any) -> Response | None:
        """vLLM's answer to a request it would refuse before rendering the prompt, or None."""
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages must be a non-empty list")
        if body.get("model") not in (None, self.served_model):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        tools = body.get("tools")
        if tools is not None and (not isinstance(tools, list) or not tools):
            return _error(400, "tools must not be an empty array")
        if int(body.get("top_logprobs") or 0) > MAX_LOGPROBS:
            return _error(400, f"top_logprobs must be <= {MAX_LOGPROBS}")
        return None

    async def chat(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not valid JSON")
        if (refusal := self._refusal(body)) is not None:
            return refusal
        tools = body.get("tools")
        top = int(body.get("top_logprobs") or 0)
        prompt_ids = self.renderer.prompt_ids(body["messages"], tools)
        max_tokens, refused = self.output_budget(body, len(prompt_ids))
        if refused is not None:
            return _error(400, refused[0], param=refused[1])
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        reply = self.policy.reply(body["messages"], tools)
        comp = Completion(self.renderer, reply, int(max_tokens), offset=len(prompt_ids))
        # an engine that cannot return ids (older vLLM, other servers) ignores the fields, as vLLM ignores unknowns
        want_lp = bool(body.get("logprobs")) and self.capture_level != "text"
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        want_ids = bool(body.get("return_token_ids")) and self.capture_level == "tokens"
        base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": self.served_model}
        fingerprint = {"system_fingerprint": f"swe-gym-env-builtin:{self.policy.name}"}
        usage = {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + len(comp.token_ids),
            "completion_tokens": len(comp.token_ids),
        }
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = self._stream(
                base,
                fingerprint,
                comp,
                prompt_ids if want_ids else None,
                want_lp,
                as_ids,
                top,
                want_ids,
                usage if include_usage else None,
            )
            return StreamingResponse(chunks, media_type="text/event-stream")
        return JSONResponse(self._whole(base, fingerprint, comp, prompt_ids, want_lp, as_ids, top, want_ids, usage))

    def _whole(
        self, base, fingerprint, comp: Completion, prompt_ids, want_lp, as_ids, top, want_ids, usage
    ) -> dict[str, Any]:
        """vLLM's non-streamed chat completion, its capture fields where asked for."""
        choice: dict[str, Any] = {
            "index": 0,
            "message": comp.message(),
            "logprobs": {"content": self.logprob_entries(comp.token_ids, comp.logprobs, as_ids, top)}
            if want_lp
            else None,
            "finish_reason": comp.finish_reason,
            "stop_reason": None,
        }
        if want_ids:
            choice["token_ids"] = comp.token_ids
        choice["routed_experts"] = None
        out = {
            **base,
            "object": "chat.completion",
            "choices": [choice],
            "service_tier": None,
            **fingerprint,
            "usage": {**usage, "prompt_tokens_details": None, "completion_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
        if want_ids:
            out["prompt_token_ids"] = prompt_ids
        return out

    def _stream(
        self, base, fingerprint, comp: Completion, prompt_ids, want_lp, as_ids, top, want_ids, usage
    ) -> Iterator[str]:
        """vLLM's chunk shapes (tests/fixtures/vllm): ids only on token chunks, `stop_reason` on the finish chunk,
        the fingerprint only on the usage chunk."""

        def chunk(delta: dict, ids: list[int], lps: list[float], finish: str | None = None, **extra) -> str:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": self.logprob_entries(ids, lps, as_ids, top)} if want_lp and ids else None,
                "finish_reason": finish,
            }
            if finish is not None:
                choice["stop_reason"] = None
            if want_ids and ids:
                choice["token_ids"] = ids
            return (
                "data: "
                + json.dumps({**base, "object": "chat.completion.chunk", "choices": [choice], **extra})
                + "\n\n"
            )

        first_extra = {"prompt_token_ids": prompt_ids, "prompt_text": None} if prompt_ids is not None else {}
        yield chunk({"role": "assistant", "content": ""}, [], [], **first_extra)
        pos = 0
        lps = comp.logprobs
        for t in comp.content_ids:
            yield chunk({"content": self.renderer.token_text(t)}, [t], lps[pos : pos + 1])
            pos += 1
        for i, (call, ids) in enumerate(zip(comp.tool_calls, comp.call_ids, strict=True)):
            delta = {
                "content": None,
                "tool_calls": [
                    {
                        "index": i,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                    }
                ],
            }
            yield chunk(delta, ids, lps[pos : pos + len(ids)])
            pos += len(ids)
        rest = comp.token_ids[pos:]
        yield chunk({}, rest, lps[pos:], finish=comp.finish_reason)
        if usage is not None:
            yield (
                "data: "
                + json.dumps({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage, **fingerprint})
                + "\n\n"
            )
        yield "data: [DONE]\n\n"

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        if "messages" in body:
            text = self.renderer.render(body["messages"], body.get("tools"), body.get("add_generation_prompt", True))
        else:
            text = str(body.get("prompt", ""))
        ids = self.renderer.encode(text)
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": self.renderer.decode([int(t) for t in body.get("tokens", [])])})

    async def models(self, request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.served_model,
                        "object": "model",
                        "owned_by": f"swe-gym-env builtin ({self.policy.name})",
                        "max_model_len": self.max_model_len,
                    }
                ],
            }
        )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)


def create_engine_app(engine: Engine) -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/chat/completions", engine.chat, methods=["POST"]),
            Route("/tokenize", engine.tokenize, methods=["POST"]),
            Route("/detokenize", engine.detokenize, methods=["POST"]),
            Route("/v1/models", engine.models, methods=["GET"]),
            Route("/health", engine.health, methods=["GET"]),
        ]
    )
