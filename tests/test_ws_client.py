"""The typed websocket client against a real server: rollouts, request matching under timeouts and concurrency,
sync use, real close, and a base install without the server's dependencies."""

import asyncio
import os
import subprocess
import sys
import threading

import httpx
import pytest

from swe_gym_env.client.ws_client import SweGymWSClient, SyncSweGymWSClient
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import Stack, rows_match_export

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack("oracle", env={"SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("data"))})
    yield s
    s.stop()


def base_url(stack) -> str:
    return f"http://127.0.0.1:{stack.server_port}"


async def test_rollouts_from_many_tasks_share_one_client(stack):
    tasks = bundled_tasks()
    async with SweGymWSClient(base_url(stack)) as c:
        assert "run_rollout" in await c.list_tools()
        page, *results = await asyncio.gather(
            c.list_tasks(), *[c.run_rollout(instance_id=t.instance_id) for t in tasks[:3]]
        )
    assert page.total == len(tasks)
    assert [r.instance_id for r in results] == [t.instance_id for t in tasks[:3]]
    assert all(r.ok and r.reward == 1.0 and r.turns for r in results)
    for r in results:
        await rows_match_export(stack, r)


async def test_a_timed_out_call_never_hands_its_reply_to_the_next(stack):
    async with SweGymWSClient(base_url(stack)) as c:
        slow = await c.run_rollout(instance_id=bundled_tasks()[1].instance_id, timeout_s=0.5)
        assert not slow.ok and "TimeoutError" in slow.error and slow.rollout_id in slow.error
        page = await c.list_tasks(limit=2)  # the late run_rollout reply must not land here
        assert len(page.tasks) == 2
        for _ in range(300):
            status = await c.get_rollout(slow.rollout_id)
            if status.state == "finished":
                break
            await asyncio.sleep(0.1)
    assert status.result.ok and status.result.reward == 1.0


def test_sync_client_runs_and_really_closes(stack):
    before = threading.active_count()
    with SyncSweGymWSClient(base_url(stack)) as c:
        result = c.run_rollout(instance_id=bundled_tasks()[2].instance_id)
        assert result.ok and result.reward == 1.0
    assert threading.active_count() == before
    c.close()  # idempotent


async def test_1000_connect_close_cycles_leave_no_session(stack):
    for _ in range(1000):
        c = SweGymWSClient(base_url(stack))
        await c.connect()
        await c.close()
    async with httpx.AsyncClient() as http:
        health = (await http.get(f"{base_url(stack)}/health")).json()
    assert health["openenv_sessions"] == 0 and health["rollouts_in_flight"] == 0


def test_client_installs_without_the_server(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", root], check=True, capture_output=True)
    code = (
        "import importlib.util as u, swe_gym_env.client as c; c.SweGymWSClient; c.SyncSweGymWSClient;"
        "print([m for m in ('fastapi','fastmcp','swebench','uvicorn') if u.find_spec(m)])"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
