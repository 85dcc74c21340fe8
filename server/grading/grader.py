"""`grade`: one grading of a model patch: its test run in a fresh sandbox, the empty patch's run (first, where the
task's run time is not measured yet; after, when the patch's run broke), and the canary run when the verdict would
be 1.0. `prepare`: what a task's first grading needs measured (run time, baseline, canaries), done once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import swe_gym_env.server.grading.canaries as canaries
import swe_gym_env.server.grading.runtimes as runtimes
import swe_gym_env.server.grading.store as store
from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.errors import BrokenRun, GradingError
from swe_gym_env.server.grading.files import BaseTree, filter_model_patch, split_patch
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    JUNIT_LIMIT,
    START,
    Plan,
    _swebench_loaded,
    load_swebench,
    plan_for,
    row_test_spec,
)
from swe_gym_env.server.grading.runtimes import _BASELINE_LOCKS, _task_key
from swe_gym_env.server.grading.script import (
    GRADING_DIR,
    NORMALISE,
    RESOLVE_FAILED,
    TESTS_DIR,
    TESTS_STEP,
    Guarded,
    PytestCommand,
    eval_script,
    guard_row_script,
    pad_pair,
    row_eval_wrapper,
)
from swe_gym_env.server.grading.taskenv import ensure_env
from swe_gym_env.server.grading.verdict import Grade, Run, _failed_report, judge, parse_junit
from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.envs import EnvError
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
BROKE = "broke: the canary run left nothing to grade"


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
    test_files: dict[str, bytes] | None = None,
) -> Run:
    """One test run in a fresh sandbox. ``test_files`` (path -> bytes) go in place of the test patch's files right
    after it is applied (`script.TESTS_STEP`): the test patch's own text padded in a main run, the mutants padded to
    the same length in a canary run, the mutants alone while canaries are built."""
    guard = Guarded.new(junit=plan.cross_check == "node_ids") if plan.cross_check != "not_pytest" else None
    row_script, first = _row_script(task, spec, guard, test_files)
    sbx = await make_sandbox()
    clock.lap("grade.sandbox")
    junit = junit_error = record = junit_bytes = None
    try:
        environment = await _ensure_env(sbx, task)
        clock.lap("grade.env")
        await _write_run(sbx, task, patch, test_files, guard, row_script, first)
        t0 = time.monotonic()
        res = await sbx.exec(f"bash {GRADING_DIR}/eval.sh", timeout=timeout_s)
        duration = time.monotonic() - t0
        clock.lap("grade.tests")
        if RESOLVE_FAILED in res.stdout:
            raise GradingError(f"pytest's setup could not be resolved at base_commit: {res.stdout[-600:]}")
        ran = START in res.stdout and APPLY_FAILED not in res.stdout and not res.timed_out
        if guard is not None and ran:
            junit_bytes, junit, junit_error, record = await _guard_outputs(sbx, guard)
    finally:
        clock.lap("grade.parse")  # the JUnit report and the record (or the step that failed)
        await sbx.close()
        clock.lap("grade.close")
    log = res.stdout + "\n" + res.stderr
    return Run(log, res.timed_out, timeout_s, duration, environment, junit, junit_error, record, junit_bytes)


def _row_script(
    task: Task, spec, guard: Guarded | None, test_files: dict[str, bytes] | None
) -> tuple[str | None, PytestCommand | None]:
    """The row's own eval script as a run gets it (None: the row has none, our script runs) and its first pytest
    command: every run's script the same text, canaries or not (`script.TESTS_STEP`)."""
    row_script = spec.eval_script if spec is not None else None  # type: ignore[attr-defined]
    if row_script is None:
        return None, None
    spliced = canaries.splice_row_script(row_script, task.test_files(), [TESTS_STEP, NORMALISE])
    if spliced is None and test_files:
        raise GradingError("the row's eval script does not apply its test patch in a heredoc: no canaries")
    return guard_row_script(spliced or row_script, guard)


