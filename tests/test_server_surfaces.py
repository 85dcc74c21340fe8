"""The server's MCP surface from real clients: the official `mcp` SDK and fastmcp; idempotent rollout ids,
disconnect-then-fetch, cancel, restart recovery, many concurrent rollouts."""

import asyncio
import glob
import json
import tempfile

import pytest
from fastmcp import Client

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.core import names
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import Stack, check_result_form, full_turns

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]
TOOLS = {"run_rollout", "list_tasks", "get_task", "get_rollout", "list_rollouts", "cancel_rollout", "capabilities"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack("oracle", env={"SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("data"))})
    yield s
    s.stop()


def slow_script(tmp_path, seconds: int = 60):
    script = tmp_path / "slow.json"
    script.write_text(
        json.dumps(
            [{"tool_calls": [{"name": "bash", "arguments": {"command": f"sleep {seconds}"}}]}, {"content": "done"}]
        )
    )
    return f"script:{script}"


async def test_official_mcp_sdk_client_runs_a_rollout_with_progress(stack):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    progress: list[str] = []

    async def on_progress(p, total, message):
        progress.append(message)

    async with streamable_http_client(stack.mcp_url) as streams, ClientSession(streams[0], streams[1]) as s:
        await s.initialize()
        assert TOOLS <= {t.name for t in (await s.list_tools()).tools}
        res = await s.call_tool(
            "run_rollout",
            {"instance_id": bundled_tasks()[1].instance_id},
            read_timeout_seconds=300,
            progress_callback=on_progress,
        )
    assert not res.is_error
    body = res.structured_content
    assert body["ok"] is True and body["reward"] == 1.0 and body["turns"] >= 2
    assert body["result_form"] == "summary" and body["pages"] >= 1  # the whole result: its resource pages
    assert body["instance_id"] == bundled_tasks()[1].instance_id
    assert "phase: grade" in progress and any(m.startswith("model call 1:") for m in progress)


async def test_engine_url_and_sampling_overrides_only_where_allowed(stack, tmp_path):
    import httpx

    async with SweGymClient(stack.mcp_url) as c:
        refused = await c.run_rollout(engine_url=stack.engine_url("/v1"))
    assert not refused.ok and refused.phase == "validate" and "SWE_GYM_ALLOW_ENGINE_URLS" in refused.error
    s = Stack(
        "oracle",
        env={"SWE_GYM_DATA_DIR": str(tmp_path), "SWE_GYM_ALLOW_ENGINE_URLS": "1"},
        server_engine_url="http://127.0.0.1:9/v1",
    )
    try:
        async with SweGymClient(s.mcp_url) as c:
            named = await c.run_rollout(max_model_calls=2)  # the named default engine is dead here
            result = await c.run_rollout(engine_url=s.engine_url("/v1"), temperature=0.3, top_p=0.9, seed=7)
        async with httpx.AsyncClient() as http:
            by_http = (await http.get(f"http://127.0.0.1:{s.server_port}/rollouts/{result.rollout_id}")).json()
            missing = await http.get(f"http://127.0.0.1:{s.server_port}/rollouts/nope")
    finally:
        s.stop()
    assert not named.ok and "engine unreachable" in named.error
    assert result.ok and result.reward == 1.0, result.error
    check_result_form(result)
    assert all(
        t.request["temperature"] == 0.3 and t.request["top_p"] == 0.9 and t.request["seed"] == 7
        for t in full_turns(result)
    )
    assert by_http["state"] == "finished" and by_http["result"]["rollout_id"] == result.rollout_id
    assert missing.status_code == 404


async def test_task_tools_never_reveal_patches(stack):
    async with Client(stack.mcp_url) as c:
        page = (await c.call_tool("list_tasks", {"split": "bundled"})).structured_content
        one = (await c.call_tool("get_task", {"index": 2})).structured_content
        caps = (await c.call_tool("capabilities", {})).structured_content
    assert page["total"] == len(bundled_tasks()) >= 5 and len(page["tasks"]) == page["total"]
    dump = json.dumps([page, one])
    assert "diff --git" not in dump and '"patch"' not in dump and '"test_patch"' not in dump
    assert one["instance_id"] == bundled_tasks()[2].instance_id
    assert caps["harnesses"] == sorted(names.HARNESSES) and "local" in caps["sandboxes"] and "bundled" in caps["splits"]


async def test_disconnected_client_fetches_the_result_by_id_and_reruns_are_idempotent(stack):
    rid = "client-chosen-0001"
    in_agent = asyncio.Event()

    async def on_progress(p, total, message):
        if message == "phase: agent":
            in_agent.set()

    async def call():
        async with SweGymClient(stack.mcp_url) as c:
            await c.run_rollout(rollout_id=rid, on_progress=on_progress)

    task = asyncio.create_task(call())
    await asyncio.wait_for(in_agent.wait(), 120)
    task.cancel()  # the client goes away mid-rollout
    with pytest.raises(asyncio.CancelledError):
        await task
    async with Client(stack.mcp_url) as c:
        for _ in range(600):
            args = {"rollout_id": rid, "result_form": "compact"}
            status = (await c.call_tool("get_rollout", args)).structured_content
            if status["state"] == "finished":
                break
            await asyncio.sleep(0.1)
        listed = (await c.call_tool("list_rollouts", {})).structured_content
    got = status["result"]
    assert got["ok"] is True and got["reward"] == 1.0 and got["rollout_id"] == rid
    assert rid in json.dumps(listed)
    async with SweGymClient(stack.mcp_url) as c:
        again = await c.run_rollout(rollout_id=rid)
    assert again.rollout_id == rid and [t.completion_token_ids for t in again.turns] == [
        t["completion_token_ids"] for t in got["turns"]
    ]


async def test_cancel_rollout_stops_it_and_leaks_nothing(tmp_path):
    s = Stack(slow_script(tmp_path), env={"SWE_GYM_DATA_DIR": str(tmp_path / "data")})
    mine = f"{tempfile.gettempdir()}/swe-gym-sbx-{s.server.pid}-*"
    try:
        async with SweGymClient(s.mcp_url) as c:
            call = asyncio.create_task(c.run_rollout(rollout_id="to-be-cancelled"))
            async with Client(s.mcp_url) as admin:
                for _ in range(300):
                    got = await admin.call_tool("get_rollout", {"rollout_id": "to-be-cancelled"})
                    if got.structured_content["summary"]["turns"] == 1:
                        break
                    await asyncio.sleep(0.1)
                assert (await admin.call_tool("cancel_rollout", {"rollout_id": "to-be-cancelled"})).data is True
            result = await call
        assert not result.ok and result.stop_reason == "cancelled" and result.reward is None
        assert result.phase == "agent" and len(result.turns) == 1
        assert s.health()["capture_sessions"] == 0 and s.health()["rollouts_in_flight"] == 0
        assert glob.glob(mine) == []
    finally:
        s.stop()


async def test_server_killed_mid_rollout_marks_it_failed_after_restart(tmp_path):
    s = Stack(slow_script(tmp_path), env={"SWE_GYM_DATA_DIR": str(tmp_path / "data")})
    killed = f"{tempfile.gettempdir()}/swe-gym-sbx-{s.server.pid}-*"
    killed_socket = f"{tempfile.gettempdir()}/swe-gym-capture-{s.server.pid}-*"
    try:
        async with SweGymClient(s.mcp_url) as c:
            call = asyncio.create_task(c.run_rollout(rollout_id="killed-mid-run"))
            for _ in range(300):
                if list((tmp_path / "data" / "results").glob("killed-mid-run.running")):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2)
            assert glob.glob(killed), "the rollout's sandbox should exist before the kill"
            s.server.kill()
            s.server.wait()
            call.cancel()
        s.start_server()
        async with Client(s.mcp_url) as c:
            got = (await c.call_tool("get_rollout", {"rollout_id": "killed-mid-run"})).structured_content
            got = got["result_summary"]
    finally:
        s.stop()
    assert got["ok"] is False and "server stopped" in got["error"] and got["reward"] is None
    assert glob.glob(killed) == []  # the dead server's sandbox was reaped at restart
    assert glob.glob(killed_socket) == []  # and its capture socket dir


async def test_32_concurrent_rollouts_each_with_its_own_turns(tmp_path):
    s = Stack("oracle", env={"SWE_GYM_DATA_DIR": str(tmp_path / "data"), "SWE_GYM_MAX_ROLLOUTS": "8"})
    tasks = bundled_tasks()
    try:
        async with SweGymClient(s.mcp_url) as c:
            results = await asyncio.gather(
                *[c.run_rollout(instance_id=tasks[i % len(tasks)].instance_id) for i in range(32)]
            )
        health = s.health()
    finally:
        s.stop()
    assert [r.ok for r in results] == [True] * 32, [r.error for r in results if not r.ok]
    assert all(r.reward == 1.0 for r in results)
    assert len({r.rollout_id for r in results}) == 32
    by_id = {t.instance_id: t for t in tasks}
    for r in results:  # every captured turn carries its own task's problem statement, no one else's
        check_result_form(r)
        statement = by_id[r.instance_id].problem_statement
        for turn in full_turns(r):
            text = json.dumps(turn.request["messages"])
            assert json.dumps(statement)[1:60] in text
            others = [t for t in tasks if t.instance_id != r.instance_id]
            assert not any(json.dumps(o.problem_statement)[1:60] in text for o in others)
    assert health["capture_sessions"] == 0 and health["rollouts_in_flight"] == 0
