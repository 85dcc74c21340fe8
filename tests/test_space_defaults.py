"""A fresh Space works out of the box: sandbox backends usable only after a real probe here (cached, time-bounded),
the default sandbox is the first usable one (else an error naming what to configure), `serve` with no engine runs the
built-in engine (said to be NOT a model) and answers a rollout, and /health reports capacity."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, require

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.core import procs
from swe_gym_env.core.assets import task_runtime_dir
from swe_gym_env.server.capture import CaptureProxy
from swe_gym_env.server.engine import builtin
from swe_gym_env.server.rollout import RolloutService, ServerConfig
from swe_gym_env.server.sandbox import local
from swe_gym_env.server.sandbox import preflight as pf
from swe_gym_env.server.sandbox.errors import SandboxUnavailable
from swe_gym_env.wire import AUTO_SANDBOX, RolloutRequest

from helpers import ME, STARTUP_S

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def fresh_probes():
    """Each test sees (and leaves) no cached probe results: probes are per process, tests share one."""
    pf._cache.clear()
    local.bwrap_works.cache_clear()
    yield
    pf._cache.clear()
    local.bwrap_works.cache_clear()


def results(**usable: bool) -> dict[str, dict]:
    return {n: {"usable": usable.get(n, False), "reason": f"{n} probe said so"} for n in pf.ordered()}


def fake_probes(monkeypatch, cache: dict[str, dict]) -> None:
    """Probe results as if run in the environment as it is now (probes run again once it changes)."""
    monkeypatch.setattr(pf, "_cache", cache)
    monkeypatch.setattr(pf, "_cache_env", pf._probe_env())


# -- the probes are real, per process, bounded -----------------------------------------------------------------------
def test_local_is_usable_here_only_because_bwrap_ran_a_sandbox():
    require(shutil.which("bwrap") is not None, "bubblewrap missing")
    require((task_runtime_dir() / ".ready").is_file(), "task runtime not prepared: run `swe-gym-env setup`")
    found = pf.preflight_all()
    assert list(found) == pf.ordered() and pf.ordered()[:4] == ["local", "landlock", "docker", "hf"]
    assert local.bwrap_works.cache_info().currsize == 1  # the probe ran bwrap (namespaces + `true`), it did not guess
    assert (local.bwrap_works() is None) == found["local"]["usable"], found["local"]
    if os.geteuid() == 0:  # CI and this machine run as root on a host kernel: bubblewrap works
        assert found["local"]["usable"] and found["local"]["reason"].startswith("bwrap"), found["local"]


def test_a_bwrap_that_cannot_create_namespaces_makes_local_unusable(tmp_path, monkeypatch):
    """The Space image's case (bwrap installed, no namespaces allowed), with a bwrap that fails like it does there."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    found = pf.preflight("local")
    assert not found["usable"] and "No permissions to create new namespace" in found["reason"], found
    assert "bwrap cannot create its sandbox here" in found["reason"]


def test_probes_run_once_per_process_and_a_hung_one_is_cut_off(monkeypatch):
    calls: list[str] = []

    def slow() -> tuple[bool, str]:
        calls.append("local")
        time.sleep(2)
        return True, "too late"

    monkeypatch.setattr(local.LocalSandbox, "preflight", staticmethod(slow))
    monkeypatch.setattr(pf, "PROBE_TIMEOUT_S", 0.3)
    t = time.monotonic()
    first = pf.preflight_all()
    assert time.monotonic() - t < 1.5, "the probes were not bounded"
    assert not first["local"]["usable"] and "did not finish within" in first["local"]["reason"]
    t = time.monotonic()
    assert pf.preflight_all() == first and time.monotonic() - t < 0.1  # cached: no second probe
    assert calls == ["local"]


async def test_probe_all_keeps_the_event_loop_free(monkeypatch):
    def slow() -> tuple[bool, str]:
        time.sleep(0.5)
        return True, "slow but fine"

    monkeypatch.setattr(local.LocalSandbox, "preflight", staticmethod(slow))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    found = await pf.probe_all()
    ticker.cancel()
    assert found["local"] == {"usable": True, "reason": "slow but fine"} and ticks >= 10


# -- the default sandbox ---------------------------------------------------------------------------------------------
def test_the_default_is_the_first_usable_backend_in_order():
    assert pf.default_sandbox(results(local=True, landlock=True)) == "local"
    assert pf.default_sandbox(results(landlock=True, docker=True, hf=True)) == "landlock"  # the Space image
    assert pf.default_sandbox(results(hf=True, docker=True)) == "docker"
    assert pf.default_sandbox(results(hf=True)) == "hf"


def test_with_no_usable_backend_the_error_names_what_to_configure():
    with pytest.raises(SandboxUnavailable) as e:
        pf.default_sandbox(results())
    msg = str(e.value)
    assert "no sandbox backend is usable here" in msg
    assert "for `hf`: set HF_TOKEN and SWE_GYM_PUBLIC_URL" in msg
    assert all(f"{n}: {n} probe said so" in msg for n in pf.ordered())  # and why each one is not
    assert pf.resolved(results()) is None