async def _ensure_env(sbx: Sandbox, task: Task) -> str:
    """The task's environment in the sandbox (its name); a `GradingError` where it cannot be had."""
    try:
        return await ensure_env(sbx, task)
    except EnvError as e:
        raise GradingError(str(e)) from e


async def _write_run(
    sbx: Sandbox,
    task: Task,
    patch: str,
    test_files: dict[str, bytes] | None,
    guard: Guarded | None,
    row_script: str | None,
    first: PytestCommand | None,
) -> None:
    """A run's files into its sandbox: the two patches, the run's test files, the guard, the eval script."""
    await sbx.write_file(f"{GRADING_DIR}/model.patch", patch.encode())
    await sbx.write_file(f"{GRADING_DIR}/test.patch", task.test_patch.encode())
    for path, data in sorted((test_files or {}).items()):
        await sbx.write_file(f"{TESTS_DIR}/{path}", data)
    if guard is not None:
        await guard.install(sbx)
    if row_script is not None:
        await sbx.write_file(f"{GRADING_DIR}/row_eval.sh", row_script.encode(), 0o700)
        script = row_eval_wrapper(task, bool(patch.strip()), first)
    else:
        script = eval_script(task, bool(patch.strip()), guard)
    await sbx.write_file(f"{GRADING_DIR}/eval.sh", script.encode(), 0o700)


async def _guard_outputs(
    sbx: Sandbox, guard: Guarded
) -> tuple[bytes | None, dict[tuple[str, str], str] | None, str | None, integrity.Record | None]:
    """What a guarded run left: the JUnit report (its bytes, its statuses, or why it is unreadable) and the guard's
    verified record (None: the launcher never started, or the record was removed)."""
    junit_bytes = junit = junit_error = None
    if guard.junit:
        try:
            junit_bytes = await sbx.read_file(guard.junit_path, JUNIT_LIMIT)
            junit = parse_junit(junit_bytes)
        except Exception as e:
            junit_error = f"{type(e).__name__}: {e}"
    try:
        record = integrity.read_record(await sbx.read_file(guard.record_path, integrity.RECORD_LIMIT), guard.key)
    except Exception:
        record = None  # no record: the launcher never started, or the record was removed
    return junit_bytes, junit, junit_error, record


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
    empty patch had to run, `grade.canaries` for the canary check, `grade.base` for base_commit's tree, measured
    once). ``cache_key`` names the sandbox kind for the per-task measurements (run time, baseline, base tree).
    ``deadline_s``: the seconds the caller has left; every test run's timeout is capped by it (keeping `RESERVE_S`).
    ``use_canaries``: run the canary check on a 1.0 (building the task's canaries first where they are not built
    yet). ``variant_of``: ``task`` is a variant of this task (`variants.impossible`): the runtime events its gold
    runs showed are the ones allowed, and there is no canary check (its tests are the canaries already)."""
    clock = _Clock(timings)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    ctx = await _grading(task, make_sandbox, timeout_s, cache_key, clock, deadline)
    clock.lap("grade.imports")
    tree = await base_tree(ctx)
    clock.lap("grade.base")
    patch, dropped = filter_model_patch(model_patch, task, tree)
    touched = {p for _, section in split_patch(patch) for p in integrity.section_paths(section)}
    entry = await _canaries_for(ctx) if use_canaries and variant_of is None else None
    events = _gold_events(variant_of or task)
    gold = _gold_statuses(variant_of or task) if variant_of is None else {}
    if patch.strip() and runtimes.runtime(task, cache_key) is None:
        await _baseline(ctx)  # the empty patch's run first: its run time sizes this run's timeout
    pair = _canary_pair(entry)
    # which of the two runs goes first is a coin's: no order to tell them apart by
    canary_first = pair is not None and bool(patch.strip()) and secrets.randbelow(2) == 1
    early = await _check_canaries(ctx, patch, touched, None, events, gold) if canary_first else None
    if early is not None and early.report.canaries != BROKE:  # a broken one counts only where the main run gets 1.0
        early.dropped_files = list(dict.fromkeys(dropped))
        return early
    run = await _run_tests(task, patch, make_sandbox, ctx.plan, ctx.spec, ctx.limit(), clock, pair[0] if pair else None)
    try:
        g = judge(task, run, ctx.swebench, ctx.plan, touched, events, gold)
    except BrokenRun as e:
        g = await _broken_main_run(ctx, patch, run, e)
    else:
        _record_main_run(ctx, patch, run)
        if g.reward == 1.0 and entry is not None:
            if early is not None:  # the canary run went first and broke
                g = early
            elif canary_first:
                g.report = g.report.model_copy(update={"canaries": _held(entry)})
            else:
                g = await _check_canaries(ctx, patch, touched, g, events, gold) or g
    g.dropped_files = list(dict.fromkeys(dropped))
    clock.lap("grade.parse")
    return g


async def _grading(
    task: Task,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    timeout_s: float,
    cache_key: str,
    clock: _Clock,
    deadline: float | None,
) -> _Grading:
    """What the runs of one grading share: swebench loaded (in a thread the first time), the task's plan and spec."""
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    return _Grading(task, make_sandbox, swebench, plan, spec, timeout_s, cache_key, clock, deadline)


