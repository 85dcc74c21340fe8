"""A hang is the patch's 0.0 in a fresh server too (issue 32 item 4): run times and empty-patch baselines are kept on
disk per task, image and sandbox kind; with none, the empty patch runs first and sizes the model run's timeout;
grading caps every test run by the rollout's remaining deadline.

`grade()` in the local sandbox with a fresh store, then the real pipeline (a server with a fresh data dir, a
scripted cheating engine driving Pi) with a 180 s deadline: the first rollout with a hanging patch, 8 at once, and a
slow honest fix (3x the base run time) that must still score 1.0."""

from __future__ import annotations

import asyncio
import time

import pytest
from cheats import INIT, as_diff, write_command

from swe_gym_env.server.grading import GradingError, grade, load_swebench, runtimes, store
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import BUNDLED_DIR, bundled_tasks
from swe_gym_env.wire import Finding

HANG = "\nimport time as _time\n\n_time.sleep(100000)\n"
HANG_CMD = write_command(INIT, HANG, append=True)


def factory(task):
    return lambda: create_sandbox("local", SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit))


def codes(g) -> list[str]:
    return [f.code for f in g.findings if isinstance(f, Finding)]


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A fresh server's state: an empty store and empty memory caches."""
    monkeypatch.setattr(store, "STORE_DIR", tmp_path / "store")
    monkeypatch.setattr(runtimes, "_RUNTIMES", {})
    monkeypatch.setattr(runtimes, "_BASELINES", {})
    load_swebench()  # a server loads it at start: not a grading's time
    return tmp_path


pytestmark = [pytest.mark.anyio]


@pytest.mark.integration
@pytest.mark.usefixtures("need_sandbox")
async def test_a_hang_on_a_fresh_server_is_the_patchs_zero_within_the_deadline(fresh):
    task = bundled_tasks()[0]
    diff = as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, HANG_CMD, fresh / "repo")
    t = time.monotonic()
    timings: dict[str, float] = {}
    g = await grade(task, diff, factory(task), 300, timings, cache_key="local", deadline_s=60, use_canaries=False)
    took = time.monotonic() - t
    assert g.reward == 0.0 and codes(g) == ["patch_broke_test_run"], g.report.integrity
    assert g.report.integrity.startswith("patch_broke_run: tests timed out after "), g.report.integrity
    assert took < 60, took
    assert "grade.baseline" in timings  # measured first: it sized the timeout
    data = store.load(task)
    assert data["baselines"] == {f"{task.repo_source}|local": None} and next(iter(data["runtimes"].values())) > 0
    # a restarted server (memory gone) reads both from disk: no baseline run this time
    runtimes._RUNTIMES.clear()
    runtimes._BASELINES.clear()
    timings = {}
    g = await grade(task, diff, factory(task), 300, timings, cache_key="local", deadline_s=30, use_canaries=False)
    assert g.reward == 0.0 and codes(g) == ["patch_broke_test_run"] and "grade.baseline" not in timings


@pytest.mark.integration
@pytest.mark.usefixtures("need_sandbox")
async def test_eight_hangs_at_once_on_a_fresh_server_all_score_zero(fresh):
    task = bundled_tasks()[0]
    diff = as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, HANG_CMD, fresh / "repo")
    timings = [{} for _ in range(8)]
    gs = await asyncio.gather(
        *[grade(task, diff, factory(task), 300, tm, "local", deadline_s=60, use_canaries=False) for tm in timings]
    )
    assert [g.reward for g in gs] == [0.0] * 8, [g.report.integrity for g in gs]
    assert all(codes(g) == ["patch_broke_test_run"] for g in gs)
    assert sum("grade.baseline" in tm for tm in timings) >= 1  # one empty-patch run; the others waited for it


# The task's complete test run made to take over a second, as real tasks' runs do: the bundled task's took 0.2 s on a
# fast machine, where even the shortest timeout a deadline leaves a run (1 s) is 4 times that, and blaming the patch
# for a hang is then right (grader.BLAME_MULTIPLE), so nothing was left to test. A new conftest.py in the test patch.
SLOW_TESTS = (
    "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n--- /dev/null\n+++ b/conftest.py\n"
    "@@ -0,0 +1,3 @@\n+import time\n+\n+time.sleep(1.0)\n"
)


