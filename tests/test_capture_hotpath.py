"""The capture hot path's fast paths: the first chunk's prompt ids cut out unparsed and read only once the agent has
the chunk, bytes passed through where nothing is stripped, chunks batched per read; the ids recorded stay exact and
anything malformed still fails loudly."""

import asyncio
import json
from array import array
from contextlib import asynccontextmanager

import pytest

from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.capture.dialect import CapturedCall, DialectError
from swe_gym_env.server.capture.dialects.openai_chat import ChatDialect, ChatStream, StreamAccumulator
from swe_gym_env.server.capture.ids import cut_prompt_ids, parse_id_list
from swe_gym_env.server.capture.streaming import stream_through

from helpers import full_turns

pytestmark = pytest.mark.anyio

PROMPT = [*range(7, 7 + 3000), 2**31 - 1, 0]
BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "served"}


def vllm_chunks(prompt_raw: bytes | None = None, spaced: bool = False) -> list[bytes]:
    """vLLM's stream (compact JSON, prompt ids last in the first chunk); ``spaced``: json.dumps' default spacing."""
    dump = (lambda o: json.dumps(o).encode()) if spaced else (lambda o: json.dumps(o, separators=(",", ":")).encode())
    first = {**BASE, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    head = dump({**first, "prompt_token_ids": PROMPT})
    if prompt_raw is not None:
        head = head[: head.index(b'"prompt_token_ids"')] + b'"prompt_token_ids":' + prompt_raw + b"}"
    out = [head]
    for t in (11, 12):
        lp = {"content": [{"token": f"token_id:{t}", "logprob": -0.25}]}
        out.append(
            dump({**BASE, "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [t], "logprobs": lp}]})
        )
    lp = {"content": [{"token": "token_id:13", "logprob": -1.5}]}
    choice = {"index": 0, "delta": {}, "token_ids": [13], "logprobs": lp, "finish_reason": "stop"}
    out.append(dump({**BASE, "choices": [choice]}))
    out.append(dump({**BASE, "choices": [], "usage": {"prompt_tokens": len(PROMPT), "completion_tokens": 3}}))
    return [b"data: " + c + b"\n\n" for c in out] + [b"data: [DONE]\n\n"]


@pytest.mark.parametrize("spaced", [False, True])
def test_prompt_ids_are_cut_from_the_first_chunk_exactly(spaced):
    data = vllm_chunks(spaced=spaced)[0][6:-2]
    rest, ids = cut_prompt_ids(data)
    assert json.loads(ids) == PROMPT
    whole = json.loads(data)
    del whole["prompt_token_ids"]
    assert json.loads(rest) == whole
    assert parse_id_list(ids).tolist() == PROMPT
    # first key, only key
    rest, ids = cut_prompt_ids(b'{"prompt_token_ids": [1, 2], "a": 1}')
    assert (json.loads(rest), ids) == ({"a": 1}, b"[1, 2]")
    assert cut_prompt_ids(b'{"prompt_token_ids":[1]}') == (b"{}", b"[1]")


@pytest.mark.parametrize(
    "data",
    [
        b'{"choices":[{"prompt_token_ids":[1,2]}],"a":1}',  # not at the top level
        b'{"a":"{","prompt_token_ids":null}',  # null: parsed whole, and check_first says so
        b'{"a":1,"prompt_token_ids":"[1,2]"}',
        b'{"a":1}',
    ],
)
def test_shapes_the_cut_does_not_know_are_left_to_the_full_parse(data):
    assert cut_prompt_ids(data) is None


@pytest.mark.parametrize("raw", [b"[1,2.5,3]", b"[1,2,]", b"[1,,2]", b'[1,"2"]', b"[]", b"[1e3]", b"[ ]"])
def test_id_lists_that_are_not_plainly_ints_are_not_read_fast(raw):
    assert parse_id_list(raw) is None


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"[1,2.5,3]", "no prompt_token_ids"),
        (b"[1,-2,3]", "no prompt_token_ids"),
        (b"[1,2,4294967296]", "no prompt_token_ids"),
        (b'[1,"2"]', "no prompt_token_ids"),
        (b"[1,2 3]", "not JSON"),
    ],
)
def test_malformed_prompt_ids_cut_from_a_chunk_still_fail_the_call(raw, needle):
    stream = ChatStream("agent-model", True)
    chunks = [stream.read(c[6:-2]) for c in vllm_chunks(prompt_raw=raw)[:-1]]
    stream.check_first(chunks[0])
    for c in chunks:
        stream.add(c)
    with pytest.raises(DialectError, match=needle):
        stream.call()


