"""The HTTP front door of `serve` (and a Space): uvicorn with the connection limits a public server needs.

- ``SWE_GYM_MAX_CONNECTIONS`` (512): open connections at most, websockets included; one over it is answered 503 and
  closed at once.
- ``SWE_GYM_HEADER_TIMEOUT_S`` (10): a request's headers (the first request's, and each later one's on a kept-alive
  connection) must be complete within this long, else the connection is cut: trickled headers cannot hold
  connections open. uvicorn has no such timeout of its own.
- ``SWE_GYM_BODY_TIMEOUT_S`` (30): a request body silent this long between chunks gets 408 and its connection
  closed (``server.security.BodySizeLimit``, in the app, so any ASGI server has it).

Each cut connection logs one line (``server.security.log_refusal``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from swe_gym_env.core.settings import setting
from swe_gym_env.server.security import log_refusal

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 26\r\nconnection: close\r\n\r\n"
    b"too many open connections\n"
)


def guarded_protocol(base: Any, header_timeout_s: float, max_connections: int) -> type[asyncio.Protocol]:
    """``base`` (uvicorn's HTTP protocol: httptools or h11) with a header timeout and a connection cap."""

    class Guarded(base):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log_refusal("connection", "too many open connections", self.client)
                transport.write(_BUSY)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.get_protocol() is not self or not self._awaiting_headers():
                self._disarm()  # a request's headers are in (or the connection became a websocket)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._awaiting_headers():
                self._arm()  # kept alive: the next request's headers are timed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self or not self._awaiting_headers():
                return
            log_refusal("connection", f"request headers not complete within {header_timeout_s:g} s", self.client)
            transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def server_config(app: Any, host: str, port: int, log_level: str = "warning") -> uvicorn.Config:
    """The uvicorn config `serve` runs: the guarded HTTP protocol, limits from the settings."""
    protocol = guarded_protocol(AutoHTTPProtocol, setting("header_timeout_s"), setting("max_connections"))
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol)


def run(app: Any, host: str, port: int, log_level: str = "warning") -> None:
    """Serve ``app`` on ``host``:``port`` until interrupted (what `swe-gym-env serve` runs); a server that could not
    start (the port taken, …) exits with uvicorn's startup-failure status, as ``uvicorn.run`` does."""
    server = uvicorn.Server(server_config(app, host, port, log_level))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
