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
    log_refusal,
    read_refusal,
    start_refusal,
)

UI_ACCESS_REFUSED = "access token required: enter this server's access token (or admin key) to start rollouts"

UI_READ_REFUSED = (
    "access token required to see rollouts on this server: enter its access token (or admin key) in the box at the "
    "top (the server owner can make rollouts public with SWE_GYM_PUBLIC_READS=1)"
)

__all__ = ["UI_ACCESS_REFUSED", "UI_READ_REFUSED", "cross_site_reason", "ui_read_refusal", "ui_start_refusal"]


def _client(request: Any) -> Any:
    client = getattr(request, "client", None)
    return getattr(client, "host", None)


def ui_start_refusal(request: Any, token: str | None) -> str | None:
    """None when this Gradio request (``gr.Request``, or None outside a request) may start work with ``token``;
    else the reason (never echoing the token), logged in one line."""
    headers = dict(request.headers) if request is not None else {}
    why = start_refusal(token or None, headers=headers)
    if why is not None:
        log_refusal("UI run", why, _client(request))
    return UI_ACCESS_REFUSED if why == ACCESS_REFUSED else why


def ui_read_refusal(request: Any, *tokens: str | None, what: str | None = "UI read") -> str | None:
    """None when this Gradio request may see rollouts (their list, results and live views) with one of ``tokens``
    (the text boxes) or its own `Authorization: Bearer` header; else the reason (`server.security.read_refusal`),
    logged in one line as ``what`` (None: not logged, for the live view's timer that asks every second)."""
    header = bearer(dict(request.headers).get("authorization")) if request is not None else None
    presented = [t.strip() for t in tokens if t and t.strip()] or [header]
    if header is not None and header not in presented:
        presented.append(header)
    why: str | None = None
    for candidate in presented:
        why = read_refusal(candidate)
        if why is None:
            return None
    assert why is not None
    if what is not None:
        log_refusal(what, why, _client(request))
    return UI_READ_REFUSED if why == READ_REFUSED else why