async def _canaries_for(ctx: _Grading) -> dict | None:
    """The task's stored canaries, built first at their first use (`prepare` does it outside a rollout's deadline):
    before the model's run, as building them also measures the gold patch's statuses and events."""
    task, clock = ctx.task, ctx.clock
    if _stored_canaries(task) is None:
        t = time.monotonic()
        await task_canaries(ctx)
        if clock.timings is not None:
            clock.timings["grade.prepare"] = clock.timings.get("grade.prepare", 0.0) + time.monotonic() - t
        clock.t = time.monotonic()
    return _stored_canaries(task)


async def _broken_main_run(ctx: _Grading, patch: str, run: Run, e: BrokenRun) -> Grade:
    """The grade of a model patch whose run left nothing to grade: the patch's fault (a 0.0) only where the empty
    patch's run completes and the deadline did not cut the run short; a `GradingError` (infra) otherwise."""
    task, key, how = ctx.task, ctx.cache_key, str(e)
    if not patch.strip():
        if ctx.cut_short(run) is None:
            runtimes.record_baseline(task, key, how)
        raise GradingError(how) from e
    why = await _baseline(ctx)
    if why is not None:
        raise GradingError(f"{how} (the empty patch's run broke too: {why}: infra, not the patch)") from e
    if (short := ctx.cut_short(run)) is not None:
        raise GradingError(short) from e
    return _broke(task, ctx.plan, run, how)


def _record_main_run(ctx: _Grading, patch: str, run: Run) -> None:
    """A completed run's measurements: the task's run time, and the baseline where the patch was empty."""
    if not run.timed_out:
        runtimes.record_runtime(ctx.task, ctx.cache_key, run.duration_s)
    if not patch.strip():
        runtimes.record_baseline(ctx.task, ctx.cache_key, None)


# -- base_commit's tree ----------------------------------------------------------------------------------------------
_BASE_SCRIPT = r"""
import json, os, pkgutil, subprocess, sys
out = subprocess.check_output(["git", "ls-tree", "-r", "-z", "--name-only", sys.argv[1]])
files = [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]
here = os.path.dirname(os.path.abspath(sys.argv[0]))
names = set(sys.builtin_module_names)
names.update(m[1] for m in pkgutil.iter_modules([p for p in sys.path if os.path.abspath(p or ".") != here]))
configs = {}
for p in files:
    if os.path.basename(p) in ("pyproject.toml", "setup.cfg", "tox.ini") and len(configs) < 64:
        try:
            if os.path.getsize(p) < 262144:
                with open(p, "rb") as f:
                    configs[p] = f.read().decode("utf-8", "replace")
        except OSError:
            pass
with open(sys.argv[2], "w") as f:
    json.dump({"files": files, "importable": sorted(names), "configs": configs}, f)
"""
_BASE_LIMIT = 32 * 1024 * 1024
_TREES: dict[tuple, BaseTree] = {}


