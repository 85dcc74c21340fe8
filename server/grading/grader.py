"""`grade`: one grading of a model patch: its test run in a fresh sandbox, the empty patch's run (first, where the
task's run time is not measured yet; after, when the patch's run broke), and the canary run when the verdict would
be 1.0. `prepare`: what a task's first grading needs measured (run time, baseline, canaries), done once."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import swe_gym_env.server.grading.canaries as canaries
import swe_gym_env.server.grading.runtimes as runtimes
import swe_gym_env.server.grading.store as store
from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.errors import BrokenRun, GradingError
from swe_gym_env.server.grading.files import filter_model_patch, pinned_configs, split_patch
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    GUARD_MODULE,
    JUNIT_LIMIT,
    PINNED,
    START,
    Plan,
    _swebench_loaded,
    load_swebench,
    plan_for,
    row_test_spec,
)
from swe_gym_env.server.grading.runtimes import _BASELINE_LOCKS, _task_key
from swe_gym_env.server.grading.script import CANARY_DIR, CANARY_STEP, Guarded, eval_script, row_eval_wrapper
from swe_gym_env.server.grading.verdict import Grade, Run, _failed_report, judge, parse_junit
from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.envs import EnvError, ensure_env
from swe_gym_env.tasks.models import Task
from swe_gym_env.wire import Finding


class _Clock:
    """Laps of one grading run into a timings dict (nothing when there is none)."""

    def __init__(self, timings: dict[str, float] | None) -> None:
        self.timings = timings
        self.t = time.monotonic()

    def lap(self, key: str) -> None:
        now = time.monotonic()
        if self.timings is not None:
            self.timings[key] = self.timings.get(key, 0.0) + now - self.t
        self.t = now


RESERVE_S = 8.0  # of a rollout's remaining deadline (at least; a quarter where more is left), kept for a grading
# sandbox's start and close and the parse
BLAME_MULTIPLE = 4.0  # a run cut by the deadline is the patch's fault only where it had this many base run times
_CANARY_LOCKS: dict[tuple, asyncio.Lock] = {}


def _left(deadline: float) -> float:
    """A test run's share of what the deadline leaves (the rest: its sandbox's start and close, the parse)."""
    left = deadline - time.monotonic()
    return max(1.0, left - max(RESERVE_S, 0.25 * left))


@dataclass
class _Grading:
    """What the runs of one grading share."""

    task: Task
    make_sandbox: Callable[[], Awaitable[Sandbox]]
    swebench: object
    plan: Plan
    spec: object | None
    timeout_s: float
    cache_key: str
    clock: _Clock
    deadline: float | None  # monotonic: the rollout's end (None: no deadline but timeout_s)

    def limit(self) -> float:
        """A test run's timeout: the measured one (or timeout_s), capped by what the deadline leaves."""
        t = runtimes.test_timeout(self.task, self.timeout_s, self.cache_key)
        if self.deadline is not None:
            t = min(t, _left(self.deadline))
        return t

    def cut_short(self, run: Run) -> str | None:
        """Why a timed-out run cannot be blamed on the patch: the deadline cut its timeout below what the task's
        measured run time allows (None: it can)."""
        if not run.timed_out or self.deadline is None or run.timeout_s >= self.timeout_s - 0.5:
            return None
        seen = runtimes.runtime(self.task, self.cache_key)
        if seen is not None and run.timeout_s >= min(runtimes.measured_timeout(seen), BLAME_MULTIPLE * seen):
            return None
        took = f"{seen:.1f}s" if seen is not None else "unmeasured"
        return (
            f"tests timed out after {run.timeout_s:.0f}s, all that the rollout's deadline left for grading: too short "
            f"to blame the patch (the task's complete run takes {took}); give the rollout a longer deadline_s"
        )


