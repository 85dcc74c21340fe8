"""The capture proxy, mounted at /capture. It knows nothing of sandboxes, agents or tasks, nor of API dialects.

Each rollout gets a session: a public id (URLs, UI, results) and a separate secret key the agent uses as its API key
(``Authorization: Bearer`` or ``x-api-key``). Every call is forwarded to the session's engine with token capture
forced on, validated (ids and logprobs aligned; anything off is an error to the agent, never a silent success),
linked into the rollout graph, written to the durable store, and only then answered. When the agent streams, the
engine's stream is forwarded chunk by chunk as it arrives (time to first token is the engine's) and the end of the
reply is held until the call is stored. When the agent wants a whole reply, the engine is still asked for a stream,
read to its end and answered whole (`streaming.collect`): its stall clock runs, so a hung engine fails the call at
the stall timeout whether the agent streams or not, and the call is captured as a streamed one is.

Agent-facing: one route per route of each registered dialect (`registry.DIALECTS`: OpenAI chat completions and
Responses, Anthropic Messages, Gemini), the only routes a sandbox can reach. Auxiliary routes (token counting, model
lists) are answered by their dialect and recorded as session events and an ``aux_call`` finding, never as turns.
Each turn records the dialect the agent spoke (`Turn.dialect`) and the engine request it was translated into, in the
compact form (`wire.Turn`): its new prompt ids and new messages only, never a whole prompt or request per call.
Admin: see `admin`.
"""

from __future__ import annotations

import hashlib
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from swe_gym_env.server.capture import export as exporting
from swe_gym_env.server.capture.admin import AdminApi
from swe_gym_env.server.capture.compact import RequestDigests
from swe_gym_env.server.capture.dialect import (
    AgentRequest,
    AuxCall,
    CapturedCall,
    Dialect,
    DialectError,
    DialectRoute,
    EngineTerms,
)
from swe_gym_env.server.capture.graph import Node
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.capture.session import CaptureSession, EngineTarget
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.capture.streaming import (
    agent_error,
    check_reply,
    collect,
    engine_headers,
    fail,
    passthrough,
    post,
    stream_through,
)
from swe_gym_env.server.capture.upstream import Upstream, UpstreamError, make_upstream
from swe_gym_env.server.security import bearer
from swe_gym_env.wire import Finding, Turn

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_FAILURE_FINDINGS = 20  # per session; the rest are counted in one finding
KEEP_CLOSED_STORED = 0  # closed sessions kept in memory when the store has them (they read back from it)
SESSION_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
BUDGET_MESSAGE = {"role": "assistant", "content": "Model-call budget exhausted; stopping.", "tool_calls": []}


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status, media_type="application/json")


def _check_call(session: CaptureSession, call: CapturedCall) -> None:
    """A call fit to record: the engine's completion token count matches its ids, and the session is still open."""
    usage = call.usage or {}
    reported = usage.get("completion_tokens")
    if isinstance(reported, int) and reported != len(call.completion_token_ids):
        raise DialectError(
            502,
            f"engine reports {reported} completion tokens but returned {len(call.completion_token_ids)} ids",
        )
    if session.closed:
        raise DialectError(409, "the capture session closed during this call")


def _turn_event(session: CaptureSession, dialect: Dialect, call: CapturedCall, node: Node, index: int) -> dict:
    """The live event of one recorded turn (`CaptureSession.publish`)."""
    return {
        "type": "turn",
        "session": session.id,
        "index": index,
        "dialect": dialect.name,
        "parent": node.parent,
        "relation": node.relation,
        "retry_of": node.retry_of,
        "prompt_tokens": len(call.prompt_token_ids),
        "completion_tokens": len(call.completion_token_ids),
        "finish_reason": call.finish_reason,
        "tool_calls": [c["name"] for c in dialect.tool_calls(call.message)],
        "at": session.last_call_at,
    }