def test_ids_parsed_after_the_first_chunk_are_recorded_exactly():
    stream = ChatStream("agent-model", True)
    first = stream.read(vllm_chunks()[0][6:-2])
    assert "prompt_token_ids" not in first and stream.acc.prompt_token_ids is None  # not parsed yet
    stream.check_first(first)
    stream.add(first)
    sent = stream.agent_chunk(first)
    assert b"prompt_token_ids" not in sent and json.loads(sent[6:])["model"] == "agent-model"
    stream.forwarded()
    assert isinstance(stream.acc.prompt_token_ids, array)  # parsed once the agent has the chunk
    for c in vllm_chunks()[1:-1]:
        stream.add(stream.read(c[6:-2]))
    call = stream.call()
    assert call.prompt_token_ids.tolist() == PROMPT
    assert call.completion_token_ids.tolist() == [11, 12, 13]
    assert call.logprobs.tolist() == [-0.25, -0.25, -1.5]
    assert (call.prompt_token_ids.typecode, call.logprobs.typecode) == ("q", "d")


def test_a_chunk_with_nothing_to_strip_is_forwarded_byte_for_byte():
    stream = ChatStream("served", True)  # the agent asked for the served model's own name
    data = b'{"id": "c", "model": "served", "choices": [{"index": 0, "delta": {"content": "hi"}}], "x": 1.50}'
    chunk = stream.read(data)
    assert stream.agent_chunk(chunk) == b"data: " + data + b"\n\n"
    with_ids = b'{"id":"c","model":"served","choices":[{"index":0,"delta":{},"token_ids":[5]}]}'
    assert b"token_ids" not in stream.agent_chunk(stream.read(with_ids))
    other = ChatStream("agent-model", True)  # another name: rewritten, so re-serialised
    assert json.loads(other.agent_chunk(other.read(data))[6:])["model"] == "agent-model"


def test_a_malformed_chunk_fails_loudly():
    stream = ChatStream("m", True)
    for data, needle in [(b"{nope", "not JSON"), (b"[1]", "not an object"), (b'{"error":{"m":1}}', "error mid")]:
        with pytest.raises(DialectError, match=needle):
            stream.read(data)


def test_the_accumulator_still_takes_whole_chunks():
    acc = StreamAccumulator()
    acc.add(
        {
            "prompt_token_ids": [1, 2],
            "choices": [
                {
                    "index": 0,
                    "token_ids": [3],
                    "logprobs": {"content": [{"token": "token_id:3", "logprob": -0.5}]},
                    "delta": {},
                }
            ],
        }
    )
    assert acc.call().prompt_token_ids.tolist() == [1, 2]


class FakeReply:
    status = 200
    content_type = "text/event-stream"

    def __init__(self, pieces: list[bytes], gate: asyncio.Event) -> None:
        self.pieces, self.gate = pieces, gate

    async def body(self) -> bytes:
        return b""

    async def chunks(self):
        yield self.pieces[0]
        await self.gate.wait()  # the engine is still generating
        for p in self.pieces[1:]:
            yield p


class FakeUpstream:
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces, self.gate = pieces, asyncio.Event()

    @asynccontextmanager
    async def stream(self, url, body, headers, timeout):
        yield FakeReply(self.pieces, self.gate)

    async def aclose(self) -> None:
        return None


class Watching(ChatDialect):
    def open_stream(self, request):
        self.last = super().open_stream(request)
        return self.last


async def test_first_token_reaches_the_agent_before_its_prompt_ids_are_parsed():
    chunks = vllm_chunks()
    # the first chunk split across two reads, the rest arriving together
    pieces = [chunks[0][:100], chunks[0][100:] + b"".join(chunks[1:3]), b"".join(chunks[3:])]
    up = FakeUpstream([pieces[0] + pieces[1], pieces[2]])
    proxy = CaptureProxy()
    session, _ = proxy.open_session(EngineTarget("http://engine/v1", "served"), max_calls=5, max_tokens=64)
    dialect = Watching()
    req = dialect.parse_request({"model": "agent-model", "messages": [], "stream": True})
    recorded: list[CapturedCall] = []
    reply = await stream_through(up, session, dialect, req, {"messages": []}, recorded.append)
    body = reply.body_iterator
    first = await body.__anext__()
    assert first.startswith(b"data: ") and first.count(b"data: ") == 3  # one write for what arrived together
    assert b"prompt_token_ids" not in first and b"token_ids" not in first
    assert dialect.last.acc.prompt_token_ids is None  # the ids wait until the agent has its first chunk
    up.gate.set()
    rest = [part async for part in body]
    assert rest[-1].endswith(b"data: [DONE]\n\n") and not recorded[1:]
    assert recorded[0].prompt_token_ids.tolist() == PROMPT
    assert recorded[0].completion_token_ids.tolist() == [11, 12, 13]


