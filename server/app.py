"""The server app: /capture (capture proxy), /mcp (MCP tools), /health.

Sandboxes reach the capture proxy through a unix socket that serves /capture and nothing else, or (backends without
a network namespace, e.g. `landlock`) through a loopback TCP port that serves the same capture-only app. Both are
started with the server, always: the TCP listener costs one idle socket, exposes nothing the main port does not
(/capture there too, and every call needs a session key), and its port is written beside the socket (`capture.port`)
so a backend finds it from `SandboxSpec.capture_socket` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from fastmcp.server.http import StarletteWithLifespan
from starlette.applications import Starlette
from starlette.routing import Mount

from swe_gym_env.core.tempdirs import owned_dir, reap_orphans
from swe_gym_env.server.capture import CaptureProxy
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.engine.builtin import builtin_engine
from swe_gym_env.server.grading import load_swebench
from swe_gym_env.server.mcp_tools import build_mcp
from swe_gym_env.server.openenv import install_openenv_routes, wrap_mcp_app
from swe_gym_env.server.results.pages import Manifest, accepts_gzip, file_chunks, parse_range
from swe_gym_env.server.rollout import RolloutService, ServerConfig
from swe_gym_env.server.rollout.service import freeze_startup_heap
from swe_gym_env.server.sandbox.hf_pool import close_pools
from swe_gym_env.server.sandbox.landlock import CAPTURE_PORT_FILE
from swe_gym_env.server.sandbox.preflight import probe_all, resolved
from swe_gym_env.server.sandbox.registry import reap_forever
from swe_gym_env.server.security import (
    BodySizeLimit,
    access_mode,
    bearer,
    lock_reason,
    log_refusal,
    read_mode,
    read_refusal,
)
from swe_gym_env.wire import RolloutStatus

CAPTURE_DIR_PREFIX = "swe-gym-capture-"
Mounter = Callable[[FastAPI, RolloutService], None]


async def _serve_capture(
    capture: CaptureProxy, where: str, uds: str | None, sock: socket.socket | None
) -> uvicorn.Server:
    app = Starlette(routes=[Mount("/capture", app=capture.app(admin=False))])  # sandboxes reach nothing else
    server = uvicorn.Server(uvicorn.Config(app, uds=uds, log_level="warning", lifespan="off", access_log=False))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))
    for _ in range(200):
        if server.started or task.done():
            break
        await asyncio.sleep(0.01)
    if not server.started:
        raise RuntimeError(f"capture server did not start at {where}")
    server._task = task  # type: ignore[attr-defined]
    return server


async def _serve_capture_socket(capture: CaptureProxy, socket_path: Path) -> uvicorn.Server:
    return await _serve_capture(capture, str(socket_path), str(socket_path), None)


async def _serve_capture_tcp(capture: CaptureProxy, port_file: Path) -> uvicorn.Server:
    """The capture-only app on 127.0.0.1:<free port>, for sandboxes that share the host's network stack (their
    confinement lets them connect to this one port on loopback); the port goes to `port_file`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = await _serve_capture(capture, f"127.0.0.1:{port}", None, sock)
    port_file.write_text(f"{port}\n")  # noqa: ASYNC240 - one tiny write at start
    return server


async def _stop(server: uvicorn.Server) -> None:
    server.should_exit = True
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server._task, 5)  # type: ignore[attr-defined]


def create_app(config: ServerConfig, mount: Mounter | None = None) -> FastAPI:
    """The app: /health and the result routes, OpenEnv's routes, /capture (with its admin routes), the UI where it is
    on, and /mcp; the lifespan starts the capture-only listeners, the reapers and retention. ``mount``: a surface
    mounted on the app before the catch-all at "/" (the UI: `swe_gym_env.ui.ui_mount`; this module never imports it)."""
    capture = CaptureProxy(CaptureStore(config.capture_db) if config.capture_db else None)
    service = RolloutService(config, capture)
    mcp = build_mcp(service)
    mcp_app = mcp.http_app(path="/mcp")
    app = FastAPI(title="swe_gym_env", lifespan=_lifespan(service, capture, mcp_app))
    app.state.service = service
    app.state.capture = capture
    app.include_router(health_router(service, capture))
    app.include_router(results_router(service))
    install_openenv_routes(app, mcp, service)
    app.add_middleware(BodySizeLimit)  # SWE_GYM_MAX_REQUEST_BYTES; websockets bound their own messages
    app.mount("/capture", capture.app(admin=True))
    if mount is not None:
        mount(app, service)
    app.mount("/", wrap_mcp_app(app, mcp_app))
    return app


