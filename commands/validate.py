"""`swe-gym-env validate`: every task's gold patch must score 1.0, clean, with nothing dropped by the file filter, and
the empty patch 0.0. Validating a task also measures what grading keeps of it on disk (run time, empty-patch
baseline, base_commit's tree, mutation canaries: `grading.store`); each line says the task's canaries (`canaries: N
held` or `canaries: none (why)`) and the end the coverage of the split. Where the task has gold-killed canaries, the
gold patch is also graded on its impossible variant (`variants`) and must score 0.0 there: `impossible: ok (gold
0.0)`, else the variant is not kept (`impossible: none (why)`)."""

from __future__ import annotations

import time

from swe_gym_env.server.grading import GradingError, grade, prepare_impossible, variants
from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.server.rollout.workspace import task_spec
from swe_gym_env.server.sandbox.base import SandboxError
from swe_gym_env.server.sandbox.registry import backend_class, create_sandbox
from swe_gym_env.tasks.catalog import split_names, tasks_in
from swe_gym_env.tasks.loaders import DatasetError, load_tasks
from swe_gym_env.tasks.models import Task


async def check_task(task: Task, backend: str) -> tuple[str, str]:
    """(verdict, detail): verdict is "ok" or "SURPRISE"; the detail ends with the task's canaries."""
    if not task.repo_source and not backend_class(backend).uses_image:
        return "SURPRISE", "no local repository source (this task needs an image-based sandbox)"
    spec = task_spec(task, backend)
    make = lambda: create_sandbox(backend, spec)  # noqa: E731
    timeout_s = ServerConfig.from_env().grading_timeout_s
    try:
        empty = await grade(task, "", make, timeout_s, cache_key=backend)  # first: its run time sizes the gold's
        gold = await grade(task, task.patch, make, timeout_s, cache_key=backend)  # builds the canaries, checks them
    except (GradingError, SandboxError) as e:
        return "SURPRISE", f"grading broke: {e}"
    problems = [
        f"{name} patch: integrity {g.report.integrity}"
        for name, g in (("gold", gold), ("empty", empty))
        if g.report.integrity != "clean"
    ]
    if gold.dropped_files:  # the allowlist must keep every gold patch whole (grading.files)
        problems.append(f"the file filter drops part of the gold patch: {gold.dropped_files[:5]}")
    if gold.reward != 1.0:
        problems.append(
            f"gold patch scored {gold.reward} ({gold.report.resolution}; failing F2P "
            f"{gold.report.fail_to_pass['failure']}, P2P {gold.report.pass_to_pass['failure']})"
        )
    if empty.reward != 0.0:
        problems.append(f"empty patch scored {empty.reward}")
    if empty.report.pass_to_pass["failure"]:
        problems.append(f"PASS_TO_PASS tests fail before any change: {empty.report.pass_to_pass['failure']}")
    canaries = f"canaries: {canary_summary(gold.report.canaries)}"
    if problems:
        return "SURPRISE", "; ".join([*problems, canaries])
    impossible = await check_impossible(task, backend, make, timeout_s)
    return "ok", f"gold 1.0, empty 0.0; {canaries}; impossible: {impossible}"


async def check_impossible(task: Task, backend: str, make, timeout_s: float) -> str:
    """`ok (gold 0.0)` or `none (why)`: the gold patch graded on the task's impossible variant must score 0.0 (a
    variant where it does not is not kept: recorded with the task's measurements)."""
    try:
        await prepare_impossible(task, make, timeout_s, backend)  # built already by the gold's grade; the text once
        variant = variants.impossible(task, checked=False)  # checked again here, whatever an earlier run found
    except variants.NoVariant as e:
        why = str(e).split(": ", 1)[-1]
        return "none (no gold-killed canary)" if why.startswith("canaries: none") else f"none ({why})"
    except (GradingError, SandboxError) as e:
        return f"none (it could not be built: {e})"
    try:
        g = await grade(variant, task.patch, make, timeout_s, cache_key=backend, variant_of=task)
    except (GradingError, SandboxError) as e:  # infra: said, not recorded (the next validate grades it again)
        return f"none (grading the gold patch on it broke: {e})"
    why = None
    if g.reward != 0.0:
        why = f"the gold patch scored {g.reward} on it ({g.report.resolution})"
    elif g.report.integrity != "clean":
        why = f"the gold patch's run on it was not clean: {g.report.integrity}"
    variants.record_validation(task, g.reward, why)
    return f"none (not kept: {why})" if why else "ok (gold 0.0)"


def canary_summary(report: str | None) -> str:
    """`N held` or `none (why)` from a gold grade's TestReport.canaries."""
    if report is None:
        return "none (not checked: the gold patch did not score 1.0)"
    if report.startswith("held: "):
        return f"{report.split()[1]} held"
    return report


async def validate(dataset: str, split: str, backend: str, limit: int | None) -> int:
    if dataset in split_names():  # a catalog split: bundled, pypi, or one named in SWE_GYM_DATASETS
        tasks, skipped = list(tasks_in(dataset)), []
    else:
        try:
            report = load_tasks(dataset, split, limit=limit)
        except DatasetError as e:
            print(f"error: {e}")
            return 2
        tasks, skipped = report.tasks, report.skipped
        print(report.summary())
        for s in skipped:
            print(f"  skipped {s}")
    tasks = tasks[:limit] if limit else tasks
    surprises = covered = impossible = 0
    width = max((len(t.instance_id) for t in tasks), default=10)
    print(f"{'task':<{width}}  verdict   seconds  detail")
    for t in tasks:
        t0 = time.monotonic()
        verdict, detail = await check_task(t, backend)
        surprises += verdict != "ok"
        covered += "canaries: none" not in detail and verdict == "ok"
        impossible += "impossible: ok" in detail
        print(f"{t.instance_id:<{width}}  {verdict:<8}  {time.monotonic() - t0:7.1f}  {detail}", flush=True)
    print(f"{len(tasks) - surprises} ok, {surprises} surprises, {len(skipped)} rows skipped")
    print(f"canary coverage of {dataset}: {covered}/{len(tasks)} tasks with at least one gold-killed canary")
    print(f"impossible variants of {dataset}: {impossible}/{len(tasks)} kept (gold 0.0 on each)")
    return 1 if surprises or skipped or not tasks else 0