async def _run_tests(
    task: Task,
    patch: str,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    plan: Plan,
    spec,
    timeout_s: float,
    clock: _Clock,
    canary_files: dict[str, str] | None = None,
) -> Run:
    """One test run in a fresh sandbox; with ``canary_files`` (path -> mutated text), the mutants go in place of the
    test patch's files right after it is applied (our script), or after its heredoc (a row's own script)."""
    guard = Guarded.new(junit=plan.cross_check == "node_ids") if plan.cross_check != "not_pytest" else None
    row_script = spec.eval_script if spec is not None else None  # type: ignore[attr-defined]
    if row_script is not None:  # every run's script the same text, canaries or not (`script.CANARY_STEP`)
        spliced = canaries.splice_row_script(row_script, task.test_files(), [CANARY_STEP])
        if spliced is None and canary_files:
            raise GradingError("the row's eval script does not apply its test patch in a heredoc: no canaries")
        row_script = spliced or row_script
    sbx = await make_sandbox()
    clock.lap("grade.sandbox")
    junit = junit_error = record = junit_bytes = None
    try:
        try:
            environment = await ensure_env(sbx, task)
        except EnvError as e:
            raise GradingError(str(e)) from e
        clock.lap("grade.env")
        pinned = pinned_configs(patch)
        await sbx.write_file("/tmp/grading/model.patch", patch.encode())
        await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
        for path, text in (canary_files or {}).items():  # mutants in place of originals: `script.CANARY_STEP`
            await sbx.write_file(f"{CANARY_DIR}/{path}", text.encode())
        if pinned:
            await sbx.write_file("/tmp/grading/pin.py", integrity.PIN_SCRIPT.encode())
        if guard is not None:
            await sbx.write_file(f"{guard.dir}/{GUARD_MODULE}.py", integrity.guard_plugin_source())
            await sbx.write_file(f"{guard.dir}/key", guard.key, 0o600)
        if row_script is not None:
            await sbx.write_file("/tmp/grading/row_eval.sh", row_script.encode(), 0o700)
            script = row_eval_wrapper(task, bool(patch.strip()), guard, pinned)
        else:
            script = eval_script(task, bool(patch.strip()), guard, pinned)
        await sbx.write_file("/tmp/grading/eval.sh", script.encode(), 0o700)
        t0 = time.monotonic()
        res = await sbx.exec("bash /tmp/grading/eval.sh", timeout=timeout_s)
        duration = time.monotonic() - t0
        clock.lap("grade.tests")
        ran = START in res.stdout and APPLY_FAILED not in res.stdout and not res.timed_out
        if guard is not None and ran:
            if guard.junit:
                try:
                    junit_bytes = await sbx.read_file(guard.junit_path, JUNIT_LIMIT)
                    junit = parse_junit(junit_bytes)
                except Exception as e:
                    junit_error = f"{type(e).__name__}: {e}"
            try:
                record = integrity.read_record(
                    await sbx.read_file(guard.record_path, integrity.RECORD_LIMIT), guard.key
                )
            except Exception:
                record = None  # no record: the guard never started (not pytest) or the record was removed
    finally:
        clock.lap("grade.parse")  # the JUnit report and the record (or the step that failed)
        await sbx.close()
        clock.lap("grade.close")
    log = res.stdout + "\n" + res.stderr
    return Run(log, res.timed_out, timeout_s, duration, environment, junit, junit_error, record, junit_bytes)


def _broke(task: Task, plan: Plan, run: Run, how: str) -> Grade:
    return Grade(
        reward=0.0,
        report=_failed_report(task, plan, run.environment, run.log, f"patch_broke_run: {how}"[:2000]),
        dropped_files=[],
        findings=[Finding(severity="warning", code="patch_broke_test_run", message=how[:2000])],
    )


def _gold_events(task: Task) -> frozenset[str]:
    """The runtime events the gold patch's runs showed (stored with the canaries)."""
    events = store.load(task).get("canaries", {}).get("events", [])
    return frozenset(e for e in events if isinstance(e, str)) if isinstance(events, list) else frozenset()