async def base_tree(ctx: _Grading) -> BaseTree:
    """base_commit's files, its configuration files' text, and the top-level names the task's environment imports
    (what a new module must not be named), measured once per task, image and sandbox kind in a sandbox at
    base_commit (kept on disk)."""
    task, key = ctx.task, ctx.cache_key
    mem = _task_key(task, key)
    if (tree := _TREES.get(mem)) is not None:
        return tree
    where = runtimes._where(task, key)
    stored = store.load(task).get("trees", {}).get(where)
    if not isinstance(stored, dict):
        stored = await _measure_base(ctx)
        store.update(task, lambda data: data.setdefault("trees", {}).__setitem__(where, stored))
    tree = BaseTree.of(list(stored["files"]), list(stored["importable"]), dict(stored["configs"]))
    if len(_TREES) > 256:
        _TREES.clear()
    _TREES[mem] = tree
    return tree


async def _measure_base(ctx: _Grading) -> dict:
    task, q = ctx.task, shlex.quote
    sbx = await ctx.make_sandbox()
    try:
        await _ensure_env(sbx, task)
        await sbx.write_file(f"{GRADING_DIR}/base.py", _BASE_SCRIPT.encode())
        script = "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                f'"$(command -v python || command -v python3)" {GRADING_DIR}/base.py {q(task.base_commit)} '
                f"{GRADING_DIR}/base.json",
            ]
        )
        res = await sbx.exec(script, timeout=300)
        if not res.ok:
            raise GradingError(f"base_commit's tree could not be listed: {(res.stdout + res.stderr)[-500:]}")
        data = json.loads(await sbx.read_file(f"{GRADING_DIR}/base.json", _BASE_LIMIT))
    finally:
        await sbx.close()
    if not (isinstance(data, dict) and all(isinstance(data.get(k), list | dict) for k in ("files", "importable"))):
        raise GradingError("base_commit's tree listing is malformed")
    return data


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
        await sbx.write_file(f"{GRADING_DIR}/test.patch", task.test_patch.encode())
        res = await sbx.exec(f"cd {q(task.workdir)} && git apply {GRADING_DIR}/test.patch", timeout=120)
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


def _encoded(files: dict[str, str] | None) -> dict[str, bytes] | None:
    return {path: text.encode() for path, text in files.items()} if files else None


async def _build_canaries(ctx: _Grading) -> dict:
    """Mutants the gold patch fails twice, a round per candidate (every target's next mutation at once), after one
    plain gold run that measures the gold patch's status of every listed test (a test counts as passing only as gold
    passed it) and its runtime events (allowed when judging a model patch), as every gold run does."""
    task = ctx.task
    tree = await base_tree(ctx)
    gold, dropped = filter_model_patch(task.patch, task, tree)
    if dropped:
        return _no_canaries(f"the gold patch itself loses {dropped[:5]} to the file filter", set(), {})
    touched = {p for _, section in split_patch(gold) for p in integrity.section_paths(section)}
    events: set[str] = set()
    gold_runs = functools.partial(_gold_runs, ctx, gold, touched, events)
    plain = await gold_runs(None, 1)
    if isinstance(plain, str):
        return _no_canaries(plain, events, {})
    statuses = dict(plain[0].statuses)
    files, targets, why = await _canary_targets(ctx)
    if not targets:
        return _no_canaries(why, events, statuses)
    got = await _gold_killed(files, targets, gold_runs)
    if isinstance(got, str):
        return _no_canaries(got, events, statuses)
    kept, killed = got
    if not kept:
        return _no_canaries("the gold patch passes every mutant tried", events, statuses)
    mutants = canaries.round_files(files, kept)
    return {
        "tests": killed,
        "files": mutants,
        "originals": {path: files[path] for path in mutants},  # the test patch's text: an impossible variant's base
        "sites": [f"{t.path}::{t.name} {s.what}" for t, s in kept],
        "why": None,
        "events": sorted(events),
        "gold": statuses,
    }


