"""Who may start work and who may administer, and the limits that keep a public Space from being abused.

Everything comes from the environment (on a Space: Space variables and secrets), read through the settings model
(`core.settings.setting`, each value checked alone; ``SPACE_ID`` is Hugging Face's, not a setting). Tokens are
compared in constant time and are never logged, returned or put in a tool schema. When no access token is configured
(a local, loopback-only server) starting work is open.

A server reachable from outside (bound to anything but loopback: ``serve``'s ``--host``, which it hands to
`listening_on` before the server starts, else ``SWE_GYM_BIND_HOST``; or running on a Space, ``SPACE_ID``) with
neither secret configured is *locked*: starting work and the admin routes are refused, naming the secret to set,
unless ``SWE_GYM_OPEN_ACCESS=1`` asks for an open server on purpose (``push --open`` writes it as a Space variable).
A Space duplicated in the browser never runs as an open relay.

- ``SWE_GYM_ACCESS_TOKEN``: needed to start work (run_rollout over MCP and /ws, cancel, UI runs).
- ``SWE_GYM_ADMIN_KEY``: needed for admin routes (capture sessions); it also grants access. With an access token
  but no admin key, admin routes are closed.
- ``SWE_GYM_OPEN_ACCESS=1``: an exposed server with neither secret is open (anyone may start work and administer).
- ``SWE_GYM_BIND_HOST``: the address the server listens on where no ``serve --host`` says it (a server started by
  other means, e.g. ``uvicorn swe_gym_env.asgi:app``); unset means loopback.
- ``SWE_GYM_PUBLIC_READS=1``: rollouts (listings, results, the UI's rollout, history and live views) readable by
  anyone. Without it, reading a rollout needs what starting one needs (``read_refusal``): the access token where one
  is configured, nothing on an open server, and nobody on a locked one. Results hold a model's captured outputs and
  logprobs: training data, and distillation material for anyone else.
- ``SWE_GYM_ENGINE_URL_ALLOWLIST``: comma-separated URL prefixes a caller may name as ``engine_url`` (scheme, host
  and port must match exactly, the path on a segment boundary); ``*`` allows any. ``SWE_GYM_ALLOW_ENGINE_URLS=1``
  is the older spelling of ``*``. Empty: only the server's named engines.
- ``SWE_GYM_RATE_LIMIT_PER_MIN``: work-starting calls per minute per presented key (a token bucket, bursts of the
  same size). Default 60 when an access token is configured, else off; ``0`` turns it off.
- ``SWE_GYM_MAX_REQUEST_BYTES``: largest HTTP request body the server reads (default 16 MiB): see BodySizeLimit,
  which also cuts a body silent for ``SWE_GYM_BODY_TIMEOUT_S`` (408).
- OpenEnv sessions (``session_refusal``): creating one needs what reading rollouts needs; a token holder's sessions
  are counted apart from strangers' (``holds_token``), so strangers holding sessions never lock a token holder out.
- Bodies: every surface parses JSON with ``parse_json`` (too deep, invalid, not UTF-8: ``BodyError``, a one-line
  reason the surface answers with a 4xx), never sending an exception's text.
- A refused request logs one line (``log_refusal``), never a traceback and never a token.

One guard decides whether a caller may start work, on every path that can: ``start_refusal`` (a browser request
from another site is refused, then the access token, then the rate limit per key). The MCP tools apply it (real MCP
over HTTP, and OpenEnv's /ws, WS /mcp and bare JSON-RPC on /mcp, which call the same tools), and so does the UI.

The caller reaches a tool in one of two ways: real MCP over HTTP carries its ``Authorization: Bearer`` header (and
the browser's Origin / Sec-Fetch-Site, if any) in the request fastmcp exposes; OpenEnv's paths call tools in
process, so they record the request's headers with ``set_caller`` first.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import accumulate
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from swe_gym_env.core.settings import setting

ACCESS_ENV = "SWE_GYM_ACCESS_TOKEN"
ADMIN_ENV = "SWE_GYM_ADMIN_KEY"
ALLOWLIST_ENV = "SWE_GYM_ENGINE_URL_ALLOWLIST"
LEGACY_ALLOW_ENV = "SWE_GYM_ALLOW_ENGINE_URLS"
RATE_ENV = "SWE_GYM_RATE_LIMIT_PER_MIN"
MAX_BODY_ENV = "SWE_GYM_MAX_REQUEST_BYTES"
OPEN_ENV = "SWE_GYM_OPEN_ACCESS"
BIND_ENV = "SWE_GYM_BIND_HOST"
SPACE_ENV = "SPACE_ID"  # set by Hugging Face on every Space
PUBLIC_READS_ENV = "SWE_GYM_PUBLIC_READS"
DEFAULT_RATE_WITH_TOKEN = 60
DEFAULT_MAX_BODY = 16 * 1024 * 1024
ACCESS_REFUSED = "access token required: send `Authorization: Bearer <token>` (the Space secret SWE_GYM_ACCESS_TOKEN)"
SESSION_REFUSED = (
    "access token required to open an OpenEnv session: send `Authorization: Bearer <token>` (the Space secret "
    "SWE_GYM_ACCESS_TOKEN)"
)
READ_REFUSED = (
    "access token required to read rollouts: send `Authorization: Bearer <token>` (the Space secret "
    "SWE_GYM_ACCESS_TOKEN); SWE_GYM_PUBLIC_READS=1 makes rollouts readable by anyone"
)


def _configured(name: str) -> str | None:
    """A secret's value (``ACCESS_ENV`` or ``ADMIN_ENV``), or None when unset or empty."""
    value = setting({ACCESS_ENV: "access_token", ADMIN_ENV: "admin_key"}[name])
    return value.get_secret_value() or None if value is not None else None


