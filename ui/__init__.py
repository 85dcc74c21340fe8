"""Gradio UI at /web (imported only when the server mounts it): Live, Run, Rollout, Tasks, History."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from swe_gym_env.server.rollout import RolloutService

PATH = "/web"


def mount_ui(app: FastAPI, service: RolloutService) -> None:
    """Mount the Blocks at /web on ``app``; call before any catch-all mount at "/"."""
    import gradio as gr
    from fastapi.responses import RedirectResponse

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
