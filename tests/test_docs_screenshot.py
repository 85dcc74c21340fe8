"""README's picture: /web during a rollout, in real headless Chromium, against the built-in engine (slowed so turns
land while it runs) and the server as real processes, real Pi in a real sandbox. README.md shows the committed
docs/img/web-rollout.png; a run writes its picture to its own temp dir and, with UPDATE_DOCS_IMG=1, over the committed
one (so a test run never leaves the tree changed)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from helpers import Stack

DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
SHOT = DOCS_IMG / "web-rollout.png"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
def test_readme_screenshot_of_web_during_a_rollout(browser, tmp_path):
    token = "docs-shot-" + uuid.uuid4().hex
    env = {"SWE_GYM_ENGINE_DELAY_S": "1.5", "SWE_GYM_DATA_DIR": str(tmp_path / "data"), "SWE_GYM_ACCESS_TOKEN": token}
    stack = Stack("oracle", env=env, ui=True)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{stack.server_port}/web/")
        page.get_by_role("tab", name="Run").click()
        page.fill("#run-token input", token)
        page.click("#run-button")
        # at least two model calls on screen while the rollout still runs
        page.wait_for_function(
            """() => { const s = document.querySelector('#run-state');
                       return s && s.dataset.state === 'running' && parseInt(s.dataset.turns) >= 2; }""",
            timeout=120_000,
        )
        assert page.locator("#run-conversation .sg-turn").count() >= 2
        assert stack.health()["rollouts_in_flight"] == 1  # taken during the rollout, not after
        # the run panel at the top of the picture: the state line, the phase timeline and the model calls
        page.evaluate("document.querySelector('#run-button').scrollIntoView({block: 'start'})")
        page.evaluate("window.scrollBy(0, -12)")
        time.sleep(0.5)
        shot = tmp_path / SHOT.name
        page.screenshot(path=str(shot))
        assert token not in page.content()
        page.wait_for_selector("#run-state[data-state='finished']", timeout=180_000)
        page.close()
    finally:
        stack.stop()
    for png in (shot.read_bytes(), SHOT.read_bytes()):  # this run's picture, and the one README shows
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get("UPDATE_DOCS_IMG") == "1":
        shutil.copyfile(shot, SHOT)