class CaptureProxy:
    apply_graph = staticmethod(exporting.apply_graph)

    def __init__(
        self,
        store: CaptureStore | None = None,
        upstream: Upstream | None = None,
        dialects: Mapping[str, Dialect] | None = None,
    ) -> None:
        self._by_key: dict[str, CaptureSession] = {}
        self.sessions: dict[str, CaptureSession] = {}  # open and recently closed, by public id
        self.store = store
        self._upstream = upstream
        self.dialects = dict(DIALECTS if dialects is None else dialects)
        self._aux: dict[str, Counter] = {}  # per open session: (route, how it was answered) -> auxiliary calls
        claimed: dict[tuple[str, str], str] = {}
        for name, dialect in self.dialects.items():
            for route in dialect.routes:
                for method in route.methods:
                    if (other := claimed.setdefault((route.path, method), name)) != name:
                        raise ValueError(f"dialects {other!r} and {name!r} both serve {method} {route.path}")

    # -- sessions ---------------------------------------------------------------------------------------------
    def open_session(
        self,
        engine: EngineTarget,
        *,
        max_calls: int,
        max_tokens: int,
        call_timeout_s: float = 300.0,
        sampling: dict[str, float | int] | None = None,
        passthrough: bool = False,
        session_id: str | None = None,
        labels: dict[str, str] | None = None,
        stall_timeout_s: float = 60.0,
        max_consecutive_failures: int = 5,
    ) -> tuple[CaptureSession, str]:
        """A new session and its secret key (returned once; only its hash is kept)."""
        sid = session_id or uuid.uuid4().hex[:16]
        if not (1 <= len(sid) <= 64 and set(sid) <= SESSION_ID_CHARS):
            raise ValueError(f"invalid session id {sid!r}")
        if sid in self.sessions and not self.sessions[sid].closed:
            raise ValueError(f"session {sid!r} is already open")
        key = "sgk-" + secrets.token_urlsafe(32)
        session = CaptureSession(
            id=sid,
            engine=engine,
            max_calls=max_calls,
            max_tokens=max_tokens,
            call_timeout_s=call_timeout_s,
            sampling=dict(sampling or {}),
            passthrough=passthrough,
            labels=dict(labels or {}),
            stall_timeout_s=stall_timeout_s,
            max_consecutive_failures=max_consecutive_failures,
        )
        self._by_key[_hash(key)] = session
        self.sessions[sid] = session
        self._trim()
        if self.store is not None:
            self.store.open_session(sid, session.meta())
        return session, key

    def close_session(self, session: CaptureSession) -> None:
        """Idempotent. Marks discarded branches and roles, adds the closing findings, persists the state."""
        if session.closed:
            return
        session.closed = True
        for pump in list(session.pumps):  # a hung engine call must not outlive its session (nor hold a socket)
            pump.cancel()
        for h, s in list(self._by_key.items()):
            if s is session:
                del self._by_key[h]
        self._finalize(session, self._aux.pop(session.id, Counter()))
        session.graph.seal()  # no more calls: its prefix index and growth room go
        session.requests = RequestDigests()
        if self.store is not None:
            self.store.close_session(
                session.id,
                stop_reason=session.stop_reason,
                findings=[f.model_dump() for f in session.findings],
                errors=session.errors,
                budget_replies=session.budget_replies,
                demoted=sorted(session.demoted),
            )
            self._trim()  # stored: it need not stay in memory (whoever runs it holds it until its result is built)
        session.publish({"type": "closed", "session": session.id, "turns": len(session.turns)})

    @staticmethod
    def _finalize(session: CaptureSession, aux_calls: Counter | None = None) -> None:
        for what, n in session.rewrites.items():
            session.findings.append(Finding(severity="info", code="rewrite", message=f"{what} ({n} calls)"))
        for (route, how), n in (aux_calls or Counter()).items():
            session.findings.append(
                Finding(severity="info", code="aux_call", message=f"{route}: {how}; not a turn ({n} calls)")
            )
        for call, message in session.failures[:MAX_FAILURE_FINDINGS]:
            session.findings.append(
                Finding(severity="warning", code="engine_failure", message=f"model call {call} failed: {message}")
            )
        if len(session.failures) > MAX_FAILURE_FINDINGS:
            more = len(session.failures) - MAX_FAILURE_FINDINGS
            session.findings.append(
                Finding(severity="warning", code="engine_failure", message=f"{more} more failed model calls")
            )
        if session.passthrough:
            return
        if not session.turns:
            session.findings.append(
                Finding(severity="fatal", code="no_model_calls", message="no model call was captured")
            )
            return
        session.sequences = exporting.apply_graph(session.graph, session.turns, session.demoted)
        roots = session.graph.roots()
        if len(roots) > 1:
            aux = sum(1 for r in roots if session.graph.nodes[r].role == "aux")
            session.findings.append(
                Finding(
                    severity="info",
                    code="roots",
                    message=f"{len(roots)} conversations (roots); {aux} outside the agent's own",
                )
            )

    def open_sessions(self) -> int:
        return len(self._by_key)

    def _trim(self, keep_closed: int | None = None) -> None:
        """Forget the oldest closed sessions: with a store they read back from it (the same document), so only a few
        stay in memory; without one, up to 512."""
        if keep_closed is None:
            keep_closed = KEEP_CLOSED_STORED if self.store is not None else 512
        closed = [sid for sid, s in self.sessions.items() if s.closed]
        for sid in closed[: max(0, len(closed) - keep_closed)]:
            del self.sessions[sid]

    async def aclose(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()
            self._upstream = None

    @property
    def upstream(self) -> Upstream:
        if self._upstream is None:
            self._upstream = make_upstream()
        return self._upstream

    def _session_for(self, request: Request, dialect: Dialect | None = None) -> CaptureSession | None:
        key = bearer(request.headers.get("authorization")) or request.headers.get("x-api-key", "")
        for header in dialect.key_headers if dialect is not None else ():
            key = key or request.headers.get(header, "")
        if not key:
            return None
        s = self._by_key.get(_hash(key))
        return None if s is None or s.closed else s

    # -- the agent-facing routes ------------------------------------------------------------------------------
    @staticmethod
    async def _body(dialect: Dialect, request: Request) -> Any:
        """The request's decoded JSON body, or the error `Response` to answer instead."""
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            return agent_error(dialect, 413, f"request body over {MAX_BODY_BYTES} bytes")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            return agent_error(dialect, 413, f"request body over {MAX_BODY_BYTES} bytes")
        try:
            return orjson.loads(raw)
        except ValueError:
            return agent_error(dialect, 400, "request body is not valid JSON")

    async def handle(self, dialect: Dialect, request: Request, route: DialectRoute | None = None) -> Response:
        """One model call, in ``dialect``: authenticate, read, budget, forward with capture, record, answer."""
        session = self._session_for(request, dialect)
        if session is None:
            return agent_error(dialect, 401, "unknown or closed capture key")
        body = await self._body(dialect, request)
        if isinstance(body, Response):
            return body
        try:
            params = {**request.query_params, **request.path_params}
            req = dialect.read_request(body, route or dialect.routes[0], params)
        except DialectError as e:
            return agent_error(dialect, e.status, e.message)
        req.rewrites = session.rewrites  # losses found while answering are the session's findings
        if session.stop_reason == "engine_failures":  # the session gave up on its engine: fail at once
            return agent_error(
                dialect, 503, f"capture session stopped after {session.consecutive_failures} failed calls in a row"
            )
        if session.calls - session.failed >= session.max_calls:  # failed calls never use up the budget
            session.stop_reason = "budget_exhausted"
            session.budget_replies += 1
            return self._answer(dialect, req, dict(BUDGET_MESSAGE, tool_calls=[]), "stop", None)
        session.calls += 1
        session.last_call_at = time.time()
        if session.passthrough:
            if dialect.relays_engine:
                return await passthrough(self.upstream, session, dialect, req)
            return await self._black_box(session, dialect, req)
        # the engine streams whatever the agent asked (its stall clock runs); without stream_through, never
        streams = session.stream_through
        through = req.stream and streams
        terms = EngineTerms(session.engine.served_model, session.max_tokens, session.sampling, streams)
        up, rewrites = dialect.upstream_body(req, terms)
        session.rewrites.update(rewrites)
        t0 = time.monotonic()
        if through:

            def record(call: CapturedCall) -> None:
                self._record(session, dialect, up, call, streamed=True, wall=time.monotonic() - t0)

            return await stream_through(self.upstream, session, dialect, req, up, record)
        try:
            if streams:  # the agent wants it whole: collected from the engine's stream
                call = await collect(self.upstream, session, dialect, req, up)
            else:
                status, data = await post(self.upstream, session, dialect.upstream_path, up)
                call = dialect.read_reply(req, check_reply(status, data))
            self._record(session, dialect, up, call, streamed=req.stream, wall=time.monotonic() - t0)
        except UpstreamError as e:
            return fail(session, dialect, 504 if e.timeout else 502, str(e))
        except DialectError as e:
            return fail(session, dialect, e.status, e.message, e.code)
        return self._answer(dialect, req, call.message, call.finish_reason, call.usage)

    async def _black_box(self, session: CaptureSession, dialect: Dialect, req: AgentRequest) -> Response:
        """A black-box call in a dialect that does not relay the engine's bytes: the translated request without
        capture fields, the engine's whole reply translated back. Nothing is captured."""
        terms = EngineTerms(session.engine.served_model, session.max_tokens, {}, False, capture=False)
        up, rewrites = dialect.upstream_body(req, terms)
        session.rewrites.update(rewrites)
        try:
            status, data = await post(self.upstream, session, dialect.upstream_path, up)
            call = dialect.read_reply(req, check_reply(status, data), capture=False)
        except UpstreamError as e:
            return fail(session, dialect, 504 if e.timeout else 502, str(e))
        except DialectError as e:
            return fail(session, dialect, e.status, e.message, e.code)
        session.consecutive_failures = 0
        session.publish({"type": "call", "session": session.id, "call": session.calls, "status": 200})
        return self._answer(dialect, req, call.message, call.finish_reason, call.usage)

    async def handle_aux(self, dialect: Dialect, route: DialectRoute, request: Request) -> Response:
        """An auxiliary call (token counting, a model list): answered by its dialect, recorded as a session event and
        counted in the session's ``aux_call`` finding; never a turn, never against the budget."""
        session = self._session_for(request, dialect)
        if session is None:
            return agent_error(dialect, 401, "unknown or closed capture key")
        body = None
        if request.method not in ("GET", "HEAD"):
            body = await self._body(dialect, request)
            if isinstance(body, Response):
                return body
        what = f"{request.method} {route.path}"
        counts = self._aux.setdefault(session.id, Counter())
        call = AuxCall(
            route,
            body,
            dict(request.path_params),
            session.engine.served_model,
            lambda chat: self._tokenize(session, chat),
        )
        try:
            answer = await dialect.answer_aux(call)
        except DialectError as e:
            counts[(what, f"answered with an error ({e.status})")] += 1
            session.publish({"type": "aux", "session": session.id, "route": what, "status": e.status})
            return agent_error(dialect, e.status, e.message)
        counts[(what, answer.how)] += 1
        session.publish({"type": "aux", "session": session.id, "route": what, "status": answer.status})
        return _json(answer.body, answer.status)

    async def _tokenize(self, session: CaptureSession, chat: dict) -> list[int] | None:
        """The engine's own prompt ids for a chat body (vLLM's ``/tokenize``, beside ``/v1``); None when it has
        none."""
        root = session.engine.base_url.removesuffix("/").removesuffix("/v1")
        body = {"model": session.engine.served_model, **chat}
        try:
            status, data = await self.upstream.post(
                f"{root}/tokenize", body, engine_headers(session.engine), min(session.call_timeout_s, 60.0)
            )
            tokens = orjson.loads(data).get("tokens") if status == 200 else None
        except (UpstreamError, ValueError, AttributeError):
            return None
        return tokens if isinstance(tokens, list) else None

    @staticmethod
    def _answer(dialect: Dialect, req: AgentRequest, message: dict, finish: str | None, usage: dict | None) -> Response:
        """A complete reply: replayed as a stream when the agent streams, else one JSON body."""
        if req.stream:
            replay = dialect.replay(req, message, finish, usage if req.include_usage else None)
            return StreamingResponse(replay, media_type="text/event-stream")
        return _json(dialect.reply(req, message, finish, usage))

    def _record(
        self, session: CaptureSession, dialect: Dialect, up: dict, call: CapturedCall, streamed: bool, wall: float
    ) -> None:
        """Validate, link, persist, publish — before the agent sees the end of the reply."""
        _check_call(session, call)
        g = session.graph
        node, keys, findings = g.link(call.prompt_token_ids, call.completion_token_ids, call.logprobs)
        index = len(session.turns)
        self._persist(session, dialect, up, call, node, streamed, wall)
        g.commit(node, keys)
        messages = up.get("messages") or []
        request = session.requests.add(node.base, messages, {k: v for k, v in up.items() if k != "messages"})
        turn = Turn.model_construct(  # every field is checked already (ids and logprobs by the dialect)
            index=index,
            prompt_len=node.prompt_len,
            prompt_base=node.base,
            prompt_shared=node.shared,
            prompt_new_ids=node.prompt[node.shared :].tolist(),  # what no earlier call had: the rest is the graph's
            completion_token_ids=call.completion_token_ids.tolist(),
            logprobs=call.logprobs.tolist(),
            finish_reason=call.finish_reason,
            streamed=streamed,
            wall_s=round(wall, 4),
            **request,
            response_message=call.message,
            dialect=dialect.name,
            parent=node.parent,
            relation=node.relation,
            retry_of=node.retry_of,
        )
        session.turns.append(turn)
        session.consecutive_failures = 0
        session.findings.extend(findings)
        session.last_call_at = time.time()
        session.publish(_turn_event(session, dialect, call, node, index))
        if session.on_turn is not None:
            session.on_turn(turn)

    def _persist(
        self,
        session: CaptureSession,
        dialect: Dialect,
        up: dict,
        call: CapturedCall,
        node: Node,
        streamed: bool,
        wall: float,
    ) -> None:
        """The call into the store, where there is one (a call that cannot be kept is never answered)."""
        if self.store is None:
            return
        try:
            self.store.add_call(
                session.id,
                node,
                finish_reason=call.finish_reason,
                streamed=streamed,
                wall_s=round(wall, 4),
                request=up,
                response=call.message,
                dialect=dialect.name,
            )
        except Exception as e:  # never answer a call we could not keep
            raise DialectError(500, f"could not persist the call: {type(e).__name__}: {e}") from e

    # -- reading sessions -------------------------------------------------------------------------------------
    def get_session(self, session_id: str) -> CaptureSession | None:
        return self.sessions.get(session_id)

    def session_detail(self, session_id: str) -> dict | None:
        s = self.sessions.get(session_id)
        if s is not None:
            return exporting.live_detail(s)
        doc = self.export(session_id)
        return None if doc is None else exporting.stored_detail(doc)

    def export(self, session_id: str) -> dict | None:
        """The session as a document: every turn with its own ids and logprobs, provenance, sequences + masks.
        A closed session's document is the same before and after a server restart."""
        s = self.sessions.get(session_id)
        return exporting.export_stored(self.store, session_id) if s is None else exporting.export_live(s)

    # -- the app ----------------------------------------------------------------------------------------------
    def _endpoint(self, dialect: Dialect, route: DialectRoute) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if route.aux is not None:
                return await self.handle_aux(dialect, route, request)
            return await self.handle(dialect, request, route)

        return endpoint

    def app(self, admin: bool = False) -> Starlette:
        """The agent-facing routes, one per dialect route; with ``admin`` also the session API (never served to
        sandboxes)."""
        routes = [
            Route(r.path, self._endpoint(d, r), methods=list(r.methods))
            for d in self.dialects.values()
            for r in d.routes
        ]
        if admin:
            routes += AdminApi(self).routes()
        return Starlette(routes=routes)