async def test_a_40k_token_first_chunk_over_real_http_is_captured_exactly():
    """~250 KiB in one SSE line, arriving over several reads of the real aiohttp upstream."""
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from swe_gym_env.server.capture.upstream import AiohttpUpstream

    from helpers import Served

    prompt = list(range(100_000, 140_000))
    chunks = vllm_chunks()
    first = json.loads(chunks[0][6:-2])
    first["prompt_token_ids"] = prompt
    chunks[0] = b"data: " + json.dumps(first, separators=(",", ":")).encode() + b"\n\n"

    async def engine(request):
        async def body():
            for c in chunks:
                yield c

        return StreamingResponse(body(), media_type="text/event-stream")

    with Served(Starlette(routes=[Route("/v1/chat/completions", engine, methods=["POST"])])) as url:
        proxy = CaptureProxy(upstream=AiohttpUpstream())
        session, key = proxy.open_session(EngineTarget(f"{url}/v1", "served"), max_calls=5, max_tokens=64)
        transport = httpx.ASGITransport(app=proxy.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://capture") as agent:
            body = {"model": "served", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            r = await agent.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
        await proxy.aclose()
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and "error" not in r.text
    assert b"prompt_token_ids" not in r.content and b"token_ids" not in r.content
    assert full_turns(session)[0].prompt_token_ids == prompt
    assert session.turns[0].completion_token_ids == [11, 12, 13]
    assert session.turns[0].logprobs == [-0.25, -0.25, -1.5]


def test_the_bench_pairs_each_proxied_call_with_the_direct_call_at_its_position():
    from swe_gym_env.benchmarks.capture import _Acc

    acc = _Acc()
    direct = [[(0.010, 0.002, None), (0.020, None, None)], [(0.030, None, None), (0.040, None, "HTTP 500: x")]]
    through = [[(0.011, 0.0025, None), (0.023, None, None)], [(0.030, None, "HTTP 502: y"), (0.045, None, None)]]
    acc.add(direct, 1.0, through, 2.0)
    doc = acc.doc()
    assert sorted(round(a, 6) for a in acc.added) == [0.001, 0.003]  # the errored pairs are not differences
    assert [round(a, 6) for a in acc.added_ttft] == [0.0005]
    assert (doc["errors"], doc["direct_errors"], doc["first_errors"]) == (1, 1, ["HTTP 502: y"])
    assert (doc["calls_per_s"], doc["direct_calls_per_s"], doc["kept"]) == (2.0, 4.0, 0.5)


async def test_a_kept_alive_connection_the_engine_closed_is_retried_not_a_502():
    """The engine answers one request per connection and closes the next one unanswered (a keep-alive connection it
    dropped while it sat in our pool): the call goes out again on a fresh connection instead of failing."""
    from swe_gym_env.server.capture.upstream import AiohttpUpstream

    seen = {"connections": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        for n in range(2):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):  # the client closed it
                return
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            seen["requests"] += 1
            if n == 1:  # the second request on a connection: dropped, as a closed keep-alive connection would be
                writer.close()
                return
            body = b'data: {"a":1}\n\ndata: [DONE]\n\n'
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: keep-alive\r\n"
            writer.write(head + b"content-length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    up = AiohttpUpstream()
    try:
        for _ in range(3):
            status, data = await up.post(url, {"x": 1}, {"content-type": "application/json"}, 10)
            assert (status, data) == (200, b'data: {"a":1}\n\ndata: [DONE]\n\n')
        async with up.stream(url, {"x": 1}, {}, 10) as reply:
            assert reply.status == 200 and b"".join([c async for c in reply.chunks()]).endswith(b"[DONE]\n\n")
    finally:
        await up.aclose()
        server.close()
    assert seen["connections"] == 4 and seen["requests"] == 7  # each call after the first: a dropped try, a retry