async def grade(
    task: Task,
    model_patch: str,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    timeout_s: float = 300.0,
    timings: dict[str, float] | None = None,
    cache_key: str = "",
    deadline_s: float | None = None,
    use_canaries: bool = True,
    variant_of: Task | None = None,
) -> Grade:
    """Grade ``model_patch`` on ``task`` in a sandbox from ``make_sandbox``. Where ``timings`` is given, the seconds
    of each step go into it under `grade.*` (imports, sandbox, env, tests, close, parse; `grade.baseline` when the
    empty patch had to run, `grade.canaries` for the canary check). ``cache_key`` names the sandbox kind for the
    per-task measurements (run time, baseline). ``deadline_s``: the seconds the caller has left; every test run's
    timeout is capped by it (keeping `RESERVE_S`). ``use_canaries``: run the canary check on a 1.0 (building the
    task's canaries first where they are not built yet). ``variant_of``: ``task`` is a variant of this task
    (`variants.impossible`): the runtime events its gold runs showed are the ones allowed, and there is no canary
    check (its tests are the canaries already)."""
    clock = _Clock(timings)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    patch, dropped = filter_model_patch(model_patch, task)
    touched = {p for _, section in split_patch(patch) for p in integrity.section_paths(section)}
    ctx = _Grading(task, make_sandbox, swebench, plan, spec, timeout_s, cache_key, clock, deadline)
    clock.lap("grade.imports")
    use_canaries = use_canaries and variant_of is None
    if use_canaries and _stored_canaries(task) is None:  # first use (`prepare` does it outside a rollout's deadline)
        t = time.monotonic()
        await task_canaries(ctx)  # before the model's run: it also measures the gold patch's runtime events
        if timings is not None:
            timings["grade.prepare"] = timings.get("grade.prepare", 0.0) + time.monotonic() - t
        clock.t = time.monotonic()
    events = _gold_events(variant_of or task)
    if patch.strip() and runtimes.runtime(task, cache_key) is None:
        await _baseline(ctx)  # the empty patch's run first: its run time sizes this run's timeout
    run = await _run_tests(task, patch, make_sandbox, plan, spec, ctx.limit(), clock)
    try:
        g = judge(task, run, swebench, plan, touched, events)
    except BrokenRun as e:
        how = str(e)
        if not patch.strip():
            if ctx.cut_short(run) is None:
                runtimes.record_baseline(task, cache_key, how)
            raise GradingError(how) from e
        why = await _baseline(ctx)
        if why is not None:
            raise GradingError(f"{how} (the empty patch's run broke too: {why}: infra, not the patch)") from e
        if (short := ctx.cut_short(run)) is not None:
            raise GradingError(short) from e
        g = _broke(task, plan, run, how)
    else:
        if not run.timed_out:
            runtimes.record_runtime(task, cache_key, run.duration_s)
        if not patch.strip():
            runtimes.record_baseline(task, cache_key, None)
        if g.reward == 1.0 and use_canaries:
            g = await _check_canaries(ctx, patch, touched, g, events)
    # the patch's changes to pytest's settings that grading reset (pytest.ini-style files are dropped above)
    pinned = [line[len(PINNED) :].strip() for line in run.log.splitlines() if line.startswith(PINNED)]
    g.dropped_files = list(dict.fromkeys([*dropped, *pinned]))
    clock.lap("grade.parse")
    return g


async def _baseline(ctx: _Grading) -> str | None:
    """Why the empty patch's run of this task breaks (None: it reports results), measured once per task, image and
    sandbox kind (kept on disk), however many gradings wait for it."""
    task, key = ctx.task, ctx.cache_key
    known, why = runtimes.baseline(task, key)
    if known:
        return why
    lock = _BASELINE_LOCKS.setdefault((*_task_key(task, key), id(asyncio.get_running_loop())), asyncio.Lock())
    async with lock:
        known, why = runtimes.baseline(task, key)
        if known:  # another grading's run paid for it meanwhile
            return why
        return await _run_baseline(ctx)


async def _run_baseline(ctx: _Grading) -> str | None:
    task, key = ctx.task, ctx.cache_key
    t = time.monotonic()
    limit = ctx.timeout_s
    if ctx.deadline is not None:
        limit = min(limit, _left(ctx.deadline))
    run = await _run_tests(task, "", ctx.make_sandbox, ctx.plan, ctx.spec, limit, _Clock(None))
    try:
        judge(task, run, ctx.swebench, ctx.plan, set())
        why = None
        if not run.timed_out:
            runtimes.record_runtime(task, key, run.duration_s)
    except (BrokenRun, GradingError) as e:
        why = str(e)
    if not (run.timed_out and limit < ctx.timeout_s):  # a run the deadline cut says nothing lasting
        runtimes.record_baseline(task, key, why)
    clock = ctx.clock
    if clock.timings is not None:
        clock.timings["grade.baseline"] = clock.timings.get("grade.baseline", 0.0) + time.monotonic() - t
    clock.t = time.monotonic()
    return why


# -- canaries ------------------------------------------------------------------------------------------------------


def _stored_canaries(task: Task) -> dict | None:
    entry = store.load(task).get("canaries")
    if isinstance(entry, dict) and isinstance(entry.get("tests"), list) and isinstance(entry.get("files"), dict):
        return entry
    return None


async def task_canaries(ctx: _Grading) -> dict:
    """The task's canaries ({"tests", "files", "sites", "why", "events"}), built once (this process: an asyncio
    lock; other processes: the task's file lock) and kept on disk."""
    task = ctx.task
    if (entry := _stored_canaries(task)) is not None:
        return entry
    lock = _CANARY_LOCKS.setdefault((store.task_digest(task), id(asyncio.get_running_loop())), asyncio.Lock())
    async with lock:
        if (entry := _stored_canaries(task)) is not None:
            return entry
        held = store.locked(task, "build")
        await asyncio.to_thread(held.__enter__)
        try:
            if (entry := _stored_canaries(task)) is not None:
                return entry
            t = time.monotonic()
            entry = await _build_canaries(ctx)
            entry["build_s"] = round(time.monotonic() - t, 2)
            store.update(task, lambda data: data.__setitem__("canaries", entry))
            return entry
        finally:
            held.__exit__(None, None, None)


