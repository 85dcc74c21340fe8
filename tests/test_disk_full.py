"""A full data disk on a real server (its data dir on a small tmpfs, filled to the last page mid-rollout): the rollout
being stored fails clearly (ok=false, its phase, "disk full"), a new one is refused at once saying why, what was
stored before is whole, the server keeps answering, and rollouts succeed again once space is freed."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastmcp import Client
from test_retention import fill, small_disk  # noqa: F401 - the fixture

from swe_gym_env.client.mcp_client import SweGymClient

from helpers import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]


async def test_a_full_disk_fails_the_rollout_clearly_and_the_server_recovers(small_disk, tmp_path):  # noqa: F811
    script = tmp_path / "script.json"
    steps = [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 3"}}]}, {"content": "done"}]
    script.write_text(json.dumps(steps))
    s = Stack(f"script:{script}", env={"SWE_GYM_DATA_DIR": str(small_disk / "data")})
    try:
        async with SweGymClient(s.mcp_url, timeout_s=300) as c:
            before = await c.run_rollout(rollout_id="before-the-fill")
            assert before.ok, before.error
            async with Client(s.mcp_url) as mcp:
                stored = (await mcp.call_tool("get_rollout", {"rollout_id": "before-the-fill"})).structured_content
                call = asyncio.create_task(c.run_rollout(rollout_id="filled-mid-run"))
                for _ in range(600):
                    got = await mcp.call_tool("get_rollout", {"rollout_id": "filled-mid-run"}, raise_on_error=False)
                    # the agent's command is running
                    if not got.is_error and got.structured_content["summary"]["turns"] == 1:
                        break
                    await asyncio.sleep(0.1)
                filler = fill(small_disk)
                mid = await call
                assert mid.ok is False and mid.reward is None and "disk full" in (mid.error or ""), mid.error
                assert mid.phase in ("agent", "diff", "grade", "done"), mid.phase
                # the server answers, and what it stored before is whole
                health = s.health()
                assert health["status"] == "healthy" and health["disk"]["disk"]["free_bytes"] < 64 * 1024
                again = (await mcp.call_tool("get_rollout", {"rollout_id": "before-the-fill"})).structured_content
                assert again == stored
                listed = (await mcp.call_tool("list_rollouts", {})).structured_content["rollouts"]
                assert "before-the-fill" in {r["rollout_id"] for r in listed}
                refused = await c.run_rollout(rollout_id="while-full-0001")
                assert refused.ok is False and refused.phase == "validate" and "disk full" in (refused.error or "")
                filler.unlink()
                after = await c.run_rollout(rollout_id="after-the-space")
                assert after.ok, after.error
                told = (await mcp.call_tool("get_rollout", {"rollout_id": "filled-mid-run"})).structured_content
                assert told["result_summary"]["ok"] is False and "disk full" in told["result_summary"]["error"]
                assert (await mcp.call_tool("get_rollout", {"rollout_id": "before-the-fill"})).structured_content == (
                    stored
                )
        assert s.health()["rollouts_in_flight"] == 0 and s.health()["capture_sessions"] == 0
    finally:
        s.stop()
