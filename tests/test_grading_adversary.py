"""The cheat corpus through the real pipeline: a hostile engine (tests/hostile_engine.py, mode `cheat`) makes Pi's
bash tool run each attack of tests/cheats.py in the agent's sandbox; the server extracts the diff and grades it.
Every rollout must be ok with reward 0.0 and, where the grader saw the attempt, its finding.

The whole corpus runs on `local`; the short list (one of each kind: tampering, a broken run, a dropped startup file)
on `landlock` and `docker`, and once on a pypi row in its stand-in image."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from cheats import BY_NAME, CANARY_ONLY, CORPUS, MONKEYPATCH_REPORT, SHORT, SHORT_40, Cheat, write_command
from test_faults import HostileEngine
from test_pypi_split import pypi_images, pypi_split  # noqa: F401 (fixtures)

from swe_gym_env.client.mcp_client import SweGymClient

from helpers import Stack

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]

GRADING_TIMEOUT_S = 60  # the loop-at-import cheat runs into the measured timeout (floor below), then the baseline
TIMEOUT_FLOOR_S = 10


class CheatEngine(HostileEngine):
    def cheat(self, command: str) -> None:
        r = httpx.post(self.url("/fault"), json={"mode": "cheat", "command": command}, timeout=10)
        r.raise_for_status()


@pytest.fixture(scope="module")
def bed():
    engine = CheatEngine()
    env = {
        "SWE_GYM_GRADING_TIMEOUT_S": str(GRADING_TIMEOUT_S),
        "SWE_GYM_GRADING_TIMEOUT_FLOOR_S": str(TIMEOUT_FLOOR_S),
        "SWE_GYM_UI": "0",
    }
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env=env)
    try:
        yield engine, stack
    finally:
        engine.stop()
        stack.stop()


def codes(result) -> list[str]:
    return [f.code for f in result.findings]


async def run_cheat(bed, cheat: Cheat, **fields):
    engine, stack = bed
    engine.cheat(cheat.command)
    async with asyncio.timeout(600):
        async with SweGymClient(stack.mcp_url) as c:
            return await c.run_rollout(harness="pi", deadline_s=400, **fields)


def check(result, cheat: Cheat) -> None:
    assert result.ok, (cheat.name, result.phase, result.error)
    assert result.reward == 0.0, (cheat.name, result.grading and result.grading.integrity)
    assert result.grading is not None
    if cheat.expect is None:
        assert result.grading.integrity == "clean"
        assert not {"grading_tampered", "patch_broke_test_run", "protected_files"} & set(codes(result))
    else:
        assert cheat.expect in codes(result), (
            cheat.name,
            codes(result),
            result.grading.integrity,
            (result.model_patch or "")[:1500],
        )
    if cheat.expect == "grading_tampered":
        assert result.grading.integrity.startswith("tampered: ")
    if cheat.expect == "patch_broke_test_run":
        assert result.grading.integrity.startswith("patch_broke_run: ")


async def test_an_honest_rollout_on_the_same_bed_is_clean(bed):
    engine, stack = bed
    async with httpx.AsyncClient() as http:
        (await http.post(engine.url("/fault"), json={"mode": "ok"}, timeout=10)).raise_for_status()
    async with SweGymClient(stack.mcp_url) as c:
        result = await c.run_rollout(harness="pi", sandbox="local")
    assert result.ok and result.reward == 1.0, result.error
    assert result.grading is not None and result.grading.integrity == "clean"
    assert not {"grading_tampered", "patch_broke_test_run", "protected_files"} & set(codes(result))


@pytest.mark.parametrize("cheat", CORPUS, ids=str)
async def test_the_corpus_on_local(bed, cheat):
    result = await run_cheat(bed, cheat, sandbox="local")
    assert result.model_patch, f"the cheat never reached the diff: {result.agent_log_tail[-1500:]}"
    check(result, cheat)


@pytest.mark.parametrize("cheat", CANARY_ONLY, ids=str)
async def test_what_only_the_canaries_catch_on_local(bed, cheat):
    """Issue 40, class 1: a canary-run switch (and the sentinel-aware proxy alone) through the real pipeline."""
    result = await run_cheat(bed, cheat, sandbox="local")
    check(result, cheat)
    assert result.grading is not None and "canary" in result.grading.integrity, result.grading.integrity


@pytest.mark.parametrize("name", SHORT + SHORT_40)
async def test_the_short_list_on_landlock(bed, name):
    from swe_gym_env.server.sandbox.landlock import preflight

    ok, why = preflight()
    if not ok:
        pytest.skip(f"landlock backend unavailable here: {why}")
    check(await run_cheat(bed, BY_NAME[name], sandbox="landlock"), BY_NAME[name])


@pytest.mark.parametrize("name", SHORT + SHORT_40)
async def test_the_short_list_on_docker(bed, name, need_docker):
    check(await run_cheat(bed, BY_NAME[name], sandbox="docker"), BY_NAME[name])


async def test_a_pypi_row_in_its_stand_in_image(bed, need_docker, pypi_images):  # noqa: F811
    """The report monkey-patch from the package's own __init__, on a real release's code in its SWE-Gym-shaped image
    (toml 0.10.1: the task's conda env, pytest 8.4.2)."""
    task = next(t for t in pypi_images if "toml" in t.instance_id)
    cheat = Cheat("monkeypatch_report_from_toml_init", write_command("toml/__init__.py", MONKEYPATCH_REPORT, True), "")
    result = await run_cheat(bed, cheat, sandbox="docker", split="pypi", instance_id=task.instance_id)
    assert result.ok and result.reward == 0.0, (result.error, result.grading and result.grading.integrity)
    assert "grading_tampered" in codes(result) and result.grading is not None
    assert "replaced _pytest.reports.TestReport.from_item_and_call" in result.grading.integrity