async def _test_files(ctx: _Grading) -> dict[str, str]:
    """The test patch's Python files as the test patch leaves them (read from a sandbox at base_commit)."""
    task = ctx.task
    q = shlex.quote
    sbx = await ctx.make_sandbox()
    try:
        await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
        res = await sbx.exec(f"cd {q(task.workdir)} && git apply /tmp/grading/test.patch", timeout=120)
        if not res.ok:
            raise GradingError(f"the test patch does not apply at base_commit: {res.stderr[-300:]}")
        files = {}
        for path in task.test_files():
            if path.endswith(".py") and not path.startswith("/") and ".." not in path.split("/"):
                with contextlib.suppress(Exception):  # deleted by the test patch, or too large
                    data = await sbx.read_file(f"{task.workdir}/{path}", canaries.MAX_FILE_BYTES)
                    files[path] = data.decode()
        return files
    finally:
        await sbx.close()


def _run_events(run: Run) -> set[str]:
    """The runtime record's event keys of one run (none where the run left no record)."""
    if run.record is None:
        return set()
    return set(integrity.runtime_events(run.record))


async def _build_canaries(ctx: _Grading) -> dict:
    """Mutants the gold patch fails twice, a round per candidate (every target's next mutation at once); the gold
    runs also measure the runtime events the gold patch shows (allowed when judging a model patch). A task with no
    mutant still gets one gold run, for its events."""
    task = ctx.task
    gold, _ = filter_model_patch(task.patch, task)
    touched = {p for _, section in split_patch(gold) for p in integrity.section_paths(section)}
    events: set[str] = set()

    async def gold_runs(mutated: dict[str, str] | None, n: int) -> list[set[str]] | str:
        """The failed FAIL_TO_PASS ids of ``n`` gold runs at once (a str: why the runs are no use)."""
        runs = await asyncio.gather(
            *[
                _run_tests(task, gold, ctx.make_sandbox, ctx.plan, ctx.spec, ctx.timeout_s, _Clock(None), mutated)
                for _ in range(n)
            ]
        )
        failed = []
        for run in runs:
            seen = _run_events(run)
            events.update(seen)
            try:
                g = judge(task, run, ctx.swebench, ctx.plan, touched, frozenset(events))
            except BrokenRun as e:
                return f"the gold patch's run broke: {str(e)[:300]}"
            if g.report.integrity != "clean":
                return f"the gold patch's run was not clean: {g.report.integrity[:300]}"
            failed.append(set(g.report.fail_to_pass["failure"]))
        return failed

    def none(why: str | None) -> dict:
        return {"tests": [], "files": {}, "sites": [], "events": sorted(events), "why": why}

    targets: list[canaries.Target] = []
    files: dict[str, str] = {}
    if task.eval_script and canaries.splice_row_script(task.eval_script, task.test_files(), [CANARY_STEP]) is None:
        why = "the row's eval script does not apply its test patch in a heredoc"
    else:
        files = await _test_files(ctx)
        targets, why = canaries.targets(list(task.FAIL_TO_PASS), files)
    if not targets:
        if hasattr(integrity, "runtime_events"):  # the gold patch's events, measured all the same
            got = await gold_runs(None, 1)
            if isinstance(got, str):
                return none(f"{why}; {got}")
        return none(why)
    kept: list[tuple[canaries.Target, canaries.Site]] = []
    killed: list[str] = []
    pending = targets
    for r in range(canaries.ROUNDS):
        chosen = [(t, t.sites[r]) for t in pending if len(t.sites) > r]
        if not chosen:
            break
        failed = await gold_runs(canaries.round_files(files, chosen), 2)
        if isinstance(failed, str):
            return none(failed)
        dead = failed[0] & failed[1]
        for target, site in chosen:
            ids = [i for i in target.ids if i in dead]
            if ids:
                kept.append((target, site))
                killed += ids
        pending = [t for t in pending if not any(t is k for k, _ in kept)]
    if not kept:
        return none("the gold patch passes every mutant tried")
    mutants = canaries.round_files(files, kept)
    return {
        "tests": killed,
        "files": mutants,
        "originals": {path: files[path] for path in mutants},  # the test patch's text: an impossible variant's base
        "sites": [f"{t.path}::{t.name} {s.what}" for t, s in kept],
        "why": None,
        "events": sorted(events),
    }


