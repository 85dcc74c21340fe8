"""Grade a diff on a task's FAIL_TO_PASS / PASS_TO_PASS tests, in a fresh sandbox, with swebench's parser.

Needs a sandbox factory and a task, nothing else. The sandbox starts from the pristine repository at
`base_commit`; only the extracted diff crosses over. Edits to the test files the test patch touches and to pytest
configuration (conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml) are dropped from the model patch, and
the test files are reset to `base_commit` before the test patch goes on: an agent cannot change how it is graded.

The reward is swebench's verdict on the log (`get_logs_eval` → `get_eval_tests_report` → `get_resolution_status`):
1.0 for RESOLVED_FULL, else 0.0 — also when the model patch does not apply. Code under test can print fake
`PASSED` lines, so for pytest runs the log is cross-checked against a JUnit XML report written to a fresh random
path outside the work tree: a test the log calls passing that the XML does not is an infra failure
(`GradingError`, reward None), never a pass.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shlex
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import SimpleNamespace

from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.models import Task, patch_files
from swe_gym_env.wire import TestReport

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code:"
APPLY_FAILED = ">>>>> Patch Apply Failed"
TEST_PATCH_FAILED = ">>>>> Test Patch Apply Failed"
PROTECTED_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}
PASSING = {"PASSED", "XFAIL"}
JUNIT_LIMIT = 32 * 1024 * 1024


class GradingError(RuntimeError):
    """Grading itself broke (infra): the reward is unknown, not 0."""


@dataclass
class Grade:
    reward: float
    report: TestReport
    dropped_files: list[str]
    findings: list[str] = field(default_factory=list)


def split_patch(patch: str) -> list[tuple[str, str]]:
    """(path, section) per file of a git diff; text before the first file header is kept with path ''."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    return [((patch_files(s) or [""])[0], s) for s in sections if s]


def filter_model_patch(patch: str, task: Task) -> tuple[str, list[str]]:
    protected = set(task.test_files())
    kept, dropped = [], []
    for path, section in split_patch(patch):
        if path in protected or PurePosixPath(path).name in PROTECTED_NAMES:
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def uses_pytest(task: Task) -> bool:
    return task.log_parser.startswith("parse_log_pytest") and "pytest" in task.test_cmd


def eval_script(task: Task, has_patch: bool, junit_path: str | None) -> str:
    q = shlex.quote
    files = " ".join(q(f) for f in task.test_files())
    patch = "/tmp/grading/model.patch"
    apply_model = (
        f"git apply --verbose {patch} || git apply --verbose --reject {patch} "
        f"|| patch --batch --fuzz=5 -p1 -i {patch} || {{ echo '{APPLY_FAILED}'; exit 0; }}"
        if has_patch
        else "echo 'empty model patch'"
    )
    junit = f" --junitxml={q(junit_path)} -o junit_logging=no" if junit_path else ""
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,  # the task's setup, as the agent had it (a failure shows in the test log)
                apply_model,
                f"git checkout {q(task.base_commit)} -- {files} 2>/dev/null || true",
                f"git apply --verbose /tmp/grading/test.patch || {{ echo '{TEST_PATCH_FAILED}'; exit 3; }}",
                f"echo '{START}'",
                f"{task.test_cmd}{junit} {files}",
                "rc=$?",
                f"echo '{END}'",
                f'echo "{EXIT} $rc"',
            ]
        )
        + "\n"
    )


def load_swebench():
    """swebench's grading functions (importing them takes seconds: the server warms them up in a thread)."""
    from swebench.harness import grading
    from swebench.types import TestSpec

    return SimpleNamespace(
        TestSpec=TestSpec,
        get_logs_eval=grading.get_logs_eval,
        get_eval_tests_report=grading.get_eval_tests_report,
        get_resolution_status=grading.get_resolution_status,
    )


def make_test_spec(task: Task, swebench) -> object:
    return swebench.TestSpec(
        instance_id=task.instance_id,
        image=task.image or "",
        eval_script_list=[],
        repo=task.repo,
        version="",
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser=task.log_parser,
        eval_type="pass_and_fail",
    )


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


def score_log(task: Task, log: str, swebench, junit: dict[tuple[str, str], str] | None = None) -> Grade:
    """swebench's verdict on a log, cross-checked against the JUnit statuses when given."""
    findings: list[str] = []
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        status_map, found = swebench.get_logs_eval(make_test_spec(task, swebench), f.name)
    if not found and APPLY_FAILED not in log:
        raise GradingError("the test run left no parsable results: " + log[-800:])
    if junit is not None and found:
        forged = [
            t
            for t in (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)
            if status_map.get(t) in PASSING and junit.get(junit_key(t)) not in PASSING
        ]
        if forged:
            raise GradingError(
                f"the log reports {len(forged)} test(s) passing that the JUnit report does not "
                f"(forged output?): {forged[:5]}"
            )
        missed = [
            t for t in task.FAIL_TO_PASS if status_map.get(t) not in PASSING and junit.get(junit_key(t)) in PASSING
        ]
        if missed:
            findings.append(
                f"JUnit reports passing tests the log parser missed (kept swebench's verdict): {missed[:5]}"
            )
    xfailed = [t for t in task.FAIL_TO_PASS if status_map.get(t) == "XFAIL"]
    if xfailed:
        findings.append(f"FAIL_TO_PASS tests ended XFAIL (swebench counts them as passing): {xfailed[:5]}")
    report = swebench.get_eval_tests_report(
        status_map, {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    )
    resolution = swebench.get_resolution_status(report)
    if APPLY_FAILED in log:
        findings.append("the model patch did not apply")
    return Grade(
        reward=1.0 if resolution == "RESOLVED_FULL" else 0.0,
        report=TestReport(
            resolution=resolution,
            fail_to_pass=report["FAIL_TO_PASS"],
            pass_to_pass=report["PASS_TO_PASS"],
            log_tail=log[-4000:],
        ),
        dropped_files=[],
        findings=findings,
    )


async def grade(
    task: Task, model_patch: str, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout_s: float = 300.0
) -> Grade:
    swebench = await asyncio.to_thread(load_swebench)
    patch, dropped = filter_model_patch(model_patch, task)
    junit_path = f"/tmp/.grading-{secrets.token_hex(12)}/junit.xml" if uses_pytest(task) else None
    sbx = await make_sandbox()
    try:
        await sbx.write_file("/tmp/grading/model.patch", patch.encode())
        await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
        await sbx.write_file("/tmp/grading/eval.sh", eval_script(task, bool(patch.strip()), junit_path).encode(), 0o700)
        res = await sbx.exec("bash /tmp/grading/eval.sh", timeout=timeout_s)
        junit = None
        if junit_path and START in res.stdout and APPLY_FAILED not in res.stdout and not res.timed_out:
            try:
                junit = parse_junit(await sbx.read_file(junit_path, JUNIT_LIMIT))
            except Exception as e:
                raise GradingError(f"no readable JUnit report from the test run: {type(e).__name__}: {e}") from e
    finally:
        await sbx.close()
    log = res.stdout + "\n" + res.stderr
    if res.timed_out:
        raise GradingError(f"tests timed out after {timeout_s:.0f}s")
    if TEST_PATCH_FAILED in log:
        raise GradingError("the task's test patch did not apply: " + res.stdout[-500:])
    g = score_log(task, log, swebench, junit)
    g.dropped_files = dropped
    return g
