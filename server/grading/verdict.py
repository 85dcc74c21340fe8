"""The grade itself: swebench's verdict on a run's log, cross-checked with the JUnit report and the guard's record."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from typing import Literal

from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.errors import BrokenRun, GradingError
from swe_gym_env.server.grading.files import task_verdict_files
from swe_gym_env.server.grading.integrity import PASSING, Record
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    MISSING_DEPS,
    START,
    TEST_PATCH_FAILED,
    Plan,
    make_test_spec,
    plan_for,
)
from swe_gym_env.tasks.models import Task
from swe_gym_env.wire import Finding, TestReport


@dataclass
class Grade:
    reward: float
    report: TestReport
    dropped_files: list[str]
    findings: list[Finding | str] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)  # each listed test's status, as the verdict counted it


def junit_key(node_id: str) -> tuple[str, str]:
    """pytest node id → (classname, name) as pytest's JUnit XML writes them."""
    path, *rest = node_id.split("::")
    if not rest:
        return ("", node_id)
    module = path[:-3] if path.endswith(".py") else path
    return (".".join([module.replace("/", "."), *rest[:-1]]), rest[-1])


def parse_junit(xml: bytes) -> dict[tuple[str, str], str]:
    from defusedxml import ElementTree

    statuses: dict[tuple[str, str], str] = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None:
            status = "FAILED"
        elif case.find("error") is not None:
            status = "ERROR"
        elif (skipped := case.find("skipped")) is not None:
            status = "XFAIL" if (skipped.get("type") or "") == "pytest.xfail" else "SKIPPED"
        else:
            status = "PASSED"
        # A test with a teardown error appears twice; the worst outcome wins.
        if statuses.get(key) not in ("FAILED", "ERROR"):
            statuses[key] = status
    return statuses


