"""The deployed topology, end to end (issue #17): the Space image run the way a Space runs it, its sandboxes in HF Jobs.

- The Space: the built image (conftest `space_image`, built once per run) as uid 1000, no added capabilities,
  docker's default seccomp, secrets as environment variables (an env file, not argv), no engine configured (so it
  starts its built-in engine), and `SWE_GYM_PUBLIC_URL` its loopback URL: sandboxes reach `/capture` through it.
- HF: `tests/hf_emulator` (Jobs API + sandbox server protocol 3); the real huggingface_hub inside the Space talks
  to it (`HF_ENDPOINT`, a test CA, the job names resolved to loopback by the container's hosts file).
- All traffic stays on loopback: the Space, the emulator and every job container share the host's network
  namespace (no docker bridge).
Tasks: the `pypi` split (stand-in SWE-Gym images, repo at /testbed; the split's rows are mounted in).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conftest import CHROMIUM, CHROMIUM_ARGS, require
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from swe_gym_env.core import procs
from swe_gym_env.core.procs import free_port
from swe_gym_env.wire import RolloutResult

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow]

TASK = "uiri__toml-0.10.2"
TOKEN = "space-access-" + uuid.uuid4().hex
ROWS_IN_CONTAINER = "/home/user/pypi-rows.jsonl"
FAULTY_IN_CONTAINER = "/home/user/faulty-rows.jsonl"
ENGINE_DELAY_S = "0.5"  # the built-in engine's pause per call: long enough to see turns arrive, and to fault mid-agent


@dataclass
class Space:
    name: str
    port: int
    env_file: Path
    argv: list[str]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict:
        return httpx.get(f"{self.base}/health", timeout=10).json()

    def logs(self) -> str:
        r = subprocess.run(["docker", "logs", "--tail", "200", self.name], capture_output=True, text=True, timeout=120)
        return r.stdout[-6000:] + r.stderr[-6000:]

    def wait_healthy(self, timeout: float = 180) -> None:
        try:
            procs.wait_healthy(f"{self.base}/health", timeout=timeout, interval=0.5, name="the Space")
        except procs.NotReady as e:
            raise AssertionError(f"{e}:\n{self.logs()}") from e


def _faulty_rows(src: Path, dst: Path) -> None:
    """One row of the pypi split whose image does not exist (the fault: `the image does not exist`)."""
    row = next(json.loads(line) for line in src.read_text().splitlines() if TASK in line)
    row["instance_id"] = "missing__image-1"
    row["docker_image"] = "swe-gym-env-standin/does-not-exist:latest"
    dst.write_text(json.dumps(row) + "\n")


@pytest.fixture(scope="module")
def space(space_image, hf_emulator, tmp_path_factory) -> Iterator[Space]:
    from swe_gym_env.tasks.catalog import pypi_jsonl

    rows = pypi_jsonl()
    require(rows.is_file(), "the pypi split is not built: run `swe-gym-env setup --all`")
    tmp = tmp_path_factory.mktemp("space")
    faulty = tmp / "faulty.jsonl"
    _faulty_rows(rows, faulty)
    port = free_port()
    env_file = tmp / "space.env"  # secrets as the Space gets them: environment variables, never argv
    env = {
        "SWE_GYM_ACCESS_TOKEN": TOKEN,
        "SWE_GYM_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "PORT": str(port),
        "SWE_GYM_DATASETS": f"pypi={ROWS_IN_CONTAINER},faulty={FAULTY_IN_CONTAINER}",
        "SWE_GYM_ENGINE_DELAY_S": ENGINE_DELAY_S,
        "SWE_GYM_HF_POOL_SANDBOXES_PER_HOST": "8",
        "SWE_GYM_MAX_ROLLOUTS_HF": "16",
        "SWE_GYM_MAX_ROLLOUTS_HF_POOL": "16",
        "SWE_GYM_CONTEXT_WINDOW": "32768",
        **hf_emulator.container_env(),  # HF_ENDPOINT, the dummy HF_TOKEN, the emulator's CA
    }
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    os.chmod(env_file, 0o644)
    name = f"swegym-space-{port}"
    argv = [
        "docker", "run", "-d", "--name", name,
        "--network", "host",  # loopback only: shares the host's namespace with the emulator and the job containers
        "--user", "1000",  # as a Space runs it: no added capabilities, docker's default seccomp profile
        "--env-file", str(env_file),
        "-v", f"{rows}:{ROWS_IN_CONTAINER}:ro",
        "-v", f"{faulty}:{FAULTY_IN_CONTAINER}:ro",
        *hf_emulator.container_mounts(),
        space_image,
    ]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    s = Space(name, port, env_file, argv)
    try:
        s.wait_healthy()
        yield s
    finally:
        # as a Space stops: SIGTERM, then the server's shutdown closes its pools (their host jobs are cancelled)
        subprocess.run(["docker", "stop", "-t", "90", name], capture_output=True, timeout=180)
        logs = s.logs()
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
        assert _running_jobs(hf_emulator) == [], f"the Space left HF jobs running:\n{logs}"


def _running_jobs(hf_emulator) -> list[str]:
    """Jobs of the emulator still running (the pool hosts finish by their idle timeout; reaped here if still up)."""
    return [j["id"] for j in hf_emulator.jobs(stage="RUNNING")]


def mcp(space: Space, token: str | None = TOKEN) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(StreamableHttpTransport(f"{space.base}/mcp", headers=headers), timeout=900)


async def rollout(space: Space, **fields) -> RolloutResult:
    args = {"split": "pypi", "instance_id": TASK, "harness": "pi", "deadline_s": 600, **fields}
    args.setdefault("result_form", "compact")  # the whole result over MCP (a short rollout: it fits)
    async with mcp(space) as c:
        res = await c.call_tool("run_rollout", args, raise_on_error=False, timeout=900)
    assert not res.is_error, res.content
    return RolloutResult.model_validate(res.structured_content)


def assert_solved(r: RolloutResult) -> None:
    assert r.ok, f"{r.phase}: {r.error}"
    assert r.reward == 1.0, (r.reward, r.tests)
    assert r.cross_check == "match", r.cross_check_detail


def pool_hosts(hf_emulator) -> list[dict]:
    """The emulator's pool host jobs still running (the SDK labels them with the pool mode)."""
    return [j for j in hf_emulator.jobs(stage="RUNNING") if (j.get("labels") or {}).get("hf-sandbox-mode") == "pool"]