async def test_a_request_naming_no_sandbox_runs_on_the_first_usable_one(monkeypatch):
    assert RolloutRequest().sandbox == AUTO_SANDBOX  # the wire default: the server decides
    fake_probes(monkeypatch, results(landlock=True, docker=True))
    service = RolloutService(ServerConfig(engines={}), CaptureProxy())
    auto = service.submit(RolloutRequest())
    named = service.submit(RolloutRequest(sandbox="docker"))
    assert auto.request.sandbox == "landlock" and named.request.sandbox == "docker"  # a named backend is kept
    for rec in (auto, named):  # no engine configured: each fails fast, on the backend it was given
        assert rec.task is not None
        result = await asyncio.wait_for(rec.task, 60)
        assert not result.ok and result.sandbox == rec.request.sandbox, result


async def test_a_request_naming_no_sandbox_fails_clearly_when_none_is_usable(monkeypatch):
    fake_probes(monkeypatch, results())
    service = RolloutService(ServerConfig(engines={}), CaptureProxy())
    rec = service.submit(RolloutRequest())
    assert rec.task is None and rec.result is not None and rec.state == "finished"
    r = rec.result
    assert not r.ok and r.phase == "validate" and "no sandbox backend is usable here" in (r.error or "")
    assert "set HF_TOKEN and SWE_GYM_PUBLIC_URL" in (r.error or "")


async def test_the_web_banner_says_the_builtin_engine_is_not_a_model_and_which_sandboxes_work(monkeypatch):
    from swe_gym_env.ui.app import _banner_html

    monkeypatch.setattr(builtin, "running_policy", None)
    fake_probes(monkeypatch, results(landlock=True))
    html = await _banner_html()
    assert "engine-banner" not in html and "runs on <code>landlock</code>" in html
    assert 'data-sandbox="local" data-usable="false"' in html and 'data-sandbox="landlock" data-usable="true"' in html
    monkeypatch.setattr(builtin, "running_policy", "oracle")  # as `serve` with no engine configured
    fake_probes(monkeypatch, results())
    html = await _banner_html()
    assert 'id="engine-banner"' in html and "NOT a model" in html
    assert "no sandbox backend is usable here" in html and "HF_TOKEN and SWE_GYM_PUBLIC_URL" in html


# -- `serve` with no engine configured, as a fresh Space starts ------------------------------------------------------
@dataclass
class Served:
    proc: subprocess.Popen
    base: str
    log: Path


@contextlib.contextmanager
def serving(data: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """`serve` as a process on a free port, with no engine in its environment unless `extra` names one."""
    port = procs.free_port()
    log = data / "serve.log"
    clean = {k: v for k, v in os.environ.items() if k != "SWE_GYM_ENGINE_URL"}
    full = {**clean, "SWE_GYM_UI": "0", "SWE_GYM_DATA_DIR": str(data), **(env or {})}
    with open(log, "w") as out:
        proc = subprocess.Popen([*ME, "serve", "--port", str(port), *extra], env=full, stdout=out, stderr=out)
    try:
        procs.wait_healthy(f"http://127.0.0.1:{port}/health", proc, STARTUP_S)
        yield Served(proc, f"http://127.0.0.1:{port}", log)
    finally:
        procs.stop(proc)


@pytest.fixture(scope="module")
def no_engine_server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("fresh"), env={"SWE_GYM_MAX_ROLLOUTS": "3", "SWE_GYM_UI": "1"}) as s:
        yield s


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_serve_with_no_engine_runs_the_builtin_one_and_answers_a_rollout(no_engine_server):
    async with httpx.AsyncClient(base_url=no_engine_server.base, timeout=30) as http:
        health = (await http.get("/health")).json()
        assert health["engine"]["builtin"] is True and "NOT a model" in health["engine"]["note"]
        default = health["default_sandbox"]
        assert default and health["sandboxes"][default]["usable"], health["sandboxes"]
        assert health["capacity"] | {"by_sandbox": None} == {
            "max_rollouts": 3, "in_flight": 0, "free": 3, "by_sandbox": None
        }  # fmt: skip
        assert "NOT a model" in await asyncio.to_thread(no_engine_server.log.read_text)  # the startup banner

        async with SweGymClient(f"{no_engine_server.base}/mcp") as c:
            run = asyncio.create_task(c.run_rollout(harness="pi"))  # no sandbox, no engine named
            busy = None
            for _ in range(600):
                cap = (await http.get("/health")).json()["capacity"]
                if cap["in_flight"] == 1:
                    busy = cap
                    break
                await asyncio.sleep(0.05)
            result = await run
        assert busy == {"max_rollouts": 3, "in_flight": 1, "free": 2, "by_sandbox": busy and busy["by_sandbox"]}
        assert busy["by_sandbox"][default] == {"max_rollouts": 3, "in_flight": 1, "free": 2}
        assert result.ok, result.error
        assert result.sandbox == default and result.reward == 1.0 and len(result.turns) >= 1
        after = (await http.get("/health")).json()["capacity"]
        assert (after["in_flight"], after["free"]) == (0, 3)