async def _gold_runs(
    ctx: _Grading, gold: str, touched: set[str], events: set[str], mutated: dict[str, str] | None, n: int
) -> list[Grade] | str:
    """``n`` gold runs at once, with ``mutated`` in place of the test files where given (a str: why the runs are no
    use); the runtime events they show go into ``events``."""
    task = ctx.task
    runs = await asyncio.gather(
        *[
            _run_tests(task, gold, ctx.make_sandbox, ctx.plan, ctx.spec, ctx.timeout_s, _Clock(None), _encoded(mutated))
            for _ in range(n)
        ]
    )
    grades = []
    for run in runs:
        events.update(_run_events(run))
        try:
            g = judge(task, run, ctx.swebench, ctx.plan, touched, frozenset(events))
        except BrokenRun as e:
            return f"the gold patch's run broke: {str(e)[:300]}"
        if g.report.integrity != "clean":
            return f"the gold patch's run was not clean: {g.report.integrity[:300]}"
        grades.append(g)
    return grades


async def _canary_targets(ctx: _Grading) -> tuple[dict[str, str], list[canaries.Target], str | None]:
    """The test patch's Python files and the FAIL_TO_PASS tests' targets in them (none: why not)."""
    task = ctx.task
    if task.eval_script and canaries.splice_row_script(task.eval_script, task.test_files(), [TESTS_STEP]) is None:
        return {}, [], "the row's eval script does not apply its test patch in a heredoc"
    files = await _test_files(ctx)
    targets, why = canaries.targets(list(task.FAIL_TO_PASS), files)
    return files, targets, why


async def _gold_killed(
    files: dict[str, str],
    targets: list[canaries.Target],
    gold_runs: Callable[[dict[str, str] | None, int], Awaitable[list[Grade] | str]],
) -> tuple[list[tuple[canaries.Target, canaries.Site]], list[str]] | str:
    """The mutations the gold patch fails in both of two runs, and the test ids they kill: a round per candidate
    site, every pending target's next one at once (a str: why the gold runs are no use)."""
    kept: list[tuple[canaries.Target, canaries.Site]] = []
    killed: list[str] = []
    pending = targets
    for r in range(canaries.ROUNDS):
        chosen = [(t, t.sites[r]) for t in pending if len(t.sites) > r]
        if not chosen:
            break
        got = await gold_runs(canaries.round_files(files, chosen), 2)
        if isinstance(got, str):
            return got
        dead = set(got[0].report.fail_to_pass["failure"]) & set(got[1].report.fail_to_pass["failure"])
        for target, site in chosen:
            ids = [i for i in target.ids if i in dead]
            if ids:
                kept.append((target, site))
                killed += ids
        pending = [t for t in pending if not any(t is k for k, _ in kept)]
    return kept, killed


def _no_canaries(why: str | None, events: set[str], statuses: dict[str, str]) -> dict:
    return {"tests": [], "files": {}, "sites": [], "events": sorted(events), "why": why, "gold": statuses}


def _gold_statuses(task: Task) -> dict[str, str]:
    """The gold patch's status of each listed test, measured with the canaries (empty: not measured)."""
    gold = (_stored_canaries(task) or {}).get("gold")
    return {str(k): str(v) for k, v in gold.items()} if isinstance(gold, dict) else {}


def _canary_pair(entry: dict | None) -> tuple[dict[str, bytes], dict[str, bytes]] | None:
    """(main run's test files, canary run's): the test patch's text and the mutants, each pair padded to one length
    (None: the task has no canaries)."""
    if not entry or not entry.get("tests") or not isinstance(entry.get("originals"), dict):
        return None
    main, canary = {}, {}
    for path, mutant in entry["files"].items():
        original = entry["originals"].get(path)
        if not isinstance(original, str) or not isinstance(mutant, str):
            return None
        main[path], canary[path] = pad_pair(original, mutant)
    return main, canary