def jobs_of(hf_emulator, rollout_id: str) -> list[dict]:
    """The emulator's jobs whose labels name this rollout (dedicated `hf` sandboxes carry the rollout id)."""
    return [j for j in hf_emulator.jobs() if rollout_id in json.dumps(j.get("labels") or {})]


async def until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


def docker(*args: str) -> None:
    subprocess.run(["docker", *args], check=True, capture_output=True, timeout=120)


def status(space: Space, rid: str) -> dict:
    # reading a rollout needs the Space's access token (no SWE_GYM_PUBLIC_READS here)
    r = httpx.get(f"{space.base}/rollouts/{rid}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code in (200, 404), (r.status_code, r.text[:300])
    return r.json() if r.status_code == 200 else {}


def past_first_turn(s: dict, phases: tuple[str, ...] = ("agent",)) -> bool:
    """A rollout's status (`status`): running, in one of `phases`, with at least one captured turn."""
    summary = s.get("summary") or {}
    return s.get("state") == "running" and summary.get("phase") in phases and (summary.get("turns") or 0) >= 1


def in_agent_with_turns(space: Space, rid: str) -> bool:
    return past_first_turn(status(space, rid))


# -- item 4: a fresh Space says what it can run ---------------------------------------------------------------------
def test_the_space_reports_what_it_can_run_from_real_probes(space):
    h = space.health()
    usable = {name: r["usable"] for name, r in h["sandboxes"].items()}
    assert usable["local"] is False, h["sandboxes"]["local"]  # bubblewrap cannot create namespaces in a Space
    assert "namespace" in h["sandboxes"]["local"]["reason"]
    assert usable["landlock"] and usable["hf"] and usable["hf-pool"], h["sandboxes"]
    assert h["default_sandbox"] == "landlock"
    assert h["engine"]["builtin"] is True and "NOT a model" in h["engine"]["note"]
    assert h["capacity"]["by_sandbox"]["hf-pool"]["max_rollouts"] == 16


# -- item 3: full rollouts through the containerised Space's /mcp ---------------------------------------------
async def test_pi_and_opencode_on_hf_and_on_hf_pool(space, hf_emulator):
    cases = [(h, b) for h in ("pi", "opencode") for b in ("hf", "hf-pool")]
    results = await asyncio.gather(*(rollout(space, harness=h, sandbox=b) for h, b in cases))
    for (h, b), r in zip(cases, results, strict=True):
        assert (r.harness, r.sandbox) == (h, b)
        assert_solved(r)
        assert r.turns and all(t.completion_token_ids for t in r.turns), "no token-level trace"


async def test_sixteen_concurrent_pool_rollouts_run_on_two_hosts(space, hf_emulator):
    before = {j["id"] for j in hf_emulator.jobs()}
    t0 = time.monotonic()
    results = await asyncio.gather(*(rollout(space, sandbox="hf-pool") for _ in range(16)))
    wall = time.monotonic() - t0
    for r in results:
        assert_solved(r)
    hosts = {j["id"] for j in pool_hosts(hf_emulator)}
    assert len(hosts) == 2, hosts  # sandboxes_per_host=8: 16 at once fill exactly two (warm ones reused)
    assert len(hosts - before) <= 2
    figures = {"rollouts": 16, "wall_s": round(wall, 1), "rollouts_per_min": round(16 * 60 / wall, 2)}
    print("DEPLOYED_POOL", json.dumps(figures))


# -- item 5: the UI against the containerised Space, in Chromium ------------------------------------------------
def _choose(page, elem_id: str, value: str) -> None:
    """Pick a value in a Gradio dropdown the way a user does: open it, type, click the option."""
    box = page.locator(f"#{elem_id} input")
    box.click()
    box.fill(value)
    page.get_by_role("option", name=value, exact=True).click()


def test_ui_runs_a_pool_rollout_live_and_refuses_a_tokenless_browser(space):
    from playwright.sync_api import sync_playwright

    require(CHROMIUM.exists(), "chromium missing: run scripts/setup_ui.sh")
    with sync_playwright() as p:  # its own event loop, closed before the async tests that follow
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            _ui_run(browser, space)
        finally:
            browser.close()


def _ui_run(browser, space: Space) -> None:
    stranger = browser.new_context()  # a second browser without the access token
    page = stranger.new_page()
    page.goto(space.base + "/web/")
    page.get_by_role("tab", name="Run").click()
    page.click("#run-button")
    page.wait_for_selector("#panel-message:has-text('access token required')")
    stranger.close()
    assert space.health()["rollouts_in_flight"] == 0

    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.goto(space.base + "/web/")
    page.get_by_role("tab", name="Run").click()
    _choose(page, "run-split", "pypi")
    _choose(page, "run-task", TASK)
    _choose(page, "run-sandbox", "hf-pool")
    page.fill("#run-token input", TOKEN)
    page.click("#run-button")
    page.wait_for_function(  # turns arrive while the rollout runs
        """() => { const s = document.querySelector('#run-state');
                   return s && s.dataset.state === 'running' && parseInt(s.dataset.turns) >= 1; }""",
        timeout=300_000,
    )
    assert page.locator("#run-conversation .sg-turn").count() >= 1
    page.wait_for_selector("#run-state[data-state='finished']", timeout=600_000)
    reward = page.locator("#run-result .sg-reward")
    assert reward.get_attribute("data-reward") == "1", page.inner_text("#run-result")
    assert "cross-check: match" in page.inner_text("#run-result")
    assert TOKEN not in page.content()
    ctx.close()


# -- item 6: faults through the emulator --------------------------------------------------------------------------
async def _fault_mid_agent(space: Space, hf_emulator, fault: str, sandbox: str = "hf") -> tuple[RolloutResult, str]:
    """Start a rollout, wait for the agent's first captured turn, apply `fault` to its sandbox's job; returns the
    result and the job id. Afterwards no job of this rollout may be left running."""
    rid = uuid.uuid4().hex
    running = asyncio.create_task(rollout(space, rollout_id=rid, sandbox=sandbox))
    try:
        await until(lambda: in_agent_with_turns(space, rid), 300, "the agent's first turn")
        (job,) = [j for j in jobs_of(hf_emulator, rid) if j["stage"] == "RUNNING"]
        if fault == "cancel":
            async with mcp(space) as c:
                assert (await c.call_tool("cancel_rollout", {"rollout_id": rid})).data is True
        else:
            getattr(hf_emulator, f"{fault}_job")(job["id"])
        result = await asyncio.wait_for(running, 600)
    finally:
        running.cancel()
    await until(lambda: not [j for j in jobs_of(hf_emulator, rid) if j["stage"] == "RUNNING"], 120, "no job left")
    return result, job["id"]


async def test_image_that_does_not_exist(space, hf_emulator):
    for sandbox in ("hf", "hf-pool"):
        r = await rollout(space, split="faulty", instance_id="missing__image-1", sandbox=sandbox)
        assert not r.ok and r.phase == "boot", (sandbox, r.phase, r.error)
        assert "does-not-exist" in (r.error or ""), r.error
    assert not [j for j in hf_emulator.jobs(stage="RUNNING") if "does-not-exist" in json.dumps(j)]


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("kill", "ERROR"),  # the job dies mid-agent
        ("pause", "stopped answering"),  # the sandbox server stops answering
        ("expire", "COMPLETED"),  # its idle timeout fires
        ("cancel", "cancelled"),  # the caller cancels
    ],
)
async def test_fault_mid_agent(space, hf_emulator, fault, says):
    for _ in range(3):  # the oracle's two calls can end before the fault lands: its sandbox was done, the rollout ok
        r, job = await _fault_mid_agent(space, hf_emulator, fault)
        if not r.ok:
            break
    assert not r.ok and r.reward is None, "the fault never landed while the rollout used its sandbox (3 tries)"
    # the oracle needs two model calls: on a loaded machine the fault can land after its last turn, while the
    # rollout reads its diff from the same sandbox; either way the sandbox's failure ends it, named
    assert r.phase in ("agent", "diff"), (r.phase, r.error)
    assert says in (r.error or ""), r.error
    if fault != "cancel":
        assert job in (r.error or ""), f"the error does not name the job: {r.error}"


