"""Several servers behind one client: which server gets the next rollout, and which one holds a rollout's result.

- **Capacity** comes from each server's `GET /health`: `capacity: {max_rollouts, in_flight, free}`. A server
  without it (an older server: only `rollouts_in_flight`) has unknown capacity: it is used by load, and only when
  no server that states its capacity has room. Health is read at most every `health_ttl_s` (one request per
  server, shared by every caller waiting on it); between reads the client counts its own rollouts started and
  finished there, so a burst of rollouts is spread before the next read. A rollout goes to the server with the
  largest share of free slots (free / max_rollouts; on a tie, the one listed first); when no server has a free
  slot, it waits in the client until one has (a server's own queue would hold it on that server even if another
  frees first).
- **Down servers**: a server whose health read fails (refused, timed out, not 200, `status` not healthy, or
  `max_rollouts` 0: no usable sandbox backend there) or whose connection dropped is skipped, with the reason logged
  once, until a later read says it is healthy again. With every server down, `acquire` raises `NoServerAvailable`
  naming each one's reason.
- **Rollout ids name their server**: `<tag>-<32 hex>`, the tag being the first 8 hex digits of the SHA-256 of the
  server's normalised base URL (`server_tag`). The client also records where each rollout ran; a new client
  process given the same URLs (in any order) finds a rollout's server from its id alone. An id without a known tag
  (a caller's own id, another URL for the same server) is looked for on every server in turn.

With one URL nothing of this runs: no health reads, the one server gets everything (the one-URL client as before).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger("swe_gym_env.client")
TAG_LEN = 8
MAX_RECORDED = 100_000  # rollout id -> server records kept (oldest dropped first)


class NoServerAvailable(ConnectionError):
    """Every server of the client failed its health check (or lost its connection); the message names why."""


def normalize_url(url: str) -> str:
    """`http(s)://host[:port][/path]` with scheme and host lower-cased and no trailing slash."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) server URL: {url[:200]!r}")
    return urlunsplit((parts.scheme, parts.netloc.lower(), parts.path.rstrip("/"), "", ""))


def server_tag(url: str) -> str:
    """The tag that rollout ids started through this server URL begin with (see the module doc)."""
    return hashlib.sha256(normalize_url(url).encode()).hexdigest()[:TAG_LEN]


def id_tag(rollout_id: str) -> str | None:
    """The server tag of a rollout id made by `ServerSet.new_rollout_id`, else None."""
    tag, sep, _ = rollout_id.partition("-")
    return tag if sep and len(tag) == TAG_LEN and all(c in "0123456789abcdef" for c in tag) else None


@dataclass
class Capacity:
    max_rollouts: int
    in_flight: int
    free: int


@dataclass
class Server:
    """One server as this client sees it."""

    url: str  # normalised base URL (`http://host:port`)
    tag: str
    own: int = 0  # this client's rollouts in flight there now
    capacity: Capacity | None = None  # from the last health read; None: unknown
    load: int = 0  # the server's rollouts_in_flight at the last health read
    own_at_read: int = 0  # `own` when the health was read
    down: str | None = None  # why it is skipped; None while it is healthy
    read_at: float = -1e9  # monotonic time of the last health read (or of marking it down)
    started: int = 0  # rollouts this client sent there (for reports and tests)

    def free(self) -> int | None:
        """Free slots now: the last read's, less this client's rollouts started there since (plus those finished)."""
        if self.capacity is None:
            return None
        return self.capacity.free - (self.own - self.own_at_read)

    def rank(self) -> tuple[int, float] | None:
        """Sort key (higher is better) among servers that can take a rollout now; None when it cannot."""
        if self.down is not None:
            return None
        free = self.free()
        if free is None:  # unknown capacity: after every server with a stated free slot, least loaded first
            return (0, -float(self.load + self.own - self.own_at_read))
        if free < 1:
            return None
        return (1, free / max(1, self.capacity.max_rollouts if self.capacity else 1))


def parse_health(body: Any) -> tuple[Capacity | None, int, str | None]:
    """(capacity or None when not stated, rollouts in flight, why the server is not healthy or None)."""
    if not isinstance(body, dict):
        return None, 0, "health is not a JSON object"
    if body.get("status") != "healthy":
        return None, 0, f"health status {str(body.get('status'))[:100]!r}"
    cap, capacity = body.get("capacity"), None
    if isinstance(cap, dict):
        values = [cap.get(k) for k in ("max_rollouts", "in_flight", "free")]
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            capacity = Capacity(*values)  # type: ignore[arg-type]
            if capacity.max_rollouts == 0:
                return None, 0, "no usable sandbox backend (capacity max_rollouts 0)"
    in_flight = body.get("rollouts_in_flight")
    load = capacity.in_flight if capacity else in_flight if isinstance(in_flight, int) else 0
    return capacity, load, None


