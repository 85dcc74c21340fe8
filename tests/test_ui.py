"""The Gradio UI at /web in a real headless Chromium (Debian's, driven by Playwright), against the built-in engine and
the server as real processes, real Pi in real bubblewrap, real grading. Screenshots go to tests/artifacts/ui/.

The engine is slowed (SWE_GYM_ENGINE_DELAY_S) so a rollout lasts long enough to watch turns land before it ends.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.rollout import RolloutRecord
from swe_gym_env.ui import render
from swe_gym_env.ui.guard import cross_site_reason
from swe_gym_env.ui.live import activity
from swe_gym_env.wire import RolloutRequest, RolloutResult, Turn

from helpers import Stack

ARTIFACTS = Path(__file__).parent / "artifacts" / "ui"
ARTIFACTS.mkdir(parents=True, exist_ok=True)
TOKEN = "ui-test-" + uuid.uuid4().hex
DELAY_S = "1.0"
STARTUP_S = 180.0


def _stack(tmp_path_factory, **env: str) -> Stack:
    data = tmp_path_factory.mktemp("ui-data")
    return Stack("oracle", env={"SWE_GYM_ENGINE_DELAY_S": DELAY_S, "SWE_GYM_DATA_DIR": str(data), **env}, ui=True)


@pytest.fixture(scope="module")
def guarded_stack(tmp_path_factory):
    s = _stack(tmp_path_factory, SWE_GYM_ACCESS_TOKEN=TOKEN)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def open_stack(tmp_path_factory):
    s = _stack(tmp_path_factory)
    yield s
    s.stop()


def base(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.server_port}"


def results_on_disk(stack: Stack) -> list[str]:
    """Rollouts in the results store (its own files, such as an index, are not rollouts)."""
    return sorted(
        p.name for p in Path(stack.env["SWE_GYM_DATA_DIR"], "results").glob("*") if not p.name.startswith(".")
    )


def gradio_call(url: str, api_name: str, data: list, headers: dict[str, str] | None = None) -> list[dict]:
    """Call a Gradio event over its own HTTP queue protocol (what the browser does); returns the SSE messages."""
    config = httpx.get(f"{url}/web/config").json()
    fn = next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)
    session = uuid.uuid4().hex[:10]
    api = f"{url}/web/gradio_api"
    body = {"data": data, "fn_index": fn, "session_hash": session, "event_data": None, "trigger_id": None}
    joined = httpx.post(f"{api}/queue/join", json=body, headers=headers or {})
    assert joined.status_code == 200, joined.text
    messages = []
    with httpx.stream("GET", f"{api}/queue/data", params={"session_hash": session}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                messages.append(json.loads(line[5:]))
                if messages[-1].get("msg") in ("process_completed", "close_stream"):
                    break
    return messages


def outputs_text(messages: list[dict]) -> str:
    return json.dumps([m.get("output") for m in messages if m.get("output")])


# -- unit: the cross-site rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000", "sec-fetch-site": "same-origin"}, False),
        ({"host": "127.0.0.1:8000"}, False),  # not a browser: no ambient authority to abuse; the token still applies
        ({"host": "space.hf.space", "x-forwarded-proto": "https", "origin": "https://space.hf.space"}, False),
        ({"host": "space.hf.space", "origin": "https://space.hf.space"}, False),  # TLS ends at the proxy
        ({"host": "127.0.0.1:8000", "origin": "http://evil.example"}, True),
        ({"host": "127.0.0.1:8000", "origin": "http://localhost:8000"}, True),
        ({"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:9000"}, True),
        ({"host": "127.0.0.1:8000", "origin": "null"}, True),
        ({"host": "a.hf.space", "sec-fetch-site": "same-site"}, True),  # a sibling Space
        ({"host": "a.hf.space", "sec-fetch-site": "cross-site", "origin": "https://a.hf.space"}, True),
    ],
)
def test_cross_site_rule(headers, refused):
    assert (cross_site_reason(headers) is not None) is refused


# -- unit: rendering never leaks, the graph and the live states -------------------------------------------------
def _turn(i: int, parent: int | None = None, relation: str = "root", discarded: bool = False, **kw) -> Turn:
    return Turn(
        index=i,
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[5, 6],
        logprobs=[-0.25, -2.0],
        finish_reason="stop",
        streamed=True,
        wall_s=0.1,
        request=kw.get("request", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        response_message=kw.get("response", {"role": "assistant", "content": "ok"}),
        parent=parent,
        relation=relation,
        retry_of=kw.get("retry_of"),
        discarded=discarded,
    )


def test_rendered_text_is_escaped_and_redacted(monkeypatch):
    monkeypatch.setenv("SWE_GYM_ENGINE_API_KEY", "engine-secret-123")
    hostile = "<script>alert(1)</script> key sgk-" + "A" * 43 + " and engine-secret-123 and Bearer abcdefghijklmnop"
    turn = _turn(0, request={"model": "m", "messages": [{"role": "tool", "content": hostile}]})
    out = render.conversation_html([turn]) + render.result_html(
        RolloutResult(rollout_id="r", ok=False, error=hostile, harness="pi", sandbox="local", turns=[turn])
    )
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "sgk-AAAA" not in out and "engine-secret-123" not in out and "abcdefghijklmnop" not in out
    assert out.count("[redacted]") >= 6


def test_heatmap_and_token_table_carry_ids_and_logprobs():
    html = render.heatmap_html([_turn(0)], lambda tid: f"t{tid}")
    assert 'data-id="5"' in html and 'data-lp="-0.2500"' in html and "t6" in html
    assert (
        'class="sg-tok sg-l10"' in html and ".sg-l10 { background: rgb(255,65,65); }" in render.CSS
    )  # -2.0: saturated
    assert render.token_rows([_turn(0)]) == [[1, 0, 5, "", -0.25], [1, 1, 6, "", -2.0]]


def test_graph_draws_roots_forks_drift_retries_and_discarded_branches():
    turns = [
        _turn(0),
        _turn(1, 0, "extends"),
        _turn(2, 0, "drift"),  # a fork from call 1: a second row
        _turn(3, 1, "extends", discarded=True),
        _turn(4, 1, "extends", retry_of=3),  # retries call 4: drawn as a retry
    ]
    svg = render.graph_svg(turns)
    assert svg.count('class="sg-node') == 5 and svg.count("sg-discarded") == 1
    assert svg.count(">root<") == 1 and svg.count(">fork of 1<") == 1  # call 4 continues call 2's row
    assert 'class="sg-edge sg-drift"' in svg and 'class="sg-edge sg-retry"' in svg


def test_live_state_tells_booting_from_silent_agent():
    req = RolloutRequest()
    rec = RolloutRecord(rollout_id="r" * 8, request=req, phase="boot", state="running")
    now = time.time()
    assert activity(rec, 3.0, now) == "sandbox still booting (3s)"
    rec.phase = "agent"
    rec.session, _ = CaptureProxy().open_session(EngineTarget("http://127.0.0.1:9/v1", "m"), max_calls=1, max_tokens=1)
    assert activity(rec, 5.0, now) == "agent up, no model call yet (5s)"
    rec.session.turns.append(_turn(0))
    rec.session.last_call_at = now - 2
    assert activity(rec, 9.0, now).startswith("agent calling the model (last call 2.0s ago)")
    rec.session.last_call_at = now - 90
    assert activity(rec, 99.0, now) == "agent up but not calling the model for 90s"
    rec.set_phase("grade")  # the record keeps when its phase began
    assert 0 <= time.time() - rec.phase_since < 5 and activity(rec, 4.0, now) == "grading (4s)"


# -- the server around the UI -----------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.usefixtures("need_pi")
def test_root_redirects_to_web_and_other_routes_still_work(open_stack):
    url = base(open_stack)
    r = httpx.get(url + "/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/web/"
    assert httpx.get(url + "/web/").status_code == 200
    assert httpx.get(url + "/health").json()["status"] == "healthy"
    assert httpx.get(url + "/metadata").json()["name"] == "swe_gym_env"
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    mcp = httpx.post(url + "/mcp", json=init, headers={"accept": "application/json, text/event-stream"})
    assert mcp.status_code == 200 and '"serverInfo"' in mcp.text


@pytest.mark.integration
@pytest.mark.usefixtures("need_pi")
def test_cross_origin_and_tokenless_starts_are_refused(guarded_stack):
    url = base(guarded_stack)
    args = ["bundled", None, "pi", "local", "default", 3]
    evil = gradio_call(url, "start_run", [*args, TOKEN], {"origin": "http://evil.example"})
    assert "cross-origin request refused" in outputs_text(evil)
    sibling = gradio_call(url, "start_run", [*args, TOKEN], {"sec-fetch-site": "same-site"})
    assert "cross-site request refused" in outputs_text(sibling)
    no_token = gradio_call(url, "start_run", [*args, "wrong"], {"origin": url})
    text = outputs_text(no_token)
    assert "access token required" in text and "wrong" not in text and TOKEN not in text
    time.sleep(0.5)
    assert guarded_stack.health()["rollouts_in_flight"] == 0 and results_on_disk(guarded_stack) == []


# -- in the browser ---------------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
def test_run_in_browser_streams_turns_then_shows_reward_and_heatmap(browser, guarded_stack):
    url = base(guarded_stack)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url + "/")  # redirected to /web/
    assert page.url.rstrip("/").endswith("/web")

    # A page on another origin (localhost vs 127.0.0.1) posting to the Run endpoint with the right token: refused.
    other = browser.new_page()
    other.goto(f"http://localhost:{guarded_stack.server_port}/health")
    fn = next(d["id"] for d in httpx.get(url + "/web/config").json()["dependencies"] if d["api_name"] == "start_run")
    status = other.evaluate(
        """async ([api, fn, token]) => {
            const body = {data: ["bundled", null, "pi", "local", "default", 3, token], fn_index: fn,
                          session_hash: "evil123456", event_data: null, trigger_id: null};
            try {
              const r = await fetch(api + "/queue/join", {method: "POST", body: JSON.stringify(body),
                                    headers: {"content-type": "application/json"}});
              return r.status;
            } catch (e) { return String(e); }
        }""",
        [url + "/web/gradio_api", fn, TOKEN],
    )
    other.close()
    time.sleep(1.0)
    assert guarded_stack.health()["rollouts_in_flight"] == 0 and results_on_disk(guarded_stack) == [], status

    page.get_by_role("tab", name="Run").click()
    page.click("#run-button")  # no token: refused, nothing starts
    page.wait_for_selector("#panel-message:has-text('access token required')")
    assert guarded_stack.health()["rollouts_in_flight"] == 0

    page.fill("#run-token input", TOKEN)
    page.click("#run-button")
    # Turns appear while the rollout is still running (server push from the rollout's progress queue).
    page.wait_for_function(
        """() => { const s = document.querySelector('#run-state');
                   return s && s.dataset.state === 'running' && parseInt(s.dataset.turns) >= 1; }""",
        timeout=90_000,
    )
    live_calls = page.locator("#run-conversation .sg-turn").count()
    assert live_calls >= 1
    assert page.locator("#run-timeline li", has_text="model call 1").count() == 1
    page.screenshot(path=str(ARTIFACTS / "run_in_flight.png"), full_page=True)
    assert guarded_stack.health()["rollouts_in_flight"] == 1

    page.wait_for_selector("#run-state[data-state='finished']", timeout=180_000)
    reward = page.locator("#run-result .sg-reward")
    assert reward.get_attribute("data-reward") == "1", page.inner_text("#run-result")
    assert "cross-check: match" in page.inner_text("#run-result")
    page.screenshot(path=str(ARTIFACTS / "run_finished.png"), full_page=True)

    page.get_by_role("tab", name="Tokens").first.click()
    tokens = page.locator("#run-heatmap .sg-tok")
    assert tokens.count() > 10
    first = tokens.first
    assert first.get_attribute("data-lp").startswith("-0.") and first.get_attribute("data-id").isdigit()
    first.hover()  # id and logprob on hover
    hover = page.evaluate("e => getComputedStyle(e, '::after').content", first.element_handle())
    assert "logprob -0." in hover, hover
    assert page.locator("#run-tokens").inner_text().count("\n") > 5  # the id / logprob table
    page.screenshot(path=str(ARTIFACTS / "run_heatmap.png"), full_page=True)

    page.get_by_role("tab", name="Graph").first.click()
    assert page.locator("#run-graph svg .sg-node").count() >= 2
    page.get_by_role("tab", name="Grading").first.click()
    assert page.locator("#run-grading tr.sg-passed").count() >= 1
    assert page.locator("#run-grading tr.sg-failed").count() == 0
    page.screenshot(path=str(ARTIFACTS / "run_graph_grading.png"), full_page=True)

    html = page.content()
    assert TOKEN not in html and "sgk-" not in html
    page.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
def test_rollout_started_over_mcp_shows_in_live_view(browser, open_stack):
    url = base(open_stack)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url + "/web/")
    page.wait_for_selector("#live-empty")

    done: dict = {}

    def over_mcp() -> None:
        async def go():
            async with SweGymClient(open_stack.mcp_url) as c:
                done["result"] = await c.run_rollout(harness="pi", rollout_id="mcp-ui-" + uuid.uuid4().hex[:8])

        asyncio.run(go())

    t = threading.Thread(target=over_mcp, daemon=True)
    t.start()
    rows_js = "() => [...document.querySelectorAll(\"#live-table tr[data-rollout^='mcp-ui-']\")].map(r => r.innerText)"
    page.wait_for_function(f"() => ({rows_js})().length > 0", timeout=60_000)
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    shot = False
    while "result" not in done and time.monotonic() < deadline:
        for text in page.evaluate(rows_js):  # read atomically: the row goes away when the rollout ends
            seen.add(text)
            if "calling the model" in text and not shot:
                page.screenshot(path=str(ARTIFACTS / "live_mcp_rollout.png"), full_page=True)
                shot = True
        time.sleep(0.3)
    t.join(60)
    result = done["result"]
    assert result.ok and result.reward == 1.0, result.error
    cells = " ".join(seen)
    assert result.instance_id in cells and "pi" in cells and "local" in cells
    assert shot, f"never saw the agent calling the model: {seen}"
    assert any("agent up, no model call yet" in text for text in seen), seen  # Pi starts before its first call
    page.wait_for_selector("#live-empty", timeout=10_000)  # gone from Live once finished

    page.get_by_role("tab", name="History").click()
    page.click("#history-refresh")
    page.wait_for_function(
        "id => document.querySelector('#history-table').innerText.includes(id)", arg=result.rollout_id, timeout=10_000
    )
    page.screenshot(path=str(ARTIFACTS / "history.png"), full_page=True)

    page.get_by_role("tab", name="Tasks").click()
    page.fill("#task-search input, #task-search textarea", "chunked")
    page.wait_for_function("() => document.querySelector('#task-detail').innerText.includes('1 of 6 tasks')")
    table = page.inner_text("#task-table")
    assert "batchtools" in table and "dotenvlite" not in table
    page.close()
