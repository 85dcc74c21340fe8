"""Gradio UI at /web: Live, Run, Rollout, Tasks, History.

Gradio is imported and the Blocks built on the first request to /web, not while the server starts: that is about 2 s
of CPU (Gradio's component classes regenerate their own .pyi stubs as they are defined), which every server start
paid whether or not anyone opened the UI (`swe-gym-env bench server` measures both). An exposed server (a Space, or
one bound beyond loopback: people visit it) builds it in the background as soon as it has started instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

    from swe_gym_env.server.rollout import RolloutService

PATH = "/web"


class LazyUI:
    """The ASGI app mounted at /web: on its first request it imports Gradio, builds the Blocks (in a thread, so the
    event loop keeps serving rollouts meanwhile), starts Gradio's queue, and from then on hands every request to the
    Gradio app, exactly as `gr.mount_gradio_app` would have mounted it. Concurrent first requests wait on one build;
    a build that fails answers 503 with the reason and is tried again on the next request."""

    def __init__(self, service: RolloutService) -> None:
        self._service = service
        self._gradio: ASGIApp | None = None
        self._building: asyncio.Future[ASGIApp] | None = None
        self._running = contextlib.AsyncExitStack()  # Gradio's lifespan (its queue), closed with the server's
        self.build_s: float | None = None

    @property
    def state(self) -> str:
        """`ready`, `building`, or `on first visit` (not built yet, or its last build failed: see stderr)."""
        if self._gradio is not None:
            return "ready"
        return "building" if self._building is not None else "on first visit"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self._gradio
        if app is None:
            try:
                app = await self.ready()
            except Exception as e:
                await _refuse(scope, receive, send, f"the UI at {PATH} could not start: {type(e).__name__}: {e}")
                return
        await app(scope, receive, send)

    async def ready(self) -> ASGIApp:
        """The Gradio app, built by the first caller; the others wait on that build (shielded: a client that goes
        away does not cancel it). A failed build is said on stderr, raised to every waiter, and tried again next
        time."""
        if self._gradio is not None:
            return self._gradio
        if self._building is None:
            self._building = asyncio.ensure_future(self._build())
        try:
            return await asyncio.shield(self._building)
        except Exception as e:
            if self._building is not None and self._building.done():
                self._building = None
                print(f"swe-gym-env serve: the UI at {PATH} could not start: {e!r}", file=sys.stderr, flush=True)
            raise

    async def _build(self) -> ASGIApp:
        from starlette.routing import Mount

        t = time.monotonic()
        holder = await asyncio.to_thread(_mounted_on_a_holder, self._service)
        # Gradio's own lifespan for a mounted app (the queue, its cleanup tasks), entered here and left at shutdown
        await self._running.enter_async_context(holder.router.lifespan_context(holder))
        gradio: ASGIApp = next(r.app for r in holder.routes if isinstance(r, Mount) and r.path == PATH)
        self._gradio = gradio
        self.build_s = time.monotonic() - t
        return gradio

    async def aclose(self) -> None:
        if self._building is not None and not self._building.done():  # stopping mid-build: Gradio never starts
            self._building.cancel()
            with contextlib.suppress(BaseException):
                await self._building
        await self._running.aclose()


def _mounted_on_a_holder(service: RolloutService) -> FastAPI:
    """Gradio's documented mount, on an app of its own: the server takes the mounted Gradio app out of it."""
    import gradio as gr
    from fastapi import FastAPI

    from swe_gym_env.ui.app import build_ui
    from swe_gym_env.ui.render import CSS

    holder = FastAPI()
    gr.mount_gradio_app(
        holder,
        build_ui(service),
        path=PATH,
        css=CSS,
        footer_links=[],
        run_history=False,
        ssr_mode=False,
        mcp_server=False,
        show_error=True,
    )
    return holder


async def _warm(ui: LazyUI) -> None:
    with contextlib.suppress(Exception):  # said on stderr by ready(); the first visit tries again
        await ui.ready()


async def _refuse(scope: Scope, receive: Receive, send: Send, why: str) -> None:
    if scope["type"] == "http":
        from starlette.responses import PlainTextResponse

        await PlainTextResponse(why, status_code=503)(scope, receive, send)
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1011, "reason": why[:120]})


def mount_ui(app: FastAPI, service: RolloutService) -> LazyUI:
    """Mount the UI at /web on ``app`` (built on its first request) and redirect "/" there; call before any
    catch-all mount at "/". The UI's Gradio queue stops with ``app``'s lifespan."""
    from fastapi.responses import RedirectResponse

    @app.get("/", include_in_schema=False)
    async def _root() -> RedirectResponse:
        return RedirectResponse(PATH + "/", status_code=307)

    from swe_gym_env.server.security import exposure

    ui = LazyUI(service)
    app.mount(PATH, ui)
    outer = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any):
        warm = None
        try:
            async with outer(app_) as state:
                if exposure() is not None:  # people will visit: build it now rather than on the first visit
                    warm = asyncio.create_task(_warm(ui))
                yield state
        finally:
            if warm is not None:
                warm.cancel()
            await ui.aclose()

    app.router.lifespan_context = lifespan  # pyright: ignore[reportAttributeAccessIssue] (as Gradio's own mount does)
    return ui
