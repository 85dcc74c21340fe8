"""A public server is never open by accident: with no access token and no admin key, a server reachable from outside
(bound to a non-loopback address, or on a Space) refuses starting work and the admin routes, naming the secret to set,
unless openness is asked for (SWE_GYM_OPEN_ACCESS=1, which `push --open` writes). Loopback stays open as before."""

from __future__ import annotations

import httpx
import pytest
from fastapi import HTTPException
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from swe_gym_env.core import procs
from swe_gym_env.server import security

from helpers import ME, STARTUP_S

NAMES = (
    security.ACCESS_ENV,
    security.ADMIN_ENV,
    security.RATE_ENV,
    security.OPEN_ENV,
    security.BIND_ENV,
    security.SPACE_ENV,
)


@pytest.fixture
def env(monkeypatch):
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def locked_everywhere() -> None:
    why = security.start_refusal(None)
    assert why is not None and why.startswith("this server is locked")
    assert security.ACCESS_ENV in why and security.ADMIN_ENV in why and f"{security.OPEN_ENV}=1" in why
    assert security.start_refusal("anything") == why
    assert not security.access_ok(None) and not security.admin_ok(None) and not security.admin_ok("x")
    with pytest.raises(HTTPException) as e:
        security.require_admin(None)
    assert e.value.status_code == 401 and security.ADMIN_ENV in e.value.detail
    assert security.access_mode() == "locked" and security.lock_reason() == why


def open_as_today() -> None:
    assert security.start_refusal(None) is None and security.access_ok(None) and security.admin_ok(None)
    assert security.lock_reason() is None and security.access_mode() == "open"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "example.org"])
def test_bound_beyond_loopback_with_no_secret_is_locked(env, host):
    env.setenv(security.BIND_ENV, host)
    locked_everywhere()
    assert f"listening on {host}" in security.lock_reason()


def test_on_a_space_with_no_secret_is_locked_even_on_loopback(env):
    env.setenv(security.SPACE_ENV, "someone/gym")
    locked_everywhere()
    assert "running on a Space" in security.lock_reason()


@pytest.mark.parametrize("host", [None, "", "127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_stays_open(env, host):
    if host is not None:
        env.setenv(security.BIND_ENV, host)
    open_as_today()


def test_openness_asked_for_explicitly(env):
    env.setenv(security.BIND_ENV, "0.0.0.0")
    env.setenv(security.SPACE_ENV, "someone/gym")
    env.setenv(security.OPEN_ENV, "1")
    open_as_today()
    env.setenv(security.OPEN_ENV, "0")
    locked_everywhere()


def test_a_secret_unlocks_with_todays_rules(env):
    env.setenv(security.BIND_ENV, "0.0.0.0")
    env.setenv(security.ACCESS_ENV, "tok")
    assert security.access_mode() == "token" and security.lock_reason() is None
    assert security.start_refusal(None) == security.ACCESS_REFUSED and security.start_refusal("tok") is None
    assert not security.admin_ok(None)  # a guarded server with no admin key keeps admin routes closed (as before)
    env.delenv(security.ACCESS_ENV)
    env.setenv(security.ADMIN_ENV, "adm")  # an admin key alone: admin routes need it, starting work is open
    assert security.lock_reason() is None and security.access_mode() == "open"
    assert security.start_refusal(None) is None and not security.admin_ok(None) and security.admin_ok("adm")


def test_push_open_writes_the_openness_variable(tmp_path):
    from swe_gym_env.space_app.push import OPEN_VARIABLE, build_plan

    (tmp_path / "README.md").write_text("# p\n")
    (tmp_path / "space_app").mkdir()
    (tmp_path / "space_app" / "README.md").write_text("---\nsdk: docker\n---\n")

    def variables(**kw):
        plan = build_plan("me/gym", env={}, root=tmp_path, files=[], token_factory=lambda: "t" * 40, **kw)
        return {c.kwargs["key"]: c.kwargs["value"] for c in plan.calls if c.method == "add_space_variable"}

    assert variables(open_access=True) == {OPEN_VARIABLE: "1"}
    assert OPEN_VARIABLE not in variables()  # a generated access token instead


@pytest.mark.integration
def test_a_real_server_on_all_interfaces_with_no_secret_refuses_and_says_which_secret(tmp_path):
    """`serve --host 0.0.0.0` with nothing configured: the log, /health, MCP run_rollout and the admin routes."""
    import asyncio
    import os

    port = procs.free_port()
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(SWE_GYM_DATA_DIR=str(tmp_path / "data"), SWE_GYM_UI="0")
    log = tmp_path / "serve.log"
    argv = [*ME, "serve", "--host", "0.0.0.0", "--port", str(port), "--engine-url", "http://127.0.0.1:9/v1"]
    with open(log, "w") as out:
        proc = procs.start(argv, f"http://127.0.0.1:{port}/health", env=env, timeout=STARTUP_S, stdout=out, stderr=out)
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        assert health["access"]["mode"] == "locked" and security.ACCESS_ENV in health["access"]["notice"]
        assert health["disk"]["results"]["max_bytes"] > 0 and "free_bytes" in health["disk"]["disk"]
        assert "locked" in log.read_text() and security.ACCESS_ENV in log.read_text()
        admin = httpx.post(f"http://127.0.0.1:{port}/capture/sessions", json={"engine_url": "http://x/v1"})
        assert admin.status_code == 401 and security.ADMIN_ENV in admin.json()["error"]

        async def run():
            async with Client(StreamableHttpTransport(f"http://127.0.0.1:{port}/mcp")) as c:
                started = (await c.call_tool("run_rollout", {"engine": "nope"})).structured_content
                cancelled = await c.call_tool("cancel_rollout", {"rollout_id": "x"}, raise_on_error=False)
                return started, cancelled

        res, cancelled = asyncio.run(run())
        assert res["ok"] is False and res["error"].startswith("this server is locked"), res
        assert security.ACCESS_ENV in res["error"]
        assert cancelled.is_error and cancelled.content[0].text == res["error"]  # the lock notice, not "token required"
    finally:
        procs.stop(proc)


def test_web_banner_names_the_secret_when_locked(env):
    import asyncio

    from swe_gym_env.ui.app import _banner_html

    env.setenv(security.SPACE_ENV, "someone/gym")
    html = asyncio.run(_banner_html())
    assert 'id="access-banner"' in html and security.ACCESS_ENV in html and security.ADMIN_ENV in html, html[:500]
    env.setenv(security.ACCESS_ENV, "a-token-of-sorts")
    assert 'id="access-banner"' not in asyncio.run(_banner_html())