@dataclass
class ServerSet:
    """The servers of one client: health, choice by free capacity, and where each rollout ran."""

    urls: Sequence[str]
    health_ttl_s: float = 2.0
    timeout_s: float = 10.0
    transport: httpx.AsyncBaseTransport | None = None  # tests swap it; default: the network
    servers: list[Server] = field(init=False)
    ran_on: dict[str, Server] = field(init=False, default_factory=dict)  # rollout id -> server that ran it

    def __post_init__(self) -> None:
        if isinstance(self.urls, str):
            self.urls = [self.urls]
        if not self.urls:
            raise ValueError("no server URL given")
        self.servers = []
        for url in self.urls:
            server = Server(normalize_url(url), server_tag(url))
            if any(s.tag == server.tag for s in self.servers):
                raise ValueError(f"server URL listed twice: {url[:200]!r}")
            self.servers.append(server)
        self._changed = asyncio.Event()
        self._reading: asyncio.Task | None = None
        self._http: httpx.AsyncClient | None = None

    @property
    def single(self) -> bool:
        return len(self.servers) == 1

    async def aclose(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading
            self._reading = None
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    # -- ids and where rollouts ran -----------------------------------------------------------------------------
    def new_rollout_id(self, server: Server) -> str:
        return f"{server.tag}-{uuid.uuid4().hex}"

    def record(self, rollout_id: str, server: Server) -> None:
        self.ran_on[rollout_id] = server
        while len(self.ran_on) > MAX_RECORDED:  # ids name their server anyway: the record only helps foreign ids
            del self.ran_on[next(iter(self.ran_on))]

    def home(self, rollout_id: str | None) -> Server | None:
        """The server a rollout ran on (or will run on): recorded by this client, else named by its id."""
        if not rollout_id:
            return None
        return self.ran_on.get(rollout_id) or self.by_tag(rollout_id)

    def by_tag(self, rollout_id: str) -> Server | None:
        tag = id_tag(rollout_id)
        return next((s for s in self.servers if s.tag == tag), None) if tag else None

    def candidates(self, rollout_id: str) -> list[Server]:
        """Where to look for a rollout: where this client ran it, else the server its id names, else everywhere."""
        known = self.home(rollout_id)
        return [known] if known is not None else list(self.servers)

    # -- health ---------------------------------------------------------------------------------------------------
    async def _read_one(self, server: Server) -> None:
        if self._http is None:
            kwargs: dict[str, Any] = {"transport": self.transport} if self.transport is not None else {}
            self._http = httpx.AsyncClient(timeout=self.timeout_s, **kwargs)
        own = server.own
        try:
            r = await self._http.get(f"{server.url}/health")
            capacity, load, why = (
                parse_health(r.json()) if r.status_code == 200 else (None, 0, f"health answered HTTP {r.status_code}")
            )
        except (httpx.HTTPError, OSError, ValueError) as e:
            capacity, load, why = None, 0, f"health check failed: {type(e).__name__}: {e}"
        server.read_at = time.monotonic()
        if why is not None:
            self.mark_down(server, why)
            return
        server.capacity, server.load, server.own_at_read = capacity, load, own
        if server.down is not None:
            log.info("server %s is healthy again", server.url)
            server.down = None
        self._changed.set()

    async def _read_all(self) -> None:
        await asyncio.gather(*(self._read_one(s) for s in self.servers))

    async def refresh(self, force: bool = False) -> None:
        """Read the health of every server if the last read is older than `health_ttl_s` (or `force`); callers
        that arrive while a read is under way wait for that one."""
        stale = force or any(time.monotonic() - s.read_at >= self.health_ttl_s for s in self.servers)
        if self._reading is None or self._reading.done():
            if not stale:
                return
            self._reading = asyncio.create_task(self._read_all())
        await asyncio.shield(self._reading)

    def mark_down(self, server: Server, reason: str) -> None:
        if server.down is None:
            log.warning("server %s skipped: %s", server.url, reason)
        server.down = reason[:500]
        server.read_at = time.monotonic()
        self._changed.set()

    # -- choosing -------------------------------------------------------------------------------------------------
    def pick(self) -> Server | None:
        """The server for the next rollout now, or None when none has room (`NoServerAvailable`: all down)."""
        ranked = [(rank, -i, s) for i, s in enumerate(self.servers) if (rank := s.rank()) is not None]
        if ranked:
            return max(ranked, key=lambda t: (t[0], t[1]))[2]
        if all(s.down is not None for s in self.servers):
            raise NoServerAvailable("no server available: " + "; ".join(f"{s.url}: {s.down}" for s in self.servers))
        return None

    async def acquire(self, wait_s: float, home: Server | None = None) -> Server:
        """A server for one rollout (its `own` count taken): ``home`` when given (a rollout id that names its
        server goes back there), else the one with most room; waits up to `wait_s` for a free slot."""
        if home is not None or self.single:
            server = home or self.servers[0]
        else:
            deadline = time.monotonic() + wait_s
            while True:
                await self.refresh()
                server = self.pick()
                if server is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no server had a free rollout slot within {wait_s:.0f}s")
                self._changed.clear()  # woken by a rollout of ours finishing, or at the next health read
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), min(left, self.health_ttl_s))
        server.own += 1
        server.started += 1
        return server

    def release(self, server: Server) -> None:
        server.own -= 1
        self._changed.set()

    @contextlib.asynccontextmanager
    async def slot(self, wait_s: float, home: Server | None = None) -> AsyncIterator[Server]:
        server = await self.acquire(wait_s, home)
        try:
            yield server
        finally:
            self.release(server)

    async def any_server(self) -> Server:
        """A healthy server for a call that any of them can answer (task lists, tool lists): the first one up."""
        if self.single:
            return self.servers[0]
        await self.refresh()
        up = [s for s in self.servers if s.down is None]
        if not up:
            self.pick()  # raises NoServerAvailable with every reason
        return up[0]
