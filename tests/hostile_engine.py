"""A fault-injecting engine for tests: the built-in engine on the normal path, misbehaving on the agent's calls.

Certification probes (the fixed "capital of France" question, never streamed) always get the built-in engine's
honest answer, so a server certifies this engine at `tokens` level; every other chat call is an *agent call* and
gets the current fault once `after` agent calls have been answered normally. The fault is switched at run time
(``POST /fault {"mode": ..., "after": N}``; ``GET /fault`` says what happened), so one engine process serves a
whole test module.

Modes: ``ok`` (oracle policy), ``http500``, ``hang_before`` (never answers), ``hang_midstream`` (role chunk and
the first token, then silence), ``invalid_json`` (a stream whose chunk is not JSON; non-streamed: a truncated JSON
body), ``html`` (HTTP 200 with an HTML page), ``no_token_ids`` (honest answer with every id field removed),
``loop`` (a bash tool call every time, never done), ``crash_agent`` (a bash tool call that SIGKILLs the agent's own
process), ``slow`` (honest answers, each after ``delay_s``), ``cheat`` (a policy attacking the grader: one bash tool
call running ``command`` — see tests/cheats.py — then "done").

Run: ``python tests/hostile_engine.py --port P [--mode M] [--after N]``, or ``hostile_app()`` in helpers.Served.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from swe_gym_env.core.assets import tokenizer_file
from swe_gym_env.server.engine.app import Engine
from swe_gym_env.server.engine.certify import PROBE
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import DONE, OraclePolicy, Policy, Reply

MODEL = "smollm2-135m-instruct"
MODES = (
    "ok",
    "http500",
    "hang_before",
    "hang_midstream",
    "invalid_json",
    "html",
    "no_token_ids",
    "loop",
    "crash_agent",
    "slow",
    "cheat",
)
ID_FIELDS = ("prompt_token_ids", "token_ids", "prompt_text")


def _assistant_steps(messages: list[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


class LoopPolicy(Policy):
    """Endless tool calls: the agent never gets a final answer (only a call budget stops it)."""

    name = "loop"

    def reply(self, messages, tools):
        return Reply(tool_calls=[("bash", {"command": f"echo loop step {_assistant_steps(messages)}"})])


class CrashAgentPolicy(Policy):
    """One bash call that kills the process running the tool (the agent itself), then "done"."""

    name = "crash_agent"

    def reply(self, messages, tools):
        if _assistant_steps(messages) == 0:
            return Reply(tool_calls=[("bash", {"command": "kill -9 $PPID; sleep 5"})])
        return Reply(content=DONE)


class CheatPolicy(Policy):
    """One bash call running the current cheat's command at the repository root, then "done"."""

    name = "cheat"

    def __init__(self, faults: Faults) -> None:
        self.faults = faults

    def reply(self, messages, tools):
        if _assistant_steps(messages) == 0:
            return Reply(tool_calls=[("bash", {"command": self.faults.command})])
        return Reply(content=DONE)


class Faults:
    def __init__(self, mode: str = "ok", after: int = 0, delay_s: float = 0.0, hang_s: float = 900.0) -> None:
        self.set(mode, after, delay_s)
        self.hang_s = hang_s  # a hang ends by itself after this long (so a forgotten engine does not pile up)

    def set(self, mode: str, after: int = 0, delay_s: float = 0.0, command: str = "") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown fault mode {mode!r}; known: {MODES}")
        if mode == "cheat" and not command:
            raise ValueError("mode 'cheat' needs a command")
        self.mode, self.after, self.delay_s, self.command = mode, after, delay_s, command
        self.agent_calls = 0  # agent calls seen since the mode was set
        self.faulted = 0  # of which got the fault
        self.probes = 0
        self.hanging = 0  # requests held open right now

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("mode", "after", "agent_calls", "faulted", "probes", "hanging")}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "InternalServerError", "code": status}}, status)


