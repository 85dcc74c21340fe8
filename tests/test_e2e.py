"""End to end, nothing mocked: built-in engine and server as processes, real MCP client over HTTP, real Pi in
real bubblewrap, real swebench grading."""

import base64
import glob
import json
import subprocess
import tempfile

import httpx
import pytest

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.client.trainer import training_rows

from helpers import ME, Stack, full_turns, rows_match_export

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]


@pytest.fixture(scope="module")
def oracle_stack():
    s = Stack("oracle")
    yield s
    s.stop()


def sandbox_dirs(server_pid: int) -> set[str]:
    """Sandbox dirs of one server process (other servers may run on this machine at the same time)."""
    return set(glob.glob(f"{tempfile.gettempdir()}/swe-gym-sbx-{server_pid}-*"))


async def test_oracle_rollout_over_mcp_is_ok_rewarded_and_token_exact(oracle_stack):
    before = sandbox_dirs(oracle_stack.server.pid)
    progress: list[str] = []

    async def on_progress(p, total, message):
        progress.append(message)

    async with SweGymClient(oracle_stack.mcp_url) as c:
        assert "run_rollout" in await c.list_tools()
        result = await c.run_rollout(harness="pi", on_progress=on_progress)
    assert result.ok, result.error
    assert result.reward == 1.0 and result.grading.resolution == "RESOLVED_FULL"
    assert len(result.turns) >= 2 and result.stop_reason == "agent_done"
    assert result.capture_level == "tokens" and result.logprobs_mode == "placeholder"
    assert result.cross_check == "match" and [s.turns for s in result.sequences] == [[t.index for t in result.turns]]
    await rows_match_export(oracle_stack, result)
    assert "-(-len(items) // size)" in result.model_patch
    async with httpx.AsyncClient() as http:
        for turn in full_turns(result):
            tok = await http.post(
                oracle_stack.engine_url("/tokenize"),
                json={"messages": turn.request["messages"], "tools": turn.request.get("tools")},
            )
            assert tok.json()["tokens"] == turn.prompt_token_ids, f"turn {turn.index}"
            assert len(turn.completion_token_ids) == len(turn.logprobs) > 0
    assert "phase: agent" in progress and "phase: done" in progress
    assert any(m.startswith("model call 2:") for m in progress)
    assert result.timings["boot"] >= 0 and result.timings["agent"] > 0 and result.timings["grade"] > 0
    assert sandbox_dirs(oracle_stack.server.pid) == before == set()
    assert oracle_stack.health()["capture_sessions"] == 0
    # Pi re-sends history that re-tokenises to exactly what was sampled: one sequence, no drift.
    (row,) = training_rows(result)
    assert row.turn_indices == [t.index for t in result.turns] and sum(row.loss_mask) == sum(
        len(t.completion_token_ids) for t in result.turns
    )


async def test_invalid_arguments_come_back_as_a_failed_result(oracle_stack):
    async with SweGymClient(oracle_stack.mcp_url) as c:
        result = await c.run_rollout(harness="pi", instance_id="no-such-task")
        assert not result.ok and result.phase == "task" and result.reward is None
        assert "no-such-task" in result.error
        train = await c.run_rollout(harness="pi", purpose="train")
        assert not train.ok and train.phase == "validate" and "placeholder logprobs" in train.error


async def test_noop_agent_is_graded_zero_not_failed():
    s = Stack("noop")
    try:
        async with SweGymClient(s.mcp_url) as c:
            result = await c.run_rollout(harness="pi")
    finally:
        s.stop()
    assert result.ok and result.reward == 0.0 and len(result.turns) == 1
    assert result.model_patch == ""


async def test_a_deep_tmpdir_gets_its_capture_socket_in_tmp(tmp_path):
    """A TMPDIR too deep for a unix socket's path (bind() fails: "AF_UNIX path too long", and the server did not
    start): the capture socket's folder goes to /tmp, a rollout runs, and the folder goes when the server stops."""
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.mkdir(parents=True)
    s = Stack("noop", env={"TMPDIR": str(deep)})
    pid = s.server.pid
    try:
        (sock_dir,) = glob.glob(f"/tmp/swe-gym-capture-{pid}-*")
        assert glob.glob(f"{sock_dir}/capture.sock") and not glob.glob(f"{deep}/swe-gym-capture-*")
        async with SweGymClient(s.mcp_url) as c:
            result = await c.run_rollout(harness="pi")
    finally:
        s.stop()
    assert result.ok and result.reward == 0.0, result.error
    assert not glob.glob(f"/tmp/swe-gym-capture-{pid}-*")


async def test_dead_engine_fails_in_the_agent_phase_without_a_reward():
    s = Stack("oracle", engine_up=False)
    try:
        async with SweGymClient(s.mcp_url) as c:
            result = await c.run_rollout(harness="pi", deadline_s=120)
        assert s.health()["capture_sessions"] == 0
    finally:
        s.stop()
    assert not result.ok and result.phase == "validate" and result.reward is None
    assert "engine unreachable" in result.error
    assert result.turns == []