@pytest.mark.integration
@pytest.mark.usefixtures("need_sandbox")
async def test_a_slow_honest_fix_scores_one_and_a_deadline_too_short_is_not_blamed_on_the_patch(fresh):
    bundled = bundled_tasks()[0]
    task = bundled.model_copy(update={"test_patch": bundled.test_patch.rstrip("\n") + "\n" + SLOW_TESTS})
    await grade(task, "", factory(task), cache_key="local")
    base = runtimes.runtime(task, "local")
    assert base is not None and base >= 1.0, base
    slow = write_command(INIT, f"\nimport time as _time\n\n_time.sleep({3 * base:.2f})\n", append=True)
    diff = task.patch + as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, slow, fresh / "repo")
    g = await grade(task, diff, factory(task), cache_key="local", deadline_s=60)
    assert (g.reward, g.report.integrity) == (1.0, "clean"), g.report.log_tail[-1500:]
    # a deadline that leaves less than the task's run time: infra (reward None), never the patch's 0.0
    hang = as_diff(BUNDLED_DIR / task.repo_source, task.base_commit, HANG_CMD, fresh / "repo2")
    with pytest.raises(GradingError, match="too short to blame the patch"):
        await grade(task, hang, factory(task), cache_key="local", deadline_s=max(2.0, base / 2))


# -- the real pipeline: a fresh server, Pi driven by a scripted cheating engine -----------------------------------

DEADLINE_S = 180


@pytest.fixture(scope="module")
def fresh_bed(tmp_path_factory):
    from test_grading_adversary import CheatEngine

    from helpers import Stack

    data = tmp_path_factory.mktemp("fresh-server")
    engine = CheatEngine()
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env={"SWE_GYM_DATA_DIR": str(data)})
    try:
        yield engine, stack, data
    finally:
        engine.stop()
        stack.stop()


async def rollouts(bed, command: str, n: int = 1):
    from swe_gym_env.client.mcp_client import SweGymClient

    engine, stack, _ = bed
    engine.cheat(command)

    async def one():
        async with SweGymClient(stack.mcp_url) as c:
            return await c.run_rollout(harness="pi", sandbox="local", deadline_s=DEADLINE_S)

    async with asyncio.timeout(900):
        return await asyncio.gather(*[one() for _ in range(n)])


def broke(result) -> bool:
    return (
        result.ok
        and result.reward == 0.0
        and "patch_broke_test_run" in [f.code for f in result.findings]
        and result.grading is not None
        and result.grading.integrity.startswith("patch_broke_run: tests timed out")
    )


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_pipeline_first_rollout_after_a_server_start_with_a_hang_is_zero(fresh_bed):
    (result,) = await rollouts(fresh_bed, HANG_CMD)
    assert broke(result), (result.phase, result.error, result.grading and result.grading.integrity)
    assert "grade.prepare" in result.timings  # the first grading of the task measured it, outside the deadline


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_pipeline_eight_hangs_at_once_are_eight_zeros(fresh_bed):
    results = await rollouts(fresh_bed, HANG_CMD, 8)
    assert all(broke(r) for r in results), [(r.phase, r.error, r.reward) for r in results]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_pipeline_a_slow_honest_fix_scores_one(fresh_bed):
    import json

    task = bundled_tasks()[0]
    _, _, data = fresh_bed
    records = [json.loads(f.read_text()) for f in (data / "grading").glob("*.json")]
    seen = [v for r in records for v in r.get("runtimes", {}).values()]
    base = min(seen) if seen else 2.0
    command = " && ".join(
        [
            write_command("/tmp/gold.patch", task.patch),
            "git apply /tmp/gold.patch",
            "rm /tmp/gold.patch",
            write_command(INIT, f"\nimport time as _time\n\n_time.sleep({3 * base:.2f})\n", append=True),
        ]
    )
    (result,) = await rollouts(fresh_bed, command)
    assert result.ok and result.reward == 1.0, (result.error, result.grading and result.grading.integrity)
    assert result.grading is not None and (result.grading.canaries or "").startswith("held: ")
