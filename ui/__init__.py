"""Gradio UI at /web (imported only when the server mounts it): Live, Run, Rollout, Tasks, History.

The UI takes no files, so Gradio's file routes are off (`FilesOff`): uploads (`/gradio_api/upload`, and the recording
and streaming routes that write to Gradio's cache) and the routes that serve files or proxy URLs (`/file=…`,
`/proxy=…`) answer 403 to everyone, and nothing a stranger sends is ever written to the Space's disk or served back.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastapi import FastAPI
    from starlette.types import ASGIApp, Receive, Scope, Send

    from swe_gym_env.server.rollout import RolloutService

PATH = "/web"
FILES_OFF = "this UI takes no files: Gradio's upload and file routes are off"
_FILE_ROUTES = re.compile(
    r"^/+(?:gradio_api/+)?(?:upload|upload_progress|process_recording|file=|file/|proxy=|stream/|vibe-|undo-vibe)"
)


class FilesOff:
    """ASGI wrapper of the mounted Gradio app: its file routes (`_FILE_ROUTES`) answer 403, logged in one line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path, root = scope.get("path", ""), scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            if _FILE_ROUTES.match(path):
                from swe_gym_env.server.security import log_refusal

                log_refusal(f"{scope.get('method')} {PATH}{path[:80]}", FILES_OFF, scope.get("client"))
                body = json.dumps({"detail": FILES_OFF}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 403, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def ui_mount() -> Callable[[FastAPI, RolloutService], None] | None:
    """What the composition roots (`serve`, `swe_gym_env.asgi`) hand the app factory: the UI's mount where it is on
    (SWE_GYM_UI, on by default), else None. Gradio is imported only when it is mounted."""
    from swe_gym_env.core.settings import setting

    return mount_ui if setting("ui") else None


def mount_ui(app: FastAPI, service: RolloutService) -> None:
    """Mount the Blocks at /web on ``app``; call before any catch-all mount at "/"."""
    import gradio as gr
    from fastapi.responses import RedirectResponse
    from starlette.routing import Mount

    from swe_gym_env.ui.app import build_ui
    from swe_gym_env.ui.render import CSS

    @app.get("/", include_in_schema=False)
    async def _root() -> RedirectResponse:
        return RedirectResponse(PATH + "/", status_code=307)

    gr.mount_gradio_app(
        app,
        build_ui(service),
        path=PATH,
        css=CSS,
        footer_links=[],
        run_history=False,
        ssr_mode=False,
        mcp_server=False,
        show_error=True,
    )
    mounted = [r for r in app.routes if isinstance(r, Mount) and r.path == PATH]
    if len(mounted) != 1:
        raise RuntimeError(f"the UI's mount at {PATH} not found")
    mounted[0].app = FilesOff(mounted[0].app)