def hostile_app(mode: str = "ok", after: int = 0, delay_s: float = 0.0) -> Starlette:
    renderer = ChatRenderer(tokenizer_file())
    engines = {
        name: Engine(renderer, policy, MODEL)
        for name, policy in (("ok", OraclePolicy()), ("loop", LoopPolicy()), ("crash_agent", CrashAgentPolicy()))
    }
    honest = engines["ok"]
    faults = Faults(mode, after, delay_s)
    engines["cheat"] = Engine(renderer, CheatPolicy(faults), MODEL)

    async def hang(request: Request) -> None:
        faults.hanging += 1
        try:
            for _ in range(int(faults.hang_s / 0.2)):
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.2)
        finally:
            faults.hanging -= 1

    async def chat(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return await honest.chat(request)
        if isinstance(body, dict) and body.get("messages") == PROBE and not body.get("stream"):
            faults.probes += 1
            return await honest.chat(request)
        faults.agent_calls += 1
        mode = faults.mode if faults.agent_calls > faults.after else "ok"
        if mode in ("loop", "crash_agent", "cheat"):
            faults.faulted += 1
            return await engines[mode].chat(request)
        if mode == "slow":
            await asyncio.sleep(faults.delay_s)
            return await honest.chat(request)
        if mode == "ok":
            return await honest.chat(request)
        faults.faulted += 1
        stream = bool(body.get("stream")) if isinstance(body, dict) else False
        if mode == "http500":
            return _error(500, "injected fault: internal server error")
        if mode == "hang_before":
            await hang(request)
            return _error(503, "injected fault: hung, then gave up")
        if mode == "html":
            return Response("<html><body><h1>502 Bad Gateway</h1></body></html>", 200, media_type="text/html")
        if mode == "invalid_json":
            if stream:
                return StreamingResponse(
                    iter(['data: {"id": "chatcmpl-x", "choices": [{"delta": {"content": "hi"}\n\n']),
                    media_type="text/event-stream",
                )
            return Response('{"id": "chatcmpl-x", "choices": [', 200, media_type="application/json")
        reply = await honest.chat(request)
        if mode == "no_token_ids":
            return _strip_ids(reply)
        if mode == "hang_midstream":
            if not isinstance(reply, StreamingResponse):
                await hang(request)
                return _error(503, "injected fault: hung, then gave up")
            return StreamingResponse(_cut(reply.body_iterator, request), media_type="text/event-stream")
        raise AssertionError(mode)

    async def _cut(chunks, request: Request):
        sent = 0
        async for chunk in chunks:
            yield chunk
            sent += 1
            if sent == 2:  # the role chunk (with prompt ids) and the first token: then silence
                await hang(request)
                return

    def _strip_ids(reply: Response) -> Response:
        if isinstance(reply, StreamingResponse):

            async def stripped():
                async for chunk in reply.body_iterator:
                    text = chunk if isinstance(chunk, str) else chunk.decode()
                    out = []
                    for line in text.split("\n"):
                        if line.startswith("data: {"):
                            event = json.loads(line[6:])
                            for k in ID_FIELDS:
                                event.pop(k, None)
                            for c in event.get("choices") or []:
                                for k in ID_FIELDS:
                                    c.pop(k, None)
                            line = "data: " + json.dumps(event)
                        out.append(line)
                    yield "\n".join(out)

            return StreamingResponse(stripped(), media_type="text/event-stream")
        data = json.loads(reply.body)
        for k in ID_FIELDS:
            data.pop(k, None)
        for c in data.get("choices") or []:
            c.pop("token_ids", None)
        return JSONResponse(data, reply.status_code)

    async def get_fault(request: Request) -> Response:
        return JSONResponse(faults.state())

    async def set_fault(request: Request) -> Response:
        body = await request.json()
        try:
            faults.set(
                body.get("mode", "ok"),
                int(body.get("after", 0)),
                float(body.get("delay_s", 0.0)),
                str(body.get("command", "")),
            )
        except ValueError as e:
            return JSONResponse({"error": str(e)}, 400)
        return JSONResponse(faults.state())

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", honest.models, methods=["GET"]),
            Route("/tokenize", honest.tokenize, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/fault", get_fault, methods=["GET"]),
            Route("/fault", set_fault, methods=["POST"]),
        ]
    )


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="ok", choices=MODES)
    p.add_argument("--after", type=int, default=0)
    p.add_argument("--delay-s", type=float, default=0.0)
    args = p.parse_args()
    uvicorn.run(hostile_app(args.mode, args.after, args.delay_s), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
