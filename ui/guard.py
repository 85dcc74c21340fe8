"""Who may start work from the UI: the server's one guard (`server.security.start_refusal`: same-site browsers only,
the access token where one is configured, the rate limit per key), applied to the Gradio request that starts a run.

What is the UI's own: the token comes from a text box rather than a header, and the access refusal says so.
"""

from __future__ import annotations

from typing import Any

from swe_gym_env.server.security import ACCESS_REFUSED, cross_site_reason, start_refusal

UI_ACCESS_REFUSED = "access token required: enter this server's access token (or admin key) to start rollouts"

__all__ = ["UI_ACCESS_REFUSED", "cross_site_reason", "ui_start_refusal"]


def ui_start_refusal(request: Any, token: str | None) -> str | None:
    """None when this Gradio request (``gr.Request``, or None outside a request) may start work with ``token``;
    else the reason (never echoing the token)."""
    headers = dict(request.headers) if request is not None else {}
    why = start_refusal(token or None, headers=headers)
    return UI_ACCESS_REFUSED if why == ACCESS_REFUSED else why
