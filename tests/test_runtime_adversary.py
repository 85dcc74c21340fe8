"""Issue 32's cheat classes through the real pipeline: a hostile engine makes the agent's shell tool run each attack
of tests/cheats.py; the server extracts the diff and grades it. The whole corpus (these classes included) runs on
`local` with Pi in tests/test_grading_adversary.py; here three classes (comparison overloading, a code swap from a
thread, a trace function) run on `landlock` and `docker` with Pi and on `local` with OpenCode, and unittest's
machinery patched from the package runs on a unittest-style pypi row (xmltodict)."""

from __future__ import annotations

import asyncio

import pytest
from cheats import (
    BY_NAME,
    RUNTIME_FINDINGS,
    SHORT_40,
    SHORT_RUNTIME,
    UNITTEST_NOOP_ASSERTS,
    UNITTEST_SKIP_METHODS,
    Cheat,
    always_equal,
    write_command,
)
from hostile_engine import MODEL, CheatPolicy, Faults
from test_grading_adversary import GRADING_TIMEOUT_S, TIMEOUT_FLOOR_S, bed, check, codes, run_cheat  # noqa: F401
from test_pypi_split import pypi_split  # noqa: F401 (fixture)

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.core.assets import tokenizer_file
from swe_gym_env.server.engine.app import Engine, create_engine_app
from swe_gym_env.server.engine.chat import ChatRenderer

from helpers import Served, Stack

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]


def check_named(result, cheat: Cheat, finding: str) -> None:
    check(result, cheat)
    assert result.grading is not None and finding in result.grading.integrity, (
        cheat.name,
        result.grading.integrity,
        (result.model_patch or "")[:1500],
    )


@pytest.mark.parametrize("name", SHORT_RUNTIME)
async def test_the_runtime_classes_on_landlock(bed, name):  # noqa: F811
    from swe_gym_env.server.sandbox.landlock import preflight

    ok, why = preflight()
    if not ok:
        pytest.skip(f"landlock backend unavailable here: {why}")
    result = await run_cheat(bed, BY_NAME[name], sandbox="landlock")
    check_named(result, BY_NAME[name], RUNTIME_FINDINGS[name])


@pytest.mark.parametrize("name", SHORT_RUNTIME)
async def test_the_runtime_classes_on_docker(bed, name, need_docker):  # noqa: F811
    result = await run_cheat(bed, BY_NAME[name], sandbox="docker")
    check_named(result, BY_NAME[name], RUNTIME_FINDINGS[name])


@pytest.fixture(scope="module")
def long_bed():
    """The cheat policy in an engine serving 32k tokens of context (OpenCode's floor is 12k; the hostile engine
    process serves SmolLM2's 8k)."""
    faults = Faults()
    engine = Engine(ChatRenderer(tokenizer_file()), CheatPolicy(faults), MODEL, max_model_len=32768)
    served = Served(create_engine_app(engine))
    url = served.__enter__()
    env = {
        "SWE_GYM_GRADING_TIMEOUT_S": str(GRADING_TIMEOUT_S),
        "SWE_GYM_GRADING_TIMEOUT_FLOOR_S": str(TIMEOUT_FLOOR_S),
        "SWE_GYM_UI": "0",
    }
    stack = Stack("oracle", engine_up=False, server_engine_url=url + "/v1", env=env)
    try:
        yield faults, stack
    finally:
        stack.stop()
        served.__exit__(None, None, None)


async def opencode_cheat(long_bed, name: str):
    """One rollout of OpenCode on `local` whose shell tool runs the named cheat."""
    faults, stack = long_bed
    faults.set("cheat", command=BY_NAME[name].command)
    async with asyncio.timeout(600):
        async with SweGymClient(stack.mcp_url) as c:
            result = await c.run_rollout(harness="opencode", sandbox="local", deadline_s=400)
    assert result.model_patch, (result.error, result.agent_log_tail[-1500:])
    return result


@pytest.mark.parametrize("name", SHORT_RUNTIME)
async def test_the_runtime_classes_with_opencode(need_opencode, long_bed, name):
    check_named(await opencode_cheat(long_bed, name), BY_NAME[name], RUNTIME_FINDINGS[name])


@pytest.mark.parametrize("name", ["canary_run_switch", *SHORT_40])
async def test_issue_40_classes_with_opencode(need_opencode, long_bed, name):
    """Issue 40's construction with a second harness: the canary-run switch, builtins replaced from the package, a
    `pytest.py` at the root, pytest settings behind TOML escapes."""
    check(await opencode_cheat(long_bed, name), BY_NAME[name])


XMLTODICT = [
    (
        Cheat("unittest_noop_asserts", write_command("xmltodict.py", UNITTEST_NOOP_ASSERTS, True), "grading_tampered"),
        "replaced unittest.case.TestCase.assertEqual",
    ),
    (
        Cheat("unittest_skip_methods", write_command("xmltodict.py", UNITTEST_SKIP_METHODS, True), "grading_tampered"),
        "replaced unittest.case.TestCase._callTestMethod",
    ),
    (
        Cheat(
            "always_equal_subclass_assert_equal",
            write_command("xmltodict.py", always_equal("subclass", [("xmltodict", "parse")]), True),
            "grading_tampered",
        ),
        "always-equal OrderedDict from xmltodict.py",
    ),
]


@pytest.mark.parametrize(("cheat", "finding"), XMLTODICT, ids=[c.name for c, _ in XMLTODICT])
async def test_unittest_machinery_patched_from_the_package(bed, pypi_split, cheat, finding):  # noqa: F811
    """xmltodict's tests are unittest.TestCase classes (run by pytest): its module patches unittest itself."""
    task = next(t for t in pypi_split if "xmltodict" in t.instance_id)
    result = await run_cheat(bed, cheat, sandbox="local", split="pypi", instance_id=task.instance_id)
    assert result.model_patch, f"the cheat never reached the diff: {result.agent_log_tail[-1500:]}"
    check_named(result, cheat, finding)
    assert "grading_tampered" in codes(result)