def _held(entry: dict) -> str:
    return f"held: {len(entry['tests'])} gold-killed mutant test(s) failed: {entry['sites'][:3]}"[:2000]


async def _check_canaries(
    ctx: _Grading,
    patch: str,
    touched: set[str],
    g: Grade | None,
    events: frozenset[str],
    gold: dict[str, str],
) -> Grade | None:
    """The canary run, in a fresh sandbox with the mutants in place of the originals (padded to the originals'
    length). With ``g`` (the main run's 1.0): the grade that stands. Without (the canary run went first): the 0.0
    it found, or None where every canary failed (the main run decides)."""
    task = ctx.task
    t = time.monotonic()
    try:
        entry = await task_canaries(ctx)
        pair = _canary_pair(entry)
        if pair is None:
            if g is not None:
                g.report = g.report.model_copy(update={"canaries": f"none ({entry.get('why')})"[:2000]})
            return g
        run = await _run_tests(task, patch, ctx.make_sandbox, ctx.plan, ctx.spec, ctx.limit(), ctx.clock, pair[1])
        try:
            g2 = judge(task, run, ctx.swebench, ctx.plan, touched, events, gold)
        except BrokenRun as e:
            if (short := ctx.cut_short(run)) is not None:
                raise GradingError(f"canary run: {short}") from e
            broke = _broke(task, ctx.plan, run, f"the canary run broke (the gold patch's completes): {e}")
            broke.report = broke.report.model_copy(update={"canaries": BROKE})
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
        if g is not None:
            g.report = g.report.model_copy(update={"canaries": _held(entry)})
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
    """Measure what grading this task needs and this host lacks: base_commit's tree, the empty patch's run (run time,
    baseline) and the canaries. Once per task, image and sandbox kind (kept on disk); a caller runs it outside a
    rollout's deadline (the server's setup, not the rollout's time)."""
    need_runtime = runtimes.runtime(task, cache_key) is None or not runtimes.baseline(task, cache_key)[0]
    need_canaries = use_canaries and _stored_canaries(task) is None
    need_tree = not _has_tree(task, cache_key)
    if not (need_runtime or need_canaries or need_tree):
        return
    ctx = await _grading(task, make_sandbox, timeout_s, cache_key, _Clock(None), None)
    await base_tree(ctx)
    if need_runtime:
        await _baseline(ctx)
    if need_canaries:
        await task_canaries(ctx)


def prepared(task: Task, cache_key: str = "", use_canaries: bool = True) -> bool:
    """Whether `prepare` has nothing left to do for this task here."""
    return (
        runtimes.runtime(task, cache_key) is not None
        and runtimes.baseline(task, cache_key)[0]
        and _has_tree(task, cache_key)
        and (not use_canaries or _stored_canaries(task) is not None)
    )


def _has_tree(task: Task, cache_key: str) -> bool:
    """Whether base_commit's tree is measured for this task and sandbox kind (in memory or on disk)."""
    if _task_key(task, cache_key) in _TREES:
        return True
    return isinstance(store.load(task).get("trees", {}).get(runtimes._where(task, cache_key)), dict)


async def prepare_impossible(
    task: Task, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout_s: float = 300.0, cache_key: str = ""
) -> None:
    """What `variants.impossible(task)` reads, built where missing: the task's canaries (as `prepare` builds them,
    whatever the server's canary setting) and the test patch's text of each mutated file (a record built before
    impossible variants lacks it: read once from a sandbox at base_commit with the test patch applied)."""
    entry = _stored_canaries(task)
    if entry is not None and (not entry["tests"] or isinstance(entry.get("originals"), dict)):
        return
    ctx = await _grading(task, make_sandbox, timeout_s, cache_key, _Clock(None), None)
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