def _lifespan(service: RolloutService, capture: CaptureProxy, mcp_app: StarletteWithLifespan):
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if (locked := lock_reason()) is not None:  # an exposed server with no secret: say which one to set
            print(f"swe-gym-env serve: {locked}", file=sys.stderr, flush=True)
        service.recover()
        if capture.store is not None:
            # sessions of servers that are gone stay readable, marked abandoned; a live server's stay open
            capture.store.abandon_open()
        await asyncio.to_thread(service.retention.prepare)  # the capture store gives deleted pages back
        retention = asyncio.create_task(service.retention.run_forever())  # and after each finished rollout
        reap_orphans(CAPTURE_DIR_PREFIX)
        sock_dir = owned_dir(CAPTURE_DIR_PREFIX, socket="capture.sock")
        os.chmod(sock_dir, 0o700)
        service.sockets.capture = sock_dir / "capture.sock"
        uds = await _serve_capture_socket(capture, service.sockets.capture)
        tcp = await _serve_capture_tcp(capture, sock_dir / CAPTURE_PORT_FILE)
        await probe_all()  # which sandboxes work here (cached): `auto` resolves without blocking a request later
        warm = asyncio.create_task(asyncio.to_thread(load_swebench))
        warm.add_done_callback(lambda _: freeze_startup_heap())  # in the loop's thread, once
        app.state.warm = warm
        reaper = asyncio.create_task(reap_forever())  # sandboxes of dead servers, and ours past their deadline
        try:
            async with mcp_app.lifespan(app):
                yield
        finally:
            for task in (warm, reaper, retention):
                task.cancel()
            await _shut_down(service, capture, uds, tcp)
            shutil.rmtree(sock_dir, ignore_errors=True)

    return lifespan


async def _shut_down(service: RolloutService, capture: CaptureProxy, *listeners: uvicorn.Server) -> None:
    await service.retention.aclose()
    await asyncio.to_thread(close_pools)  # hf-pool: cancel the pool hosts this process started
    await asyncio.gather(*(_stop(server) for server in listeners))
    await capture.aclose()
    if capture.store is not None:
        capture.store.close()
    if service.store is not None:  # this server's `.running` rollouts count as a dead one's from now
        service.store.owner.release()


def health_router(service: RolloutService, capture: CaptureProxy) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health(request: Request) -> dict:
        """Liveness, and what a client needs to send work here. Public: no secrets, no paths of results.

        - `sandboxes`: per backend, `usable` and `reason`, from a real probe in this process (run once, cached);
          `default_sandbox`: the backend a rollout with `sandbox="auto"` (the default) runs on; None when no backend
          is usable here (such rollouts then fail at `validate`, naming what to configure).
        - `capacity`, for clients spreading rollouts over several servers: `max_rollouts` is the configured limit of
          rollouts running at once on the default sandbox (SWE_GYM_MAX_ROLLOUTS, or SWE_GYM_MAX_ROLLOUTS_<BACKEND>),
          `in_flight` the rollouts running or queued on it, `free` = max(0, max_rollouts - in_flight); all three 0
          but `in_flight` when no backend is usable. `by_sandbox`: the same for each usable backend.
        - `engine`: only when the server runs the built-in engine (no engine configured): it is NOT a model.
        - `access`: `mode` is `token` (an access token guards starting work), `open`, or `locked` (reachable from
          outside with no secret configured: work and admin routes refused; `notice` says which secret to set);
          `reads` says who may list and read rollouts: `public` (SWE_GYM_PUBLIC_READS=1), else the same as `mode`.
        - `disk`: what the results store and the capture store hold, their limits, and the data disk's free space.
        """
        sandboxes = await probe_all()
        default = resolved(sandboxes)
        live = service.live()

        def slots(name: str) -> dict[str, int]:
            limit = service.config.concurrency.get(name, 8)
            n = sum(1 for r in live if r.request.sandbox == name)
            return {"max_rollouts": limit, "in_flight": n, "free": max(0, limit - n)}

        capacity = slots(default) if default else {"max_rollouts": 0, "in_flight": len(live), "free": 0}
        state = request.app.state
        out = {
            "status": "healthy",
            "warm": bool(getattr(state, "warm", None) and state.warm.done()),  # grading imports loaded
            "rollouts_in_flight": len(live),
            "capture_sessions": capture.open_sessions(),
            "openenv_sessions": len(state.openenv.sessions),
            "sandboxes": sandboxes,
            "default_sandbox": default,
            "capacity": {**capacity, "by_sandbox": {n: slots(n) for n, r in sandboxes.items() if r["usable"]}},
            # token | open | locked (exposed with no secret: `notice` names the secret to set)
            # reads: who may list and read rollouts (public: SWE_GYM_PUBLIC_READS=1; else as starting work)
            "access": {"mode": access_mode(), "reads": read_mode(), "notice": lock_reason()},
            "disk": await asyncio.to_thread(service.retention.usage),
        }
        if (builtin := builtin_engine()) is not None:
            out["engine"] = builtin
        return out

    return router


