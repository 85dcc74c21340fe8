"""Who may start work from the UI: same-origin browsers only, and the access token where one is configured.

A browser always sends `Origin` (and modern ones `Sec-Fetch-Site`) on the POST that starts a Gradio event, so a
page on another site (or a sibling Space on the same parent domain) cannot start rollouts with a visitor's browser.
Clients without those headers are not browsers acting for someone else: they still need the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from swe_gym_env.server.security import access_ok, access_required


def _host_of(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
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
    """Why this request is not from this server's own page, or None when it is (or is not from a browser)."""
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


def start_refusal(headers: Mapping[str, str], token: str | None, scheme: str = "http") -> str | None:
    """None when this request may start work; else the reason (never echoing the token)."""
    if (why := cross_site_reason(headers, scheme)) is not None:
        return why
    if access_required() and not access_ok(token or None):
        return "access token required: enter this server's access token (or admin key) to start rollouts"
    return None