async def _check_canaries(ctx: _Grading, patch: str, touched: set[str], g: Grade, events: frozenset[str]) -> Grade:
    """The verdict 1.0 stands only if every canary fails: a second run in a fresh sandbox with the mutants in place
    of the originals."""
    task = ctx.task
    t = time.monotonic()
    try:
        entry = await task_canaries(ctx)
        if not entry["tests"]:
            g.report = g.report.model_copy(update={"canaries": f"none ({entry.get('why')})"[:2000]})
            return g
        run = await _run_tests(
            task, patch, ctx.make_sandbox, ctx.plan, ctx.spec, ctx.limit(), ctx.clock, entry["files"]
        )
        try:
            g2 = judge(task, run, ctx.swebench, ctx.plan, touched, events)
        except BrokenRun as e:
            if (short := ctx.cut_short(run)) is not None:
                raise GradingError(f"canary run: {short}") from e
            broke = _broke(task, ctx.plan, run, f"the canary run broke (the gold patch's completes): {e}")
            broke.report = broke.report.model_copy(update={"canaries": "broke: the canary run left nothing to grade"})
            return broke
        if g2.report.integrity != "clean":
            g2.report = g2.report.model_copy(update={"canaries": "tampered: in the canary run"})
            return g2
        passed = [i for i in entry["tests"] if i in g2.report.fail_to_pass["success"]]
        if passed:
            what = "; ".join(f"canary {i} passed" for i in passed[:5])
            return Grade(
                reward=0.0,
                report=_failed_report(task, ctx.plan, run.environment, run.log, f"tampered: {what}"[:2000]).model_copy(
                    update={"canaries": f"passed: {len(passed)} of {len(entry['tests'])}: {passed[:5]}"[:2000]}
                ),
                dropped_files=[],
                findings=[Finding(severity="warning", code="grading_tampered", message=what[:2000])],
            )
        held = f"held: {len(entry['tests'])} gold-killed mutant test(s) failed: {entry['sites'][:3]}"
        g.report = g.report.model_copy(update={"canaries": held[:2000]})
        return g
    finally:
        if ctx.clock.timings is not None:
            ctx.clock.timings["grade.canaries"] = ctx.clock.timings.get("grade.canaries", 0.0) + time.monotonic() - t
        ctx.clock.t = time.monotonic()


async def prepare(
    task: Task,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    timeout_s: float = 300.0,
    cache_key: str = "",
    use_canaries: bool = True,
) -> None:
    """Measure what grading this task needs and this host lacks: the empty patch's run (run time, baseline) and the
    canaries. Once per task, image and sandbox kind (kept on disk); a caller runs it outside a rollout's deadline
    (the server's setup, not the rollout's time)."""
    need_runtime = runtimes.runtime(task, cache_key) is None or not runtimes.baseline(task, cache_key)[0]
    need_canaries = use_canaries and _stored_canaries(task) is None
    if not (need_runtime or need_canaries):
        return
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    ctx = _Grading(task, make_sandbox, swebench, plan, spec, timeout_s, cache_key, _Clock(None), None)
    if need_runtime:
        await _baseline(ctx)
    if need_canaries:
        await task_canaries(ctx)


def prepared(task: Task, cache_key: str = "", use_canaries: bool = True) -> bool:
    """Whether `prepare` has nothing left to do for this task here."""
    return (
        runtimes.runtime(task, cache_key) is not None
        and runtimes.baseline(task, cache_key)[0]
        and (not use_canaries or _stored_canaries(task) is not None)
    )


async def prepare_impossible(
    task: Task, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout_s: float = 300.0, cache_key: str = ""
) -> None:
    """What `variants.impossible(task)` reads, built where missing: the task's canaries (as `prepare` builds them,
    whatever the server's canary setting) and the test patch's text of each mutated file (a record built before
    impossible variants lacks it: read once from a sandbox at base_commit with the test patch applied)."""
    entry = _stored_canaries(task)
    if entry is not None and (not entry["tests"] or isinstance(entry.get("originals"), dict)):
        return
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    ctx = _Grading(task, make_sandbox, swebench, plan, spec, timeout_s, cache_key, _Clock(None), None)
    entry = await task_canaries(ctx)
    if not entry["tests"] or isinstance(entry.get("originals"), dict):
        return
    files = await _test_files(ctx)
    originals = {path: files[path] for path in entry["files"] if path in files}

    def change(data: dict) -> None:
        stored = data.get("canaries")
        if isinstance(stored, dict) and stored.get("files") == entry["files"]:
            stored["originals"] = originals

    store.update(task, change)
