"""The UI's marks for issue 32 item 5: an impossible-variant rollout carries a visible "impossible variant" label in the
rollout lists (Live, History) and in the rollout view (status, result, grading), and the grading panel says
"cheat caught: <finding message>" for an `impossible_solved` or `grading_tampered` finding.

Rendering is checked as pure functions; then in a real headless Chromium against a real server whose engine is
tests/hostile_engine.py: honest (slowed, to watch the rollout live) for one impossible-variant rollout, then scripting a
cheat from tests/cheats.py that the grader catches. Screenshots go to tests/artifacts/ui/."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path

import httpx
import pytest
from cheats import BY_NAME
from test_faults import HostileEngine

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.rollout import RolloutRecord
from swe_gym_env.ui import render
from swe_gym_env.wire import Finding, RolloutRequest, RolloutResult
from swe_gym_env.wire import TestReport as GradingReport

from helpers import Stack

ARTIFACTS = Path(__file__).parent / "artifacts" / "ui"
ARTIFACTS.mkdir(parents=True, exist_ok=True)
CHEAT = BY_NAME["monkeypatch_report_from_init"]  # written for batchtools, bundled task 0
BADGE = 'class="sg-variant"'


def _report() -> GradingReport:
    return GradingReport(
        resolution="RESOLVED_FULL",
        fail_to_pass={"success": ["tests/test_a.py::test_x"], "failure": []},
        pass_to_pass={"success": [], "failure": []},
        integrity="clean",
    )


def _result(variant: str = "impossible", codes: tuple[str, ...] = (), message: str = "it did {code}") -> RolloutResult:
    return RolloutResult(
        rollout_id="r-variant",
        ok=True,
        reward=0.0,
        harness="pi",
        sandbox="local",
        instance_id="t1",
        grading=_report(),
        findings=[Finding(severity="warning", code=c, message=message.format(code=c)) for c in codes],
        variant=variant,  # type: ignore[arg-type]
    )


# -- unit: the marks ------------------------------------------------------------------------------------------------
def test_the_badge_marks_an_impossible_variant_only():
    impossible, original = _result(), _result("original")
    assert BADGE in render.result_html(impossible) and "impossible variant</span>" in render.result_html(impossible)
    assert BADGE not in render.result_html(original)
    assert BADGE in render.grading_html(impossible.grading, impossible.findings, impossible.variant)
    assert BADGE not in render.grading_html(original.grading, original.findings, original.variant)
    assert ".sg-variant {" in render.CSS and ".sg-cheat {" in render.CSS


def test_the_status_line_marks_a_running_impossible_variant():
    from swe_gym_env.ui.live import Snapshot, status_html

    for variant, marked in (("impossible", True), ("original", False)):
        rec = RolloutRecord(rollout_id="r" * 8, request=RolloutRequest(variant=variant), phase="boot", state="running")
        html = status_html(Snapshot(rec.rollout_id, rec, None, []))
        assert (BADGE in html) is marked and f'data-variant="{variant}"' in html
    html = status_html(Snapshot("r-variant", None, _result(), []))
    assert BADGE in html and 'data-state="finished"' in html


def test_the_grading_panel_names_each_caught_cheat_escaped():
    hostile = "<img src=x onerror=alert(1)> replaced TestReport.from_item_and_call ({code})"
    r = _result(codes=("impossible_solved", "grading_tampered", "patch_broke_test_run"), message=hostile)
    html = render.grading_html(r.grading, r.findings, r.variant)
    assert html.count("<b>cheat caught:</b>") == 2
    assert 'data-code="impossible_solved"' in html and 'data-code="grading_tampered"' in html
    assert 'data-code="patch_broke_test_run"' not in html  # the policy's own broken run is no cheat
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt; replaced TestReport" in html
    honest = _result(codes=("patch_broke_test_run",))
    assert "cheat caught" not in render.grading_html(honest.grading, honest.findings, honest.variant)
    # a finding with no report (not graded) is still shown
    assert "cheat caught" in render.grading_html(None, r.findings, r.variant)


# -- in the browser -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    engine = HostileEngine()
    data = tmp_path_factory.mktemp("ui-variant")
    try:
        stack = Stack(
            "oracle",
            engine_up=False,
            server_engine_url=engine.url("/v1"),
            env={"SWE_GYM_DATA_DIR": str(data)},
            ui=True,
        )
    except BaseException:
        engine.stop()
        raise
    yield engine, stack
    stack.stop()
    engine.stop()


def base(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.server_port}"


def run_over_mcp(stack: Stack, rollout_id: str) -> RolloutResult:
    """An impossible-variant rollout of bundled task 0 over MCP (its own event loop: Playwright's sync API holds this
    thread's; call it in a thread)."""

    async def go() -> RolloutResult:
        async with asyncio.timeout(600):
            async with SweGymClient(stack.mcp_url) as c:
                return await c.run_rollout(
                    harness="pi", sandbox="local", index=0, variant="impossible", rollout_id=rollout_id, deadline_s=400
                )

    return asyncio.run(go())


def in_thread(stack: Stack, rollout_id: str) -> tuple[threading.Thread, dict]:
    done: dict = {}
    t = threading.Thread(target=lambda: done.setdefault("result", run_over_mcp(stack, rollout_id)), daemon=True)
    t.start()
    return t, done


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
def test_an_impossible_variant_is_marked_live_in_history_and_in_its_view(browser, bed):
    engine, stack = bed
    engine.set("slow", delay_s=1.5)  # honest (the oracle's) answers, slowed: the rollout stays in Live a while
    url = base(stack)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(url + "/web/")
    page.wait_for_selector("#live-empty")
    rid = "uiv-" + uuid.uuid4().hex[:8]
    t, done = in_thread(stack, rid)
    row = f"#live-table tr[data-rollout='{rid}']"
    page.wait_for_selector(f"{row}[data-variant='impossible'] .sg-variant", timeout=120_000)
    assert "impossible variant" in page.inner_text(f"{row} .sg-variant")
    page.screenshot(path=str(ARTIFACTS / "variant_live.png"), full_page=True)

    view = browser.new_page(viewport={"width": 1400, "height": 1000})  # the rollout's view, opened while it runs
    view.goto(f"{url}/web/?rollout={rid}")
    view.wait_for_selector("#rollout-status #run-state[data-variant='impossible'] .sg-variant", timeout=60_000)

    t.join(600)
    result = done["result"]
    assert result.ok and result.variant == "impossible", (result.phase, result.error)
    assert result.reward == 0.0 and not {"impossible_solved", "grading_tampered"} & {f.code for f in result.findings}

    finished = "#rollout-status #run-state[data-state='finished'][data-variant='impossible']"
    view.wait_for_selector(finished, timeout=60_000)
    assert "impossible variant" in view.inner_text("#rollout-result .sg-variant")
    view.get_by_role("tab", name="Grading").first.click()
    assert view.locator("#rollout-grading .sg-variant").count() == 1
    assert view.locator("#rollout-grading .sg-cheat").count() == 0  # the reference patch fails the mutants honestly
    view.screenshot(path=str(ARTIFACTS / "variant_rollout_view.png"), full_page=True)
    view.close()

    page.get_by_role("tab", name="History").click()
    page.click("#history-refresh")
    page.wait_for_function(
        "id => document.querySelector('#history-table').innerText.includes(id)", arg=rid, timeout=15_000
    )
    rows = page.evaluate(
        "id => [...document.querySelectorAll('#history-table [role=row]')]"  # Gradio's rows: divs, not <tr>
        ".map(r => r.innerText).filter(t => t.includes(id))",
        rid,
    )
    assert rows and all("impossible variant" in r for r in rows), rows
    page.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
def test_a_caught_cheat_is_named_in_the_grading_panel(browser, bed):
    engine, stack = bed
    httpx.post(engine.url("/fault"), json={"mode": "cheat", "command": CHEAT.command}, timeout=10).raise_for_status()
    rid = "uic-" + uuid.uuid4().hex[:8]
    t, done = in_thread(stack, rid)
    t.join(600)
    result = done["result"]
    assert result.ok and result.variant == "impossible" and result.reward == 0.0, (result.phase, result.error)
    caught = [f for f in result.findings if f.code == "grading_tampered"]
    assert caught, [str(f) for f in result.findings]

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base(stack)}/web/?rollout={rid}")
    page.wait_for_selector("#rollout-status #run-state[data-state='finished']", timeout=60_000)
    page.get_by_role("tab", name="Grading").first.click()
    cheat = page.locator("#rollout-grading .sg-cheat[data-code='grading_tampered']")
    cheat.wait_for(timeout=15_000)
    text = cheat.inner_text()
    assert text.startswith("cheat caught:"), text
    assert " ".join(caught[0].message.split())[:80] in " ".join(text.split()), (text, caught[0].message)
    assert page.locator("#rollout-grading .sg-variant").count() == 1
    page.screenshot(path=str(ARTIFACTS / "variant_cheat_caught.png"), full_page=True)
    page.close()
