"""A real task in its own image, end to end: Pi and OpenCode rollouts on `docker` in the stand-in SWE-Gym image of a
task of the `pypi` split (real bug fix, repo at /testbed, conda-shaped `testbed` env, no Node), over MCP.

The agent comes in as its bundle (the image has no Node); it works inside the task's activated environment, which
the built-in engine's `oracle+probe` policy shows: its first tool call asks the agent's own shell which Python, env
and node it gets, and the answer lands in the next captured prompt. Grading runs in a fresh container of the same
image with the image's env, the way the task's own data says (install_config).
"""

from __future__ import annotations

import subprocess

import pytest
from conftest import docker_has, docker_ready, require

from swe_gym_env.client.mcp_client import SweGymClient

from helpers import Stack, full_turns, rows_match_export

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_opencode")]

TASK = "uiri__toml-0.10.2"  # a small fix: one file, one hunk
TESTBED_PYTHON = "/opt/miniconda3/envs/testbed/bin/python"


@pytest.fixture(scope="module")
def task():
    from swe_gym_env.tasks.catalog import split_names, tasks_in

    require(docker_ready(), "no docker daemon: run `bash scripts/setup_docker.sh`")
    require("pypi" in split_names(), "the pypi split is not built: run `swe-gym-env setup --all`")
    t = next(t for t in tasks_in("pypi") if t.instance_id == TASK)
    assert t.image is not None
    require(docker_has(t.image), f"{t.image} is not built: run `bash scripts/build_standin_images.sh`")
    return t


@pytest.fixture(scope="module")
def stack():
    s = Stack("oracle+probe", env={"SWE_GYM_ENGINE_MAX_MODEL_LEN": "32768", "SWE_GYM_CONTEXT_WINDOW": "32768"})
    yield s
    s.stop()


def test_the_image_has_no_node(task):
    r = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", task.image, "bash", "-c", "command -v node || echo none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.split() == ["none"], r.stdout + r.stderr


@pytest.mark.parametrize("harness", ["pi", "opencode"])
async def test_rollout_in_the_tasks_own_image(stack, task, harness):
    async with SweGymClient(stack.mcp_url, timeout_s=600) as c:
        result = await c.run_rollout(
            harness=harness, sandbox="docker", split="pypi", instance_id=task.instance_id, deadline_s=500
        )
    assert result.ok, (result.phase, result.error, result.agent_log_tail[-2000:])
    assert result.reward == 1.0 and result.grading is not None and result.cross_check == "match"
    report = result.grading
    assert report.graded_by == "install_config" and report.junit_cross_check == "match"
    assert report.environment.startswith("the image's conda env testbed"), report.environment
    # the probe's answer is in the prompt of the call after it: what the agent's own commands ran in
    probe = [t for t in full_turns(result)[1:] if "probe: python=" in str(t.request.get("messages"))]
    assert probe, "the probe's output never reached the model"
    said = str(probe[0].request["messages"])
    assert f"python={TESTBED_PYTHON}" in said and "env=testbed" in said and "node=none" in said, said[-1500:]
    assert result.timings["boot"] > 0 and "bundle" in result.timings
    await rows_match_export(stack, result)
