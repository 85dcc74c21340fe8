"""A fast stub engine in vLLM's reply shape, for benchmarks: the cost measured is the proxy's, not a model's.

Every reply carries `prompt_token_ids` of the requested prompt length (the agent's request says how many through
its `metadata.prompt_tokens`), COMPLETION completion ids with `token_id:N` logprobs; streamed like vLLM (role chunk
with the prompt ids, one chunk per token, finish chunk, usage chunk, [DONE]).

Run: python -m swe_gym_env.benchmarks.stub_engine PORT
"""

from __future__ import annotations

import json
import sys

COMPLETION = 16


def _usage(prompt_len: int) -> dict:
    return {"prompt_tokens": prompt_len, "completion_tokens": COMPLETION, "total_tokens": prompt_len + COMPLETION}


def _reply(prompt_len: int) -> dict:
    ids = [1000 + i for i in range(COMPLETION)]
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": "stub",
        "prompt_token_ids": list(range(7, 7 + prompt_len)),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * COMPLETION, "tool_calls": []},
                "finish_reason": "stop",
                "token_ids": ids,
                "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in ids]},
            }
        ],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": COMPLETION,
            "total_tokens": prompt_len + COMPLETION,
        },
    }


def _stream(prompt_len: int) -> list[bytes]:
    base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 0, "model": "stub"}
    out = [
        {
            **base,
            "prompt_token_ids": list(range(7, 7 + prompt_len)),
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
        }
    ]
    for i in range(COMPLETION - 1):
        t = 1000 + i
        lp = {"content": [{"token": f"token_id:{t}", "logprob": -0.5}]}
        out.append({**base, "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [t], "logprobs": lp}]})
    t = 1000 + COMPLETION - 1
    lp = {"content": [{"token": f"token_id:{t}", "logprob": -0.5}]}
    out.append(
        {
            **base,
            "choices": [{"index": 0, "delta": {}, "token_ids": [t], "logprobs": lp, "finish_reason": "stop"}],
        }
    )
    out.append({**base, "choices": [], "usage": _usage(prompt_len)})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]


def make_app():
    from aiohttp import web

    replies: dict[int, bytes] = {}
    streams: dict[int, list[bytes]] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int((body.get("metadata") or {}).get("prompt_tokens", 1000))
        stream = bool(body.get("stream"))
        if not stream:
            if n not in replies:
                replies[n] = json.dumps(_reply(n)).encode()
            return web.Response(body=replies[n], content_type="application/json")
        if n not in streams:
            streams[n] = _stream(n)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in streams[n]:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


if __name__ == "__main__":
    from aiohttp import web

    # aiohttp's default listen backlog (128) drops connects when 256 sessions open at once (uvicorn, so vLLM: 2048)
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None, backlog=2048)