def check_read(request: Request) -> None:
    if (why := read_refusal(bearer(request.headers.get("authorization")))) is not None:
        log_refusal(f"GET {request.url.path}", why, request.client)
        raise HTTPException(401, why, headers={"WWW-Authenticate": "Bearer"})


def results_router(service: RolloutService) -> APIRouter:
    router = APIRouter(dependencies=[Depends(check_read)])

    @router.get("/rollouts/{rollout_id}", response_model=RolloutStatus)
    async def get_rollout(rollout_id: str) -> RolloutStatus:
        status = await asyncio.to_thread(service.get, rollout_id)
        if status is None:
            raise HTTPException(404, f"no rollout {rollout_id!r}")
        return status

    @router.get("/rollouts/{rollout_id}/result")
    async def get_rollout_result(rollout_id: str, request: Request) -> Response:
        """A finished rollout's result as stored (its JSON), streamed from disk: `Range: bytes=a-b` (one range: 206,
        past the end: 416), gzip when asked for without a range; `ETag` and `X-Content-SHA256` are the SHA-256 of
        the whole JSON (the `sha256` of its summary). 409 while the rollout runs."""
        m = await asyncio.to_thread(service.manifest, rollout_id)
        if m is None:
            rec = service.record(rollout_id)
            if rec is not None and rec.result is None:
                raise HTTPException(409, f"rollout {rollout_id!r} is {rec.state}: its result is not there yet")
            if rec is not None and rec.result is not None:  # finished but not stored (a full disk): from memory
                return Response(rec.result.model_dump_json(), media_type="application/json")
            raise HTTPException(404, f"no stored result for rollout {rollout_id!r}")
        return stored_result(m, request)

    return router


def stored_result(m: Manifest, request: Request) -> Response:
    """A stored result's bytes as the request asks: one range (206 / 416), gzip, or whole."""
    etag = f'"{m.sha256}"'
    headers = {"Accept-Ranges": "bytes", "ETag": etag, "X-Content-SHA256": m.sha256, "Vary": "Accept-Encoding"}
    wanted = parse_range(request.headers.get("range"), m.size)
    if_range = request.headers.get("if-range")
    if wanted is not None and if_range is not None and if_range.strip() != etag:
        wanted = None  # the client's copy is another version: send it whole
    if wanted == "unsatisfiable":
        headers["Content-Range"] = f"bytes */{m.size}"
        raise HTTPException(416, "range not satisfiable", headers=headers)
    if isinstance(wanted, tuple):
        start, end = wanted
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{m.size}"
        headers["Content-Length"] = str(end - start)
        body = file_chunks(m.path, start, end)
        return StreamingResponse(body, 206, headers=headers, media_type="application/json")
    if accepts_gzip(request.headers.get("accept-encoding")):
        headers["Content-Encoding"] = "gzip"
        headers["ETag"] = f'"{m.sha256}-gzip"'
        body = file_chunks(m.path, 0, m.size, gzip_it=True)
        return StreamingResponse(body, 200, headers=headers, media_type="application/json")
    headers["Content-Length"] = str(m.size)
    return StreamingResponse(file_chunks(m.path, 0, m.size), 200, headers=headers, media_type="application/json")