def _loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    if host in ("", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.endswith(".localhost")


_listening_on: str | None = None  # set once by `serve`, from its --host, before the server starts


def listening_on(host: str) -> None:
    """Say the address this process's server binds (``serve`` does, once): what `exposure` judges."""
    global _listening_on
    _listening_on = host


def exposure() -> str | None:
    """Why this server is reachable from outside (a Space, or bound to a non-loopback address), or None."""
    if os.environ.get(SPACE_ENV):
        return f"running on a Space ({SPACE_ENV} is set)"
    host = _listening_on if _listening_on is not None else setting("bind_host") or ""
    if not _loopback(host):
        return f"listening on {host}, not on loopback only"
    return None


def open_on_purpose() -> bool:
    return bool(setting("open_access"))


def lock_reason() -> str | None:
    """Why starting work and the admin routes are refused to everyone (an exposed server with no secret and no
    explicit openness), naming the secret to set; None when the server is not locked."""
    if _configured(ACCESS_ENV) or _configured(ADMIN_ENV) or open_on_purpose():
        return None
    why = exposure()
    if why is None:
        return None
    return (
        f"this server is locked: it is {why} and has no secret configured. Set the secret {ACCESS_ENV} (who may "
        f"start rollouts) and {ADMIN_ENV} (capture-session admin routes), or {OPEN_ENV}=1 to run it open to anyone "
        "on purpose"
    )


def access_mode() -> str:
    """How this server guards starting work, for /health and the startup log: ``token`` | ``open`` | ``locked``."""
    if _configured(ACCESS_ENV):
        return "token"
    return "locked" if lock_reason() else "open"


def public_reads() -> bool:
    """Whether rollouts are readable by anyone (``SWE_GYM_PUBLIC_READS=1``): the one place that reads it."""
    return bool(setting("public_reads"))


def read_mode() -> str:
    """Who may list and read rollouts, for /health: ``public`` (opted in), ``token``, ``open`` or ``locked``."""
    return "public" if public_reads() else access_mode()


def read_refusal(presented: str | None) -> str | None:
    """Why a caller presenting ``presented`` may not list or read rollouts, or None if it may: anyone with the opt-in;
    else whoever may start work (the access token or admin key where a token is configured; anyone on an open
    server; no one on a locked one). Reads are not rate-limited."""
    if public_reads():
        return None
    if (locked := lock_reason()) is not None:
        return locked
    return None if access_ok(presented) else READ_REFUSED


def session_refusal(presented: str | None) -> str | None:
    """Why a caller presenting ``presented`` may not open an OpenEnv session (HTTP ``openenv/session/create``,
    ``/ws``, WS ``/mcp``), or None if it may: a session is for reading and starting, so it needs what reading
    rollouts needs (``read_refusal``): the token, unless the server is open or reads are public."""
    why = read_refusal(presented)
    return SESSION_REFUSED if why == READ_REFUSED else why


def holds_token(presented: str | None) -> bool:
    """Whether ``presented`` is this server's access token or admin key (False when none is configured): such a
    caller's OpenEnv sessions are counted apart from strangers'."""
    token, admin = _configured(ACCESS_ENV), _configured(ADMIN_ENV)
    return (token is not None and _same(presented, token)) or (admin is not None and _same(presented, admin))


_log = logging.getLogger("swe_gym_env.access")


def log_refusal(surface: str, why: str, client: Any = None) -> None:
    """One log line for a refused request: the surface, the client's address and the reason's first clause (never
    the token, never a traceback)."""
    host = client[0] if isinstance(client, list | tuple) and client else client
    reason = why.split(":", 1)[0].strip()[:120]
    _log.warning("refused %s%s: %s", surface, f" from {host}" if host else "", reason)


def _same(presented: str | None, expected: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def admin_ok(presented: str | None) -> bool:
    """True when ``presented`` is the admin key; with no admin key configured, only on an open server (no access
    token either): a deployment that guards work but forgot the admin key keeps its admin routes closed."""
    expected = _configured(ADMIN_ENV)
    if expected is None:
        return not access_required() and lock_reason() is None
    return _same(presented, expected)


def access_ok(presented: str | None) -> bool:
    """True when no access token is configured (and the server is not locked: ``lock_reason``), or ``presented`` is
    the access token or the admin key."""
    token, admin = _configured(ACCESS_ENV), _configured(ADMIN_ENV)
    if token is None:
        return lock_reason() is None
    return _same(presented, token) or (admin is not None and _same(presented, admin))


def access_required() -> bool:
    return _configured(ACCESS_ENV) is not None


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header value."""
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None


# -- who is calling --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Caller:
    """A caller as the guard sees it: its bearer token, and the request's headers (lower-case names) when there was
    a request, for the cross-site check."""

    token: str | None = None
    headers: Mapping[str, str] | None = None
    scheme: str = "http"


_caller: ContextVar[Caller | None] = ContextVar("swe_gym_caller", default=None)


def set_caller(headers: Mapping[str, str], scheme: str = "http") -> None:
    """For transports that call tools in process (/ws, WS /mcp, bare JSON-RPC on /mcp): record the request's caller
    (its headers, bearer token among them) for the tools called in this context."""
    lowered = {k.lower(): v for k, v in headers.items()}
    _caller.set(Caller(bearer(lowered.get("authorization")), lowered, scheme))


def presented_caller() -> Caller:
    """The caller: the live MCP HTTP request's, else what an in-process transport recorded (else anonymous)."""
    from fastmcp.server.dependencies import get_http_headers

    live = get_http_headers(include_all=True)
    recorded = _caller.get() or Caller()
    token = bearer(live.get("authorization"))
    if token is None:
        token = recorded.token
    if live:
        return Caller(token, live)
    return Caller(token, recorded.headers, recorded.scheme)


def presented_token() -> str | None:
    """The caller's bearer token: from the live MCP HTTP request, else what an in-process transport recorded."""
    return presented_caller().token


# -- starting work: same site, access, rate ----------------------------------------------------------------------
class RateLimiter:
    """A token bucket per key: ``per_minute`` calls a minute, bursts up to ``per_minute``. Keys are hashed, and at
    most ``max_keys`` buckets are kept (full ones are dropped first). Thread-safe and loop-agnostic."""

    def __init__(self, per_minute: int, max_keys: int = 10_000, clock=time.monotonic) -> None:
        self.per_minute = per_minute
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key hash -> (tokens, updated_at)
        self._lock = threading.Lock()

    def check(self, key: str) -> float | None:
        """Take one call for ``key``: None if allowed, else the seconds until the next call would be."""
        rate = self.per_minute / 60.0
        h = hashlib.sha256(key.encode()).hexdigest()
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(h, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - at) * rate)
            if tokens < 1.0:
                self._buckets[h] = (tokens, now)
                return (1.0 - tokens) / rate
            self._buckets[h] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_keys:
                self._evict(now, rate)
            return None

    def _evict(self, now: float, rate: float) -> None:
        full = [k for k, (t, at) in self._buckets.items() if t + (now - at) * rate >= self.per_minute]
        for k in full or sorted(self._buckets, key=lambda k: self._buckets[k][1])[: len(self._buckets) // 10 + 1]:
            del self._buckets[k]


_limiter: RateLimiter | None = None
_limiter_lock = threading.Lock()


def rate_per_minute() -> int:
    configured = setting("rate_limit_per_min")
    if configured is not None:
        return configured
    return DEFAULT_RATE_WITH_TOKEN if access_required() else 0


def limiter() -> RateLimiter | None:
    """The process's limiter for the configured rate (None when off); rebuilt if the setting changes."""
    global _limiter
    per_minute = rate_per_minute()
    if per_minute <= 0:
        return None
    with _limiter_lock:
        if _limiter is None or _limiter.per_minute != per_minute:
            _limiter = RateLimiter(per_minute)
        return _limiter


def _host_of(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname.lower(), port


def _request_host(headers: Mapping[str, str], scheme: str) -> tuple[str, int] | None:
    host = (headers.get("x-forwarded-host") or headers.get("host") or "").split(",")[0].strip()
    if not host:
        return None
    return _host_of(f"{(headers.get('x-forwarded-proto') or scheme).split(',')[0].strip()}://{host}")


def cross_site_reason(headers: Mapping[str, str], scheme: str = "http") -> str | None:
    """Why this request is not from this server's own page, or None when it is (or is not from a browser).

    A browser always sends `Origin` (and modern ones `Sec-Fetch-Site`) on a POST or a websocket handshake, so a page
    on another site (or a sibling Space on the same parent domain) cannot start work with a visitor's browser.
    Clients without those headers are not browsers acting for someone else: they still need the token."""
    site = (headers.get("sec-fetch-site") or "").lower()
    if site and site not in ("same-origin", "none"):
        return f"cross-site request refused (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is None:
        return None
    own, theirs = _request_host(headers, scheme), _host_of(origin)
    # A TLS-terminating proxy may leave the inner scheme http: the same host on the two default ports is the same.
    if own and theirs and own[0] == theirs[0] and (own[1] == theirs[1] or {own[1], theirs[1]} <= {80, 443}):
        return None
    return "cross-origin request refused (Origin does not match this server)"


def start_refusal(
    presented: str | None, *, headers: Mapping[str, str] | None = None, scheme: str = "http"
) -> str | None:
    """Why a caller presenting ``presented`` may not start work now, or None if it may: the one guard of every path
    that starts work. ``headers`` (names lower-case), when the call came with a request: a browser's request from
    another site is refused first; then the access token; then the rate limit per key (strangers get no bucket)."""
    if headers is not None and (why := cross_site_reason(headers, scheme)) is not None:
        return why
    if (locked := lock_reason()) is not None:
        return locked
    if not access_ok(presented):
        return ACCESS_REFUSED
    lim = limiter()
    if lim is not None:
        wait = lim.check("key:" + presented if presented else "anonymous")
        if wait is not None:
            return f"rate limit: at most {lim.per_minute} calls a minute per key; retry in {math.ceil(wait)} s"
    return None


# -- engine URLs ----------------------------------------------------------------------------------------------
def engine_allowlist() -> tuple[str, ...]:
    raw = setting("engine_url_allowlist")
    prefixes = tuple(p.strip() for p in raw.split(",") if p.strip())
    if setting("allow_engine_urls"):
        prefixes = (*prefixes, "*")
    return prefixes


def _parts(url: str) -> tuple[str, str, int, list[str]] | None:
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password or u.query or u.fragment:
        return None
    port = port or (443 if u.scheme == "https" else 80)
    return u.scheme, u.hostname.lower(), port, [s for s in u.path.split("/") if s]


def engine_url_allowed(url: str, allowlist: tuple[str, ...] | list[str]) -> bool:
    """Whether ``url`` falls under one of the prefixes: same scheme, host and port; path prefix by segments."""
    if "*" in allowlist:
        return _parts(url) is not None
    got = _parts(url)
    if got is None:
        return False
    for prefix in allowlist:
        want = _parts(prefix)
        if want is not None and got[:3] == want[:3] and got[3][: len(want[3])] == want[3]:
            return True
    return False


# -- request bodies ---------------------------------------------------------------------------------------------
MAX_JSON_DEPTH = 128  # arrays and objects nested deeper than this are refused (no wire shape here comes close)


class BodyError(ValueError):
    """A body no surface can take: the message is one line, safe to send back."""


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_STRING_B = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NESTING = [{ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}.get(b, 0) for b in range(256)]


def _deeper_than(data: str | bytes, limit: int) -> bool:
    """Whether well-formed JSON text nests arrays and objects deeper than ``limit``: its strings taken out, only its
    brackets kept, then the running depth's maximum (at C speed: a tenth of what parsing the same text costs)."""
    bare = _JSON_STRING.sub("", data).encode() if isinstance(data, str) else _JSON_STRING_B.sub(b"", data)
    brackets = bare.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_NESTING.__getitem__, brackets)), default=0) > limit