DIAGNOSES = [
    (
        re.compile(r"error: unrecognized arguments: ([^\n]+)"),
        "pytest rejected the options {0} (from the repository's pytest configuration or the test command): the pytest "
        "plugin that provides them is not installed in the task's environment — declare it in "
        "install_config.pip_packages",
    ),
    (
        re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([^']+)'"),
        "the tests cannot import {0!r}: a dependency is missing from the task's environment",
    ),
    (
        re.compile(r"(?m): No module named ([\w.]+)$"),  # `python -m pytest` where pytest is not installed
        "{0!r} is not installed in the task's environment: declare it in install_config.pip_packages",
    ),
    (re.compile(r"(?m)^(?:\S+: )?(?:line \d+: )?(\S+): (?:command )?not found$"), "command not found: {0}"),
    (re.compile(r"swe-gym: task environment (\S+) is not built"), "the task's local environment {0} is not built"),
]


def diagnose(log: str) -> str:
    """Why a test run left nothing to grade, when the log says (a missing plugin, module or command)."""
    for rx, text in DIAGNOSES:
        if m := rx.search(log):
            return text.format(m.group(1).strip()) + ". "
    return ""


def _report(plan: Plan, environment: str, log: str, **fields) -> TestReport:
    return TestReport(
        log_tail=log[-4000:], graded_by=plan.graded_by, parser=plan.parser, environment=environment, **fields
    )


def _failed_report(task: Task, plan: Plan, environment: str, log: str, integrity_: str) -> TestReport:
    """Every listed test failed: the run the patch broke or tampered with reported nothing we can trust."""
    return _report(
        plan,
        environment,
        log,
        resolution="RESOLVED_NO",
        fail_to_pass={"success": [], "failure": list(task.FAIL_TO_PASS)},
        pass_to_pass={"success": [], "failure": list(task.PASS_TO_PASS)},
        integrity=integrity_,
    )


JunitCheck = Literal["match", "mismatch", "not_pytest", "ids_rewritten"]  # `TestReport.junit_cross_check`


def score_log(
    task: Task,
    log: str,
    swebench,
    junit: dict[tuple[str, str], str] | None = None,
    plan: Plan | None = None,
    environment: str = "",
    record: Record | None = None,
    touched: set[str] | None = None,
    junit_bytes: bytes | None = None,
    allowed_events: frozenset[str] = frozenset(),
    gold: dict[str, str] | None = None,
) -> Grade:
    """swebench's verdict on a log, cross-checked against the JUnit statuses and the guard's record when given.
    Tampering seen is a 0.0 with a `grading_tampered` finding; a log with nothing to parse is a `BrokenRun`.
    ``allowed_events``: the runtime events the gold patch's runs showed (measured with the canaries), not tampering.
    ``gold``: the gold patch's status of each listed test (measured with the canaries): a test gold passed counts as
    passing only where it PASSED here too (XFAIL, skipped or missing is failed, whatever raised it)."""
    plan = plan or plan_for(task, swebench)
    status_map, found = _logged_statuses(task, log, swebench)
    listed = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    guarded = record is not None and record.started and APPLY_FAILED not in log
    row_runner = junit is None and plan.graded_by == "eval_script" and not guarded  # a row script's own runner
    per_test = plan.cross_check == "node_ids" and not row_runner
    subfailed, own = _subtests_and_own(log, listed, plan, record if guarded else None, per_test)
    for t in subfailed:  # a failed subtest fails its test (pytest >= 9 may log the test itself PASSED)
        if status_map.get(t) in PASSING:
            status_map[t] = "FAILED"
    junit_by_id = {t: junit.get(junit_key(t), "") for t in listed} if per_test and junit is not None else None
    tampered: list[str] = []
    if guarded and record is not None:
        tampered += integrity.tampering(
            record,
            touched or set(),
            set(task_verdict_files(task)),
            listed,
            log,
            junit_bytes,
            own,
            {t: status_map.get(t, "") for t in listed} if found and per_test else None,
            junit_by_id,
            subfailed,
            # the one call site for the runtime record's gold events (integrity.runtime_events, measured by canaries)
            **({"allowed_events": allowed_events} if allowed_events else {}),
        )
    if not found and APPLY_FAILED not in log and not tampered:
        raise BrokenRun(f"the test run left no parsable results ({plan.parser}): {diagnose(log)}" + log[-800:])
    findings: list[Finding | str] = []
    cross_check = _cross_check(plan, log, junit, junit_by_id, found, listed, status_map, tampered, findings)
    if tampered:
        return _tampered_grade(task, plan, environment, log, tampered, cross_check)
    _count_as_gold(listed, status_map, gold or {}, findings)
    return _verdict(task, plan, environment, log, swebench, status_map, subfailed, findings, cross_check)


def _logged_statuses(task: Task, log: str, swebench) -> tuple[dict[str, str], bool]:
    """swebench's status of each test its parser finds in the log, and whether it found any."""
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        return swebench.get_logs_eval(make_test_spec(task, swebench), f.name)


def _subtests_and_own(
    log: str, listed: list[str], plan: Plan, record: Record | None, per_test: bool
) -> tuple[set[str], dict[str, str] | None]:
    """The listed tests with a failed subtest (the log's ``SUBFAILED`` lines, and the guard's record where it is
    trusted), and the record's status of each listed test where statuses are compared per test (else None)."""
    subfailed = integrity.subtest_failures(log, listed) if plan.cross_check != "not_pytest" else set()
    if record is None:
        return subfailed, None
    own_all, own_sub = integrity.guard_statuses(record)
    subfailed |= {t for t in listed if any(t == i or t.endswith("/" + i) for i in own_sub)}
    return subfailed, ({t: _own_status(own_all, t) for t in listed} if per_test else None)


def _cross_check(
    plan: Plan,
    log: str,
    junit: dict[tuple[str, str], str] | None,
    junit_by_id: dict[str, str] | None,
    found: bool,
    listed: list[str],
    status_map: dict[str, str],
    tampered: list[str],
    findings: list[Finding | str],
) -> JunitCheck | None:
    """What the JUnit report says of swebench's statuses. A test the log passes and the report does not is tampering
    (added to ``tampered``); one the report passes and the log parser missed, a finding (swebench's verdict kept)."""
    if plan.cross_check != "node_ids":
        return plan.cross_check
    if junit is None and plan.graded_by == "eval_script" and APPLY_FAILED not in log:
        return "not_pytest"  # the row's own script ran a runner that wrote no JUnit report
    if junit_by_id is None or not found:
        return None
    forged = [t for t in listed if status_map.get(t) in PASSING and junit_by_id[t] not in PASSING]
    if forged:
        tampered.append(f"the log reports {len(forged)} test(s) passing that the JUnit report does not: {forged[:5]}")
    missed = [t for t in listed if status_map.get(t) not in PASSING and junit_by_id[t] in PASSING]
    if missed and not forged:
        findings.append(f"JUnit reports passing tests the log parser missed (kept swebench's verdict): {missed[:5]}")
    return "mismatch" if missed else "match"


def _tampered_grade(
    task: Task, plan: Plan, environment: str, log: str, tampered: list[str], cross_check: JunitCheck | None
) -> Grade:
    """0.0 for a run the code under test tampered with: every listed test failed, a `grading_tampered` finding."""
    what = "; ".join(dict.fromkeys(tampered))
    report = _failed_report(task, plan, environment, log, f"tampered: {what}"[:2000])
    return Grade(
        reward=0.0,
        report=report.model_copy(update={"junit_cross_check": cross_check}),
        dropped_files=[],
        findings=[Finding(severity="warning", code="grading_tampered", message=what[:2000])],
    )


def _count_as_gold(
    listed: list[str], status_map: dict[str, str], gold: dict[str, str], findings: list[Finding | str]
) -> None:
    """A test the gold patch passed counts as passing only where it PASSED here too: XFAIL or skipped is failed (a
    test not run at all is failed already)."""
    not_as_gold = [t for t in listed if gold.get(t) == "PASSED" and status_map.get(t) in ("XFAIL", "SKIPPED", "XPASS")]
    for t in not_as_gold:
        status_map[t] = "FAILED"
    if not_as_gold:
        findings.append(f"tests the gold patch passes did not pass here (counted failed): {not_as_gold[:5]}")


def _verdict(
    task: Task,
    plan: Plan,
    environment: str,
    log: str,
    swebench,
    status_map: dict[str, str],
    subfailed: set[str],
    findings: list[Finding | str],
    cross_check: JunitCheck | None,
) -> Grade:
    """swebench's resolution of the statuses: 1.0 for RESOLVED_FULL, with what the log showed on the way."""
    xfailed = [t for t in task.FAIL_TO_PASS if status_map.get(t) == "XFAIL"]
    if xfailed:
        findings.append(f"FAIL_TO_PASS tests ended XFAIL (swebench counts them as passing): {xfailed[:5]}")
    if subfailed:
        findings.append(f"tests with a failed subtest count as failed: {sorted(subfailed)[:5]}")
    report = swebench.get_eval_tests_report(
        status_map,
        {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS},
        eval_type=swebench.EvalType(task.eval_type),
    )
    resolution = swebench.get_resolution_status(report)
    if APPLY_FAILED in log:
        findings.append("the model patch did not apply")
    listed = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    return Grade(
        reward=1.0 if resolution == "RESOLVED_FULL" else 0.0,
        report=_report(
            plan,
            environment,
            log,
            resolution=resolution,
            fail_to_pass=report["FAIL_TO_PASS"],
            pass_to_pass=report["PASS_TO_PASS"],
            junit_cross_check=cross_check,
        ),
        dropped_files=[],
        findings=findings,
        statuses={t: status_map[t] for t in listed if t in status_map},
    )


def _own_status(own: dict[str, str], test_id: str) -> str:
    """The guard's status of a listed id (its node ids are rootdir-relative; the log's may carry a prefix)."""
    if test_id in own:
        return own[test_id]
    return next((s for i, s in own.items() if test_id.endswith("/" + i)), "")


@dataclass
class Run:
    """One test run in a grading sandbox: what the grader reads of it."""

    log: str
    timed_out: bool
    timeout_s: float
    duration_s: float
    environment: str
    junit: dict[tuple[str, str], str] | None
    junit_error: str | None
    record: Record | None
    junit_bytes: bytes | None = None


def judge(
    task: Task,
    run: Run,
    swebench,
    plan: Plan,
    touched: set[str],
    allowed_events: frozenset[str] = frozenset(),
    gold: dict[str, str] | None = None,
) -> Grade:
    """The grade of one run; `BrokenRun` when it left nothing to grade, `GradingError` for infra before the patch."""
    log = run.log
    if run.timed_out:
        raise BrokenRun(f"tests timed out after {run.timeout_s:.0f}s")
    if MISSING_DEPS in log:
        names = log.split(MISSING_DEPS, 1)[1].splitlines()[0].strip()
        raise GradingError(
            f"the task's environment ({run.environment}) lacks test dependencies the task declares in "
            f"install_config.pip_packages: {names}"
        )
    if TEST_PATCH_FAILED in log:
        raise BrokenRun("the task's test patch did not apply: " + log.split(TEST_PATCH_FAILED, 1)[0][-500:])
    ran = START in log and APPLY_FAILED not in log
    rec = run.record
    unfinished = ran and rec is not None and rec.started and not rec.ended and not rec.problems
    if (unfinished or (ran and run.junit_error and plan.pytest_cmd)) and (why := diagnose(log)):
        raise BrokenRun(f"{why}pytest stopped before running the tests")
    if unfinished:
        raise BrokenRun("the test process exited before pytest's end (os._exit, a signal or a crash)")
    if ran and run.junit_error and plan.pytest_cmd:
        raise BrokenRun(f"no readable JUnit report from the test run: {run.junit_error}")
    if ran and plan.pytest_cmd and plan.cross_check != "not_pytest" and (rec is None or not rec.started):
        raise BrokenRun(f"pytest left no outcome record (it died before loading the grading guard?): {diagnose(log)}")
    return score_log(
        task, log, swebench, run.junit, plan, run.environment, rec, touched, run.junit_bytes, allowed_events, gold
    )
