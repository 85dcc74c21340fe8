"""The UI at /web is built on its first request (ui.LazyUI), not while the server starts; an exposed server builds
it in the background as soon as it has started.

- a real server process: `/health` says `on first visit` until /web is requested, then `ready`, and the process
  never imported Gradio before that request (its CPU to /health is what `swe-gym-env bench server` measures);
- in this process (the real `mount_ui` on a FastAPI app under uvicorn): concurrent first visits share one build; a
  build that fails answers 503 with the reason, says it on stderr, and the next visit builds it; `SPACE_ID` set (a
  Space) builds it with no visit; a server stopped mid-build stops cleanly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

import swe_gym_env.ui as ui_module
from swe_gym_env.procs import free_port
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.ui import LazyUI, mount_ui

MODEL = "smollm2-135m-instruct"


class InProcess:
    """mount_ui on a bare FastAPI app, served by uvicorn on a thread of its own (its lifespan runs)."""

    def __init__(self, root: Path) -> None:
        config = ServerConfig(engines={"default": EngineTarget("http://127.0.0.1:9/v1", MODEL)}, results_dir=root)
        app = FastAPI()
        self.ui: LazyUI = mount_ui(app, RolloutService(config, CaptureProxy()))
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.mark.slow
def test_a_server_imports_gradio_only_on_the_first_visit_to_web():
    from helpers import Stack

    stack = Stack("oracle", ui=True)
    try:
        url = f"http://127.0.0.1:{stack.server_port}"
        assert httpx.get(url + "/health").json()["ui"] == "on first visit"
        assert not _imports_gradio(stack.server.pid)
        assert httpx.get(url + "/web/", timeout=120).status_code == 200
        assert httpx.get(url + "/health").json()["ui"] == "ready"
        assert _imports_gradio(stack.server.pid)
    finally:
        stack.stop()


def _imports_gradio(pid: int) -> bool:
    """Whether the server process has imported Gradio: /proc/PID/maps lists the extension modules it loaded, and
    Gradio's import loads Pillow's (PIL), which nothing else in the server imports (checked: the maps before and
    after the first /web request differ by PIL, cbor2, markupsafe, multidict, xxhash)."""
    return "/site-packages/PIL/" in Path(f"/proc/{pid}/maps").read_text()


def test_concurrent_first_visits_share_one_build(tmp_path, monkeypatch):
    real, builds = ui_module._mounted_on_a_holder, []

    def counted(service):
        builds.append(1)
        return real(service)

    monkeypatch.setattr(ui_module, "_mounted_on_a_holder", counted)
    s = InProcess(tmp_path / "results")
    try:
        assert s.ui.state == "on first visit"
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = list(pool.map(lambda _: httpx.get(s.url + "/web/", timeout=120).status_code, range(6)))
        assert codes == [200] * 6 and s.ui.state == "ready" and len(builds) == 1
        assert httpx.get(s.url + "/web/config", timeout=30).json()["title"] == "swe_gym_env"
    finally:
        s.stop()


def test_a_failed_build_is_a_503_with_the_reason_and_the_next_visit_builds(tmp_path, monkeypatch, capfd):
    real = ui_module._mounted_on_a_holder
    calls = []

    def broken(service):
        calls.append(1)
        if len(calls) == 1:
            raise ImportError("gradio is broken here")
        return real(service)

    monkeypatch.setattr(ui_module, "_mounted_on_a_holder", broken)
    s = InProcess(tmp_path / "results")
    try:
        r = httpx.get(s.url + "/web/", timeout=120)
        assert r.status_code == 503 and "could not start: ImportError: gradio is broken here" in r.text
        assert s.ui.state == "on first visit"
        assert "the UI at /web could not start: ImportError('gradio is broken here')" in capfd.readouterr().err
        assert httpx.get(s.url + "/web/", timeout=120).status_code == 200 and len(calls) == 2
    finally:
        s.stop()


def test_an_exposed_server_builds_its_ui_with_no_visit(tmp_path, monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/swe-gym")
    s = InProcess(tmp_path / "results")
    try:
        deadline = time.monotonic() + 120
        while s.ui.state != "ready":
            assert time.monotonic() < deadline, s.ui.state
            time.sleep(0.1)
    finally:
        s.stop()


def test_a_server_stopped_mid_build_stops(tmp_path, monkeypatch):
    started = threading.Event()
    real = ui_module._mounted_on_a_holder

    def slow(service):
        started.set()
        time.sleep(2)
        return real(service)

    monkeypatch.setattr(ui_module, "_mounted_on_a_holder", slow)
    s = InProcess(tmp_path / "results")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        visit = pool.submit(httpx.get, s.url + "/web/", timeout=60)
        assert started.wait(30)
        s.stop()  # uvicorn waits for the open request, then the lifespan closes the UI
        assert visit.result().status_code in (200, 503)