async def both_in_flight(space: Space, rids: list[str], timeout: float) -> bool:
    """Wait until every rollout is running past its first turn at once (True); False as soon as one has finished
    before that (on a loaded machine one rollout can boot minutes after the other)."""
    end = time.monotonic() + timeout
    while True:
        states = await asyncio.to_thread(lambda: [status(space, rid) for rid in rids])
        if all(past_first_turn(s, ("agent", "diff", "grade")) for s in states):
            return True
        if any(s.get("state") == "finished" for s in states):
            return False
        if time.monotonic() > end:
            summaries = [s.get("summary") or {} for s in states]
            shown = [(s.get("state"), m.get("phase"), m.get("turns")) for s, m in zip(states, summaries, strict=True)]
            raise AssertionError(f"timed out ({timeout:.0f} s) waiting for both past their first turn: {shown}")
        await asyncio.sleep(0.5)


async def test_server_killed_mid_rollout_and_restarted(space, hf_emulator):
    for _ in range(3):  # both must be in flight when the server dies: a pair where one ended first is tried again
        rids = {sandbox: uuid.uuid4().hex for sandbox in ("hf", "hf-pool")}
        running = [asyncio.create_task(rollout(space, rollout_id=rid, sandbox=b)) for b, rid in rids.items()]
        try:
            # both at once, anywhere from their first turn to their grade (one at a time missed the second's agent
            # phase on a quiet machine: it had finished while the first was awaited)
            if not await both_in_flight(space, list(rids.values()), 600):
                await asyncio.gather(*running, return_exceptions=True)
                continue
            await asyncio.to_thread(docker, "kill", space.name)
            await asyncio.gather(*running, return_exceptions=True)  # the callers see their connection drop
            await asyncio.to_thread(docker, "start", space.name)
            await asyncio.to_thread(space.wait_healthy)
            break
        finally:
            for t in running:
                t.cancel()
    else:
        pytest.fail("in 3 tries, one rollout always finished before the other was past its first turn")
    for rid in rids.values():
        s = status(space, rid)
        assert s["state"] == "finished" and s["result"]["ok"] is False, s
        # the phase it was in when the server died (the first one may have reached its diff by then)
        assert s["result"]["phase"] in ("agent", "diff", "grade"), s["result"]
        assert f"server_restarted: the server stopped in phase '{s['result']['phase']}'" in s["result"]["error"]
    # the restarted server reaps what the killed one left in HF: its dedicated sandbox and its pool's hosts
    await until(lambda: not hf_emulator.jobs(stage="RUNNING"), 180, "the dead server's jobs reaped")
