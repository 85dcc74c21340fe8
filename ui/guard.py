"""Who may start work from the UI: the server's one guard (`server.security.start_refusal`: same-site browsers only,
the access token where one is configured, the rate limit per key), applied to the Gradio request that starts a run.
Who may see rollouts there (live, history, a rollout's page): `server.security.read_refusal`.

What is the UI's own: the token comes from a text box rather than a header, and the access refusal says so.
"""

from __future__ import annotations

from typing import Any

from swe_gym_env.server.security import (
    ACCESS_REFUSED,
    READ_REFUSED,
    bearer,
    cross_site_reason,
    read_refusal,
    start_refusal,
)

UI_ACCESS_REFUSED = "access token required: enter this server's access token (or admin key) to start rollouts"

UI_READ_REFUSED = (
    "access token required to see rollouts on this server: enter its access token (or admin key) in the box at the "
    "top (the server owner can make rollouts public with SWE_GYM_PUBLIC_READS=1)"
)

__all__ = ["UI_ACCESS_REFUSED", "UI_READ_REFUSED", "cross_site_reason", "ui_read_refusal", "ui_start_refusal"]


def ui_start_refusal(request: Any, token: str | None) -> str | None:
    """None when this Gradio request (``gr.Request``, or None outside a request) may start work with ``token``;
    else the reason (never echoing the token)."""
    headers = dict(request.headers) if request is not None else {}
    why = start_refusal(token or None, headers=headers)
    return UI_ACCESS_REFUSED if why == ACCESS_REFUSED else why


def ui_read_refusal(request: Any, token: str | None) -> str | None:
    """None when this Gradio request may see rollouts (their list, results and live views) with ``token`` (the text
    box) or its own `Authorization: Bearer` header; else the reason (`server.security.read_refusal`)."""
    header = bearer(dict(request.headers).get("authorization")) if request is not None else None
    why = read_refusal((token or "").strip() or header)
    return UI_READ_REFUSED if why == READ_REFUSED else why