@pytest.mark.integration
@pytest.mark.slow
async def test_web_says_the_builtin_engine_is_not_a_model(no_engine_server):
    require(CHROMIUM.exists(), "chromium missing: run scripts/setup_ui.sh")
    from playwright.async_api import async_playwright  # async: the sync API's loop would outlive this test

    async with httpx.AsyncClient(timeout=30) as http:
        default = (await http.get(f"{no_engine_server.base}/health")).json()["default_sandbox"]
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = await browser.new_page()
            await page.goto(f"{no_engine_server.base}/web/")
            banner = page.locator("#engine-banner")
            await banner.wait_for(timeout=60_000)
            assert "NOT a model" in await banner.inner_text()
            usable = page.locator(f'#sandbox-banner li[data-sandbox="{default}"][data-usable="true"]')
            assert await usable.count() == 1
            assert f"runs on {default}" in await page.locator("#sandbox-banner").inner_text()
        finally:
            await browser.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_a_configured_engine_that_does_not_answer_is_not_replaced(tmp_path):
    dead = f"http://127.0.0.1:{procs.free_port()}/v1"  # nothing listens there
    with serving(tmp_path, "--engine-url", dead) as served:
        async with httpx.AsyncClient(timeout=30) as http:
            health = (await http.get(f"{served.base}/health")).json()
        assert "engine" not in health and "built-in engine" not in await asyncio.to_thread(served.log.read_text)
        async with SweGymClient(f"{served.base}/mcp") as c:
            result = await c.run_rollout(harness="pi")
    assert not result.ok and result.capture_level == "unreachable", result
    assert (result.error or "").startswith("engine unreachable"), result.error  # the configured one, not ours


# -- the Space image: uid 1000 under docker's default seccomp, where bubblewrap cannot create namespaces -------------
@pytest.mark.integration
@pytest.mark.slow
def test_in_the_space_image_local_is_unusable_landlock_is_the_default_and_hf_needs_only_config(space_image):
    argv = ["docker", "run", "--rm", "--user", "1000", "--network", "none"]
    argv += ["-e", "HF_TOKEN=hf_dummy_not_a_token", "-e", "SWE_GYM_PUBLIC_URL=https://example.invalid"]
    r = subprocess.run([*argv, space_image, "swe-gym-env", "info"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout)
    sandboxes = info["sandboxes"]
    assert not sandboxes["local"]["usable"] and "No permissions to create new namespace" in sandboxes["local"]["reason"]
    assert sandboxes["landlock"]["usable"], sandboxes["landlock"]
    assert sandboxes["hf"]["usable"], sandboxes["hf"]  # SDK + token + public URL: no network call (none here)
    assert info["default_sandbox"] == "landlock"  # before hf in the order: no job is billed by default


@pytest.fixture
def fresh_space(space_image, tmp_path):
    """The image as a Space runs it (uid 1000, no added capabilities, docker's default seccomp, $PORT), with no
    engine and no sandbox configured; its base URL."""
    port, name = procs.free_port(), f"swe-gym-fresh-space-{os.getpid()}"
    argv = ["docker", "run", "--rm", "--name", name, "--user", "1000", "--network", "host", "-e", f"PORT={port}"]
    argv += ["-e", "SWE_GYM_OPEN_ACCESS=1"]  # as `push --open` makes it: with no secret, a Space is otherwise locked
    with open(tmp_path / "space.log", "w") as log:
        proc = subprocess.Popen([*argv, space_image], stdout=log, stderr=log)
    try:
        procs.wait_healthy(f"http://127.0.0.1:{port}/health", proc, STARTUP_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
        procs.stop(proc)


@pytest.mark.integration
@pytest.mark.slow
async def test_a_fresh_space_answers_its_first_rollout_with_nothing_configured(fresh_space):
    """A visitor's rollout naming nothing runs on landlock (bubblewrap cannot run there) with the built-in engine."""
    async with httpx.AsyncClient(timeout=30) as http:
        health = (await http.get(f"{fresh_space}/health")).json()
    assert health["default_sandbox"] == "landlock" and health["engine"]["builtin"], health
    assert health["capacity"]["free"] == health["capacity"]["max_rollouts"] > 0
    async with SweGymClient(f"{fresh_space}/mcp") as c:
        result = await c.run_rollout()
    assert result.ok, result.error
    assert result.sandbox == "landlock" and result.harness == "pi" and result.reward == 1.0


def test_probes_run_again_when_what_they_read_changes(tmp_path, monkeypatch):
    """A cache root without the task runtime makes `local` unusable; the real one, restored, makes it usable again
    (a test that pointed SWE_GYM_ENV_HOME elsewhere once left `local` unusable for the rest of its worker)."""
    if not pf.preflight("local")["usable"]:
        pytest.skip("local is not usable on this machine")
    with monkeypatch.context() as m:
        m.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "empty-home"))
        found = pf.preflight("local")
        assert not found["usable"] and "task runtime missing" in found["reason"], found
    assert pf.preflight("local")["usable"]