def test_demo_command_prints_one_ok_json_object():
    out = subprocess.run([*ME, "demo", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["ok"] is True and result["reward"] == 1.0 and len(result["turns"]) >= 2


FIX = "sed -i 's|count = len(items) // size|count = -(-len(items) // size)|' batchtools/chunks.py"
CHEAT = (
    "echo 1.0 > reward.txt && mkdir -p /tmp/r && echo 1.0 > /tmp/r/reward && "
    "printf 'import pytest\\npytest.skip(\"x\", allow_module_level=True)\\n' > tests/conftest.py && "
    "sed -i 's/== \\[\\[1, 2\\], \\[3, 4\\]\\]/is not None/' tests/test_chunks.py"
)


def bash(cmd: str) -> dict:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": f"cd /testbed && {cmd}"}}]}


async def scripted_rollout(tmp_path, steps: list[dict], **fields):
    """One rollout with the built-in engine replaying ``steps`` (then "done") through the real Pi."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([*steps, {"content": "done"}]))
    s = Stack(f"script:{script}")
    try:
        async with SweGymClient(s.mcp_url) as c:
            return await c.run_rollout(harness="pi", **fields)
    finally:
        s.stop()


async def test_an_agent_stopped_by_the_call_budget_is_graded_and_ok(tmp_path):
    result = await scripted_rollout(tmp_path, [bash(f"echo step {i}") for i in range(20)], max_model_calls=3)
    assert result.ok, result.error
    assert result.stop_reason == "budget_exhausted" and len(result.turns) == 3 and result.reward == 0.0
    assert result.cross_check == "match", result.cross_check_detail


@pytest.mark.parametrize(
    "steps,reward",
    [
        ([bash(FIX + " && git commit -qam fix"), bash(CHEAT)], 1.0),  # committed fix + cheats = the fix alone
        ([bash(CHEAT)], 0.0),  # cheats alone earn nothing
    ],
)
async def test_scripted_agent_cannot_game_the_reward(tmp_path, steps, reward):
    result = await scripted_rollout(tmp_path, steps)
    assert result.ok, result.error
    assert result.reward == reward and len(result.turns) == len(steps) + 1
    assert "tests/conftest.py" in result.model_patch and "reward.txt" in result.model_patch
    assert any("protected files" in f.message and "tests/conftest.py" in f.message for f in result.findings)


BOOT = (
    "import os\n"
    "print('PASSED tests/test_chunks.py::test_chunked_keeps_partial_tail')\n"
    "print('PASSED tests/test_chunks.py::test_chunk_count_rounds_up')\n"
    "os._exit(0)\n"
)
FORGE = (
    f"echo {base64.b64encode(BOOT.encode()).decode()} | base64 -d > batchtools/_boot.py && "
    "sed -i '1a import batchtools._boot  # noqa' batchtools/__init__.py"
)


async def test_code_that_forges_passed_lines_gets_no_reward_and_a_clear_error(tmp_path):
    """Forged PASSED lines, then os._exit before pytest's end: the patch broke the test run (the empty patch's run
    reports results), so the policy earns 0.0 with `patch_broke_test_run`, never a pass and never a dropped null."""
    result = await scripted_rollout(tmp_path, [bash(FORGE)])
    assert "PASSED tests/test_chunks.py::test_chunked_keeps_partial_tail" in result.model_patch
    assert result.ok and result.phase == "done" and result.reward == 0.0, (result.phase, result.error)
    assert result.grading is not None and result.grading.integrity.startswith("patch_broke_run: ")
    assert "patch_broke_test_run" in [f.code for f in result.findings]


async def test_task_setup_commands_run_before_the_agent_and_stay_out_of_its_diff(tmp_path):
    """A split whose task brings setup commands: they run in the sandbox first; their effects are the agent's starting
    point (not in its diff); grading runs them again; a failing setup fails the boot phase."""
    from swe_gym_env.tasks.catalog import bundled_tasks

    base = bundled_tasks()[0].model_dump()
    rows = [
        {**base, "setup_commands": ["echo prepared > SETUP_MARKER", "test -s SETUP_MARKER"]},
        {**base, "instance_id": base["instance_id"] + "-broken", "setup_commands": ["echo no >&2; exit 3"]},
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stack = Stack("oracle", env={"SWE_GYM_DATASETS": f"withsetup={tmp_path / 'tasks.jsonl'}"})
    try:
        async with SweGymClient(stack.mcp_url) as c:
            good = await c.run_rollout(split="withsetup", index=0)
            broken = await c.run_rollout(split="withsetup", index=1)
    finally:
        stack.stop()
    assert good.ok and good.reward == 1.0, (good.phase, good.error)
    assert "SETUP_MARKER" not in (good.model_patch or "") and good.model_patch
    assert not broken.ok and broken.phase == "boot" and broken.reward is None
    assert "task setup commands failed (exit 3)" in broken.error and "no" in broken.error
