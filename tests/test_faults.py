"""Fault injection, whole rollouts: a real server process, the real Pi CLI in real bubblewrap, real grading, and a
fault-injecting engine (tests/hostile_engine.py) in front of the built-in one.

Each fault must come back as a result (never an exception): ``ok=False``, the phase it happened in, a specific
error, ``reward=None`` where grading did not run — and afterwards the server holds nothing more than before
(child processes, sandbox/temp dirs, cgroups, open capture sessions, rollouts in flight, open sockets: tests/leaks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import require
from leaks import Snapshot, owned_temp, processes_mentioning, wait_no_leaks

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.core.assets import tokenizer_file
from swe_gym_env.core.procs import free_port, wait_healthy
from swe_gym_env.server.agents.base import AgentConfig
from swe_gym_env.server.agents.bundle import find_bundle
from swe_gym_env.server.agents.harnesses.mini_swe_agent import MiniSweAgentHarness
from swe_gym_env.server.agents.harnesses.pi import PiHarness
from swe_gym_env.server.agents.registry import HARNESSES
from swe_gym_env.server.agents.verdict import RunFacts, classify_failure
from swe_gym_env.server.engine.app import Engine, create_engine_app
from swe_gym_env.server.engine.certify import PROBE
from swe_gym_env.server.engine.chat import ChatRenderer
from swe_gym_env.server.engine.policy import OraclePolicy
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import BUNDLED_DIR, get_task

from helpers import MODEL, Served, Stack, rows_match_export

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]

HOSTILE = Path(__file__).resolve().parent / "hostile_engine.py"
GRADING_TIMEOUT_S = 8
HANG_DEADLINE_S = 60.0  # a hang before the first byte: the stall clock must end it within the agent's share (48 s)
STALL_TIMEOUT_S = 10  # the server's stall timeout here: a silent engine stream ends its call after this long (2 s,
# then 5 s, were too short for an honest engine's first call on 2 cores saturated by the suite's 4 workers)
MIDSTREAM_DEADLINE_S = 180.0  # a stall mid-stream: without the stall clock the agent's share (80%, 144 s) runs out
STALLED_BY_S = 100.0  # with it the rollout ends before this: agent start-up and its first call take ~30-55 s here
SHORT_CONTEXT = 2048  # the short engine's context: below every harness's floor (min_context_tokens)


class HostileEngine:
    """tests/hostile_engine.py as a subprocess; its fault is switched per test."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(HOSTILE), "--port", str(self.port)])
        wait_healthy(self.url("/health"), self.proc)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def set(self, mode: str, after: int = 0, delay_s: float = 0.0) -> None:
        r = httpx.post(self.url("/fault"), json={"mode": mode, "after": after, "delay_s": delay_s}, timeout=10)
        r.raise_for_status()

    def state(self) -> dict:
        return httpx.get(self.url("/fault"), timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class ShortEngine(Engine):
    """The built-in engine serving a context shorter than any harness needs (in this process, named by a rollout's
    ``engine_url``); it counts the agent calls it gets (every chat call but certification's probe)."""

    def __init__(self) -> None:
        super().__init__(ChatRenderer(tokenizer_file()), OraclePolicy(), MODEL, max_model_len=SHORT_CONTEXT)
        self.agent_calls = 0

    async def chat(self, request):
        body = await request.json()  # read once: the request keeps it for the engine's own read
        if not (isinstance(body, dict) and body.get("messages") == PROBE):
            self.agent_calls += 1
        return await super().chat(request)


def batchtools_row() -> dict:
    return json.loads((BUNDLED_DIR / "tasks.jsonl").read_text().splitlines()[0])


HANG_TEST = "import time\n\n\ndef test_hang():\n    time.sleep(3600)\n"


def blocking_repo(root: Path) -> Path:
    """A local clone of batchtools whose base tree object is a FIFO: reading it blocks forever (like a stuck network
    mount), so preparing a sandbox from it hangs."""
    bundle = BUNDLED_DIR / batchtools_row()["repo_source"]
    repo, packs = root / "blocking-repo", root / "packs"
    packs.mkdir()
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", "--bare", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "fetch", "-q", str(bundle), "refs/*:refs/*"], check=True)
    for pack in (repo / "objects" / "pack").iterdir():
        pack.rename(packs / pack.name)
    for pack in packs.glob("*.pack"):
        with pack.open("rb") as f:
            subprocess.run([*git, "-C", str(repo), "unpack-objects", "-q"], stdin=f, check=True)
    tree = subprocess.run(
        [*git, "-C", str(repo), "rev-parse", batchtools_row()["base_commit"] + "^{tree}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    obj = repo / "objects" / tree[:2] / tree[2:]
    obj.unlink()
    os.mkfifo(obj)
    return obj


def release_fifo(fifo: Path) -> None:
    """Give any reader still blocked on the FIFO an end of file (open for writing fails when there is none)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def fault_split(path: Path, blocking: Path) -> Path:
    base = batchtools_row()
    base["repo_source"] = str(BUNDLED_DIR / base["repo_source"])
    hang_patch = (
        "diff --git a/tests/test_hang.py b/tests/test_hang.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/test_hang.py\n@@ -0,0 +1,5 @@\n" + "".join(f"+{line}\n" for line in HANG_TEST.splitlines())
    )
    rows = [
        {**base, "instance_id": "boot-fails", "repo_source": str(path.parent / "no-such-repo.bundle")},
        {**base, "instance_id": "boot-hangs", "repo_source": str(blocking)},
        {
            **base,
            "instance_id": "grade-hangs",
            "patch": "",
            "test_patch": hang_patch,
            "FAIL_TO_PASS": ["tests/test_hang.py::test_hang"],
            "PASS_TO_PASS": [],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def stop(stack: Stack) -> None:
    """Stop the stack's processes; one that ignores SIGTERM for 30 s is killed (and the test says so)."""
    stubborn = []
    for p in stack.procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                stubborn.append(p.args)
                p.kill()
                p.wait(10)
    assert not stubborn, f"did not stop within 30 s of SIGTERM: {stubborn}"


class Bed:
    def __init__(self, engine: HostileEngine, stack: Stack, short: ShortEngine, short_url: str) -> None:
        self.engine, self.stack = engine, stack
        self.short, self.short_url = short, short_url  # the short engine, and its URL (…/v1)

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.stack.server_port}/health"

    def snapshot(self) -> Snapshot:
        return Snapshot.take(self.stack.server.pid, self.health_url)

    async def rollout(self, mode: str, after: int = 0, delay_s: float = 0.0, harness: str = "pi", **fields):
        """One rollout over MCP under a fault; asserts nothing leaked afterwards."""
        self.engine.set(mode, after, delay_s)
        before = self.snapshot()
        deadline = fields.setdefault("deadline_s", 240.0)
        async with asyncio.timeout(deadline + 120):
            async with SweGymClient(self.stack.mcp_url) as c:
                result = await c.run_rollout(harness=harness, **fields)
        problems = await asyncio.to_thread(wait_no_leaks, before, self.health_url)
        assert not problems, f"leaked after {mode}: {problems}; result: {result.error}"
        if result.capture_session_id:
            await rows_match_export(self.stack, result)
        return result


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    data = tmp_path_factory.mktemp("faults")
    fifo = blocking_repo(data)
    engine = HostileEngine()
    short = ShortEngine()
    served_short = Served(create_engine_app(short))
    short_url = served_short.__enter__() + "/v1"
    env = {
        "SWE_GYM_DATA_DIR": str(data),
        "SWE_GYM_DATASETS": f"faults={fault_split(data / 'faults.jsonl', fifo.parents[2])}",
        "SWE_GYM_GRADING_TIMEOUT_S": str(GRADING_TIMEOUT_S),
        "SWE_GYM_STALL_TIMEOUT_S": str(STALL_TIMEOUT_S),
        "SWE_GYM_UI": "0",
        "SWE_GYM_ENGINE_URL_ALLOWLIST": short_url,  # a rollout may name the short engine
    }
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env=env)
    try:
        yield Bed(engine, stack, short, short_url)
    finally:
        engine.stop()
        served_short.__exit__(None, None, None)
        release_fifo(fifo)
        stop(stack)


def failed(result, phase: str, *needles: str) -> None:
    assert not result.ok, f"expected a failure in {phase}, got ok (reward {result.reward})"
    assert result.phase == phase, f"phase {result.phase}: {result.error}"
    assert result.reward is None and result.grading is None
    for needle in needles:
        assert needle in (result.error or ""), f"{needle!r} not in error: {result.error}"


# -- the engine misbehaves ------------------------------------------------------------------------------------
async def test_control_an_honest_engine_gives_an_ok_rewarded_rollout(bed):
    result = await bed.rollout("ok")
    assert result.ok and result.reward == 1.0, result.error
    assert bed.engine.state()["probes"] >= 0


def engine_failed(result, *needles: str) -> None:
    """Failed calls the agent did not recover from: ok=false in phase agent, with a warning finding per failure."""
    failed(result, "agent", "engine_failures", *needles)
    assert result.stop_reason == "engine_failures"
    assert any(f.code == "engine_failure" and f.severity == "warning" for f in result.findings)


async def test_engine_http_500(bed):
    result = await bed.rollout("http500")
    engine_failed(result, "engine answered HTTP 500", "injected fault")
    assert result.turns == [] and bed.engine.state()["faulted"] >= 1


@pytest.fixture(params=["pi", "mini-swe-agent"])
def harness(request) -> str:
    """The faults every harness family must come out of the same way: Pi (Node, streaming) and mini-swe-agent (its
    own Python, litellm, non-streaming calls)."""
    if request.param == "mini-swe-agent":
        require(find_bundle(MiniSweAgentHarness()) is not None, "run `swe-gym-env setup --harness mini-swe-agent`")
    return request.param


async def test_engine_500_after_the_first_call_is_not_a_budget_exhausted_row(bed, harness):
    # before: the failed calls used up Pi's call budget and the rollout ended ok, reward 0.0, budget_exhausted
    result = await bed.rollout("http500", after=1, max_model_calls=6, harness=harness)
    engine_failed(result, "engine answered HTTP 500", "5 model calls in a row failed")
    assert len(result.turns) == 1 and result.sequences and not result.sequences[0].discarded


async def test_engine_hangs_before_answering(bed):
    result = await bed.rollout("hang_before", deadline_s=HANG_DEADLINE_S)
    engine_failed(result, f"nothing for {STALL_TIMEOUT_S}s")
    assert result.turns == []


async def test_engine_stalls_mid_stream_and_fails_well_before_the_deadline(bed, harness):
    # before: the rollout waited out its whole deadline. mini-swe-agent calls without streaming: the proxy still asks
    # the engine for a stream (and answers it whole), so the stall clock runs for it too
    result = await bed.rollout("hang_midstream", after=1, deadline_s=MIDSTREAM_DEADLINE_S, harness=harness)
    engine_failed(result, "engine stream stalled", f"nothing for {STALL_TIMEOUT_S}s")
    assert len(result.turns) == 1, "the call answered before the hang stays captured"
    assert result.wall_s < STALLED_BY_S, f"took {result.wall_s}s"


async def test_engine_streams_invalid_json(bed):
    result = await bed.rollout("invalid_json")
    engine_failed(result, "engine streamed a chunk that is not JSON")
    assert result.turns == []


async def test_engine_answers_html_instead_of_a_stream(bed):
    # Pi alone accepts an HTML body as an empty success (NOTES §3): the proxy must not.
    result = await bed.rollout("html")
    engine_failed(result, "text/html")


async def test_engine_returns_no_token_ids_in_a_tokens_session(bed):
    result = await bed.rollout("no_token_ids")
    engine_failed(result, "no prompt_token_ids")
    assert result.capture_level == "tokens" and result.turns == []


async def test_engine_that_stops_returning_ids_fails_the_rollout(bed, harness):
    # before: ok=True, reward 0.0, no finding. The oracle's edit is captured; its "done" never is
    result = await bed.rollout("no_token_ids", after=1, harness=harness)
    engine_failed(result, "no prompt_token_ids")
    assert len(result.turns) == 1
    assert any(f.code == "engine_stopped_ids" and f.severity == "fatal" for f in result.findings)


@pytest.mark.parametrize("name", ["opencode", "mini-swe-agent"])
async def test_engine_context_below_what_the_harness_needs_is_refused_before_boot(bed, name, request):
    # before: OpenCode compacted on its first call, never saw the task, and ended ok, reward 0.0, budget_exhausted.
    # OpenCode's floor is above the bed's engine's 8192 tokens; mini-swe-agent's (4096) is not: it gets the short one
    need = HARNESSES[name].min_context_tokens
    if name == "opencode":
        request.getfixturevalue("need_opencode")
        result = await bed.rollout("ok", harness=name)
        context, calls = 8192, lambda: bed.engine.state()["agent_calls"]
    else:
        require(find_bundle(MiniSweAgentHarness()) is not None, "run `swe-gym-env setup --harness mini-swe-agent`")
        result = await bed.rollout("ok", harness=name, engine_url=bed.short_url)
        context, calls = SHORT_CONTEXT, lambda: bed.short.agent_calls
    assert context < need
    failed(result, "validate", f"context is {context} tokens, below the {need} that {name} needs")
    assert result.turns == [] and calls() == 0


# -- the agent misbehaves -------------------------------------------------------------------------------------
async def test_agent_crashes(bed):
    result = await bed.rollout("crash_agent")
    failed(result, "agent", "agent_crashed", "exit code 137")
    assert result.agent_exit_code == 137 and len(result.turns) == 1


async def test_agent_that_loops_is_stopped_by_the_budget_graded_and_ok(bed):
    result = await bed.rollout("loop", max_model_calls=4)
    assert result.ok, result.error
    assert result.stop_reason == "budget_exhausted" and len(result.turns) == 4
    assert result.reward == 0.0 and result.grading is not None
    assert bed.engine.state()["agent_calls"] == 4  # the budget reply never reached the engine


async def test_agent_that_never_calls_the_model(need_pi, tmp_path):
    """Pi makes its first model call whatever the task says, so through the server this cannot happen; Pi given
    an empty prompt exits 0 without calling. Real Pi, real sandbox, the pipeline's own classifier."""
    task = get_task()
    harness = PiHarness()
    spec = SandboxSpec(
        repo_source=task.repo_source or "",
        base_commit=task.base_commit,
        workdir=task.workdir,
        ro_mounts=harness.mounts(),
        labels={"role": "agent"},
        deadline_s=120,
    )
    cfg = AgentConfig(base_url="http://127.0.0.1:9/capture", model=MODEL, context_window=8192, max_tokens=256)
    async with asyncio.timeout(180):
        sbx = await create_sandbox("local", spec)
        try:
            for path, (data, mode) in harness.config_files(cfg, "sgk-unused", "").items():
                await sbx.write_file(path, data, mode)
            res = await sbx.exec(harness.command(cfg), timeout=90)
            outcome = harness.parse_events((await sbx.read_file(harness.events_path)).decode())
        finally:
            await sbx.close()
    assert res.exit_code == 0 and outcome.model_calls == 0
    facts = RunFacts(exit_code=res.exit_code, timed_out=res.timed_out, timeout_s=90, calls=0)
    verdict = classify_failure(outcome, facts)
    assert verdict is not None and verdict[0] == "no_model_calls", verdict


# -- sandbox and grading --------------------------------------------------------------------------------------
async def test_sandbox_boot_fails(bed):
    result = await bed.rollout("ok", split="faults", instance_id="boot-fails")
    failed(result, "boot", "preparing the repository failed")
    assert result.turns == []


async def test_sandbox_boot_hangs_past_the_deadline(bed):
    t0 = time.monotonic()
    result = await bed.rollout("ok", split="faults", instance_id="boot-hangs", deadline_s=20.0)
    failed(result, "boot", "deadline of 20s exceeded during boot")
    assert result.stop_reason == "deadline" and time.monotonic() - t0 < 20 + 60


async def test_grading_times_out(bed):
    result = await bed.rollout("ok", split="faults", instance_id="grade-hangs")
    failed(result, "grade", f"tests timed out after {GRADING_TIMEOUT_S}s")
    assert len(result.turns) >= 1, "the agent's trace is kept when grading fails"


# -- the caller or the server goes away -----------------------------------------------------------------------
async def until(check, limit_s: float, every_s: float = 0.2):
    """Poll ``check()`` (plain or async) until it returns something truthy; that value."""
    async with asyncio.timeout(limit_s):
        for _ in itertools.count():
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(every_s)


async def rollout_status(base: str, rid: str) -> dict | None:
    async with httpx.AsyncClient(timeout=10) as http:
        r = await http.get(f"{base}/rollouts/{rid}")
    return r.json() if r.status_code == 200 else None


async def wait_turns(base: str, rid: str, n: int, limit_s: float = 120.0) -> dict:
    async def enough():
        s = await rollout_status(base, rid)
        return s if s and (s["summary"]["turns"] >= n or s["state"] == "finished") else None

    return await until(enough, limit_s, 0.3)


async def test_client_disconnects_mid_rollout(bed):
    """The rollout runs in its own task: a caller that goes away neither stops it nor loses it."""
    bed.engine.set("slow", delay_s=1.0)  # under the bed's stall timeout: slow, not stalled
    before = bed.snapshot()
    rid = "disconnect-" + os.urandom(4).hex()
    base = f"http://127.0.0.1:{bed.stack.server_port}"

    async def call():
        async with SweGymClient(bed.stack.mcp_url) as c:
            return await c.run_rollout(harness="pi", rollout_id=rid, deadline_s=240)

    caller = asyncio.create_task(call())
    status = await wait_turns(base, rid, 1)
    assert status["state"] == "running", "the rollout finished before the client could go away"
    caller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await caller

    async def finished():
        s = await rollout_status(base, rid)
        return s if s and s["state"] == "finished" else None

    r = await until(finished, 300, 0.5)
    assert r["result"]["ok"] and r["result"]["reward"] == 1.0, r["result"]["error"]
    problems = await asyncio.to_thread(wait_no_leaks, before, bed.health_url)
    assert not problems, problems


async def test_server_killed_mid_rollout_leaves_a_failed_result_and_readable_calls(tmp_path):
    engine = HostileEngine()
    engine.set("hang_before", after=1)  # the first agent call is answered and captured, the second hangs
    env = {"SWE_GYM_DATA_DIR": str(tmp_path), "SWE_GYM_UI": "0"}
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env=env)
    base = f"http://127.0.0.1:{stack.server_port}"
    rid = "killed-" + os.urandom(4).hex()
    caller = None
    try:

        async def call():
            async with SweGymClient(stack.mcp_url) as c:
                return await c.run_rollout(harness="pi", rollout_id=rid, deadline_s=300)

        caller = asyncio.create_task(call())
        await wait_turns(base, rid, 1)
        await until(lambda: engine.state()["hanging"] >= 1, 60)  # the agent is mid-call
        old = stack.server.pid
        assert processes_mentioning(f"swe-gym-sbx-{old}-"), "no sandbox process while the agent runs?"
        stack.server.send_signal(signal.SIGKILL)
        stack.server.wait(10)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(30):
                await caller  # the caller sees its connection drop (an error result or an exception)
        # bwrap --die-with-parent: the sandbox dies with the server that started it
        await until(lambda: not processes_mentioning(f"swe-gym-sbx-{old}-"), 30)

        stack.start_server()  # same port, same data dir
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(f"{base}/rollouts/{rid}")
            assert r.status_code == 200, "the rollout went missing"
            status = r.json()
            assert status["state"] == "finished" and status["result"]["ok"] is False
            assert status["result"]["reward"] is None
            assert "server_restarted: the server stopped in phase 'agent'" in status["result"]["error"]
            assert status["result"]["phase"] == "agent"
            doc = (await http.get(f"{base}/capture/sessions/{rid}/export")).json()
        assert doc["session_id"] == rid and len(doc["turns"]) >= 1
        assert doc["turns"][0]["prompt_new_ids"] and doc["turns"][0]["completion_token_ids"]
        assert owned_temp(old) == set(), "the restarted server reaps the dead one's sandbox dirs"
        assert stack.health()["capture_sessions"] == 0 and stack.health()["rollouts_in_flight"] == 0
    finally:
        if caller is not None and not caller.done():
            caller.cancel()
        engine.stop()
        stop(stack)