def parse_json(data: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for bodies from strangers: too deep (over ``max_depth`` levels), invalid JSON or not UTF-8 is a
    ``BodyError`` with a one-line reason. Never a RecursionError, never an exception's text."""
    too_deep = f"JSON nested deeper than {max_depth} levels"
    try:
        obj = json.loads(data)
    except RecursionError:
        raise BodyError(too_deep) from None
    except UnicodeDecodeError:
        raise BodyError("body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BodyError(f"invalid JSON at line {e.lineno} column {e.colno}") from None
    except ValueError:
        raise BodyError("invalid JSON") from None
    opened = data.count("[") + data.count("{") if isinstance(data, str) else data.count(b"[") + data.count(b"{")
    if opened > max_depth and _deeper_than(data, max_depth):  # well-formed, so every string is closed: linear
        raise BodyError(too_deep)
    return obj


def max_request_bytes() -> int:
    return setting("max_request_bytes")


class BodySizeLimit:
    """ASGI middleware: an HTTP request whose body is over ``max_bytes`` gets 413 (by Content-Length before the
    app runs, or as soon as the streamed body passes the limit); one whose body goes silent for ``timeout_s``
    between chunks (``SWE_GYM_BODY_TIMEOUT_S``) gets 408 and its connection closed. Websockets and lifespan pass
    through."""

    def __init__(self, app: ASGIApp, max_bytes: int | None = None, timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_request_bytes() if max_bytes is None else max_bytes
        self.timeout_s = setting("body_timeout_s") if timeout_s is None else timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers") or []:
            if k == b"content-length" and (not v.isdigit() or int(v) > self.max_bytes):
                log_refusal(f"{scope.get('method')} {scope.get('path')}", "body too large", scope.get("client"))
                await _refuse(send, 413, f"request body over {self.max_bytes} bytes")
                return
        seen = 0
        started = False
        more = True

        async def counted() -> Message:
            nonlocal seen, more
            if not more:  # the body is all in: what is left is the disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise _TooSlow from None
            if message["type"] == "http.request":
                more = bool(message.get("more_body", False))
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except _TooLarge:
            log_refusal(f"{scope.get('method')} {scope.get('path')}", "body too large", scope.get("client"))
            if not started:
                await _refuse(send, 413, f"request body over {self.max_bytes} bytes")
        except _TooSlow:
            log_refusal(f"{scope.get('method')} {scope.get('path')}", "body too slow", scope.get("client"))
            if not started:
                await _refuse(send, 408, f"request body silent for {self.timeout_s:g} s", close=True)


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


async def _refuse(send: Send, status: int, detail: str, close: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# -- admin routes -----------------------------------------------------------------------------------------------
def require_admin(authorization: str | None) -> None:
    """For admin routes (FastAPI: call it with the request's Authorization header): 401 unless the admin key."""
    from fastapi import HTTPException

    if not admin_ok(bearer(authorization)):
        detail = lock_reason() or "admin key required"
        raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})
