"""Grade a diff on a task's FAIL_TO_PASS / PASS_TO_PASS tests, in a fresh sandbox, with swebench's parser.

Needs a sandbox factory and a task, nothing else. The sandbox starts from the pristine repository at
`base_commit`; only the extracted diff crosses over. Edits to the test files the test patch touches and to pytest
configuration (conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml) are dropped from the model patch: an
agent must not be able to change how it is graded.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from types import SimpleNamespace

from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.models import Task, patch_files
from swe_gym_env.wire import TestReport

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code:"
PROTECTED_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}


class GradingError(RuntimeError):
    pass


@dataclass
class Grade:
    reward: float
    report: TestReport
    dropped_files: list[str]


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


def eval_script(task: Task, has_patch: bool) -> str:
    wd = shlex.quote(task.workdir)
    base = shlex.quote(task.base_commit)
    files = " ".join(shlex.quote(f) for f in task.test_files())
    apply_model = (
        "git apply --verbose /tmp/grading/model.patch || git apply --verbose --reject /tmp/grading/model.patch "
        "|| patch --batch --fuzz=5 -p1 -i /tmp/grading/model.patch || { echo '>>>>> Patch Apply Failed'; exit 0; }"
        if has_patch
        else "echo 'empty model patch'"
    )
    return (
        "\n".join(
            [
                f"cd {wd}",
                apply_model,
                f"git checkout {base} -- {files} 2>/dev/null || true",
                "git apply --verbose /tmp/grading/test.patch || { echo '>>>>> Test Patch Apply Failed'; exit 3; }",
                f"echo '{START}'",
                f"python -m pytest -rA -p no:cacheprovider {files}",
                "rc=$?",
                f"echo '{END}'",
                f'echo "{EXIT} $rc"',
            ]
        )
        + "\n"
    )


def load_swebench():
    """swebench's grading module (importing it takes seconds: the server warms it up in a thread at start)."""
    from swebench.harness import grading
    from swebench.types import TestSpec

    return SimpleNamespace(
        TestSpec=TestSpec,
        get_logs_eval=grading.get_logs_eval,
        get_eval_tests_report=grading.get_eval_tests_report,
        get_resolution_status=grading.get_resolution_status,
    )


async def grade(
    task: Task, model_patch: str, make_sandbox: Callable[[], Awaitable[Sandbox]], timeout_s: float = 300.0
) -> Grade:
    swebench = await asyncio.to_thread(load_swebench)
    patch, dropped = filter_model_patch(model_patch, task)
    sbx = await make_sandbox()
    try:
        await sbx.write_file("/tmp/grading/model.patch", patch.encode())
        await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
        await sbx.write_file("/tmp/grading/eval.sh", eval_script(task, bool(patch.strip())).encode(), 0o700)
        res = await sbx.exec("bash /tmp/grading/eval.sh", timeout=timeout_s)
    finally:
        await sbx.close()
    log = res.stdout + "\n" + res.stderr
    if res.timed_out:
        raise GradingError(f"tests timed out after {timeout_s:.0f}s")
    if "Test Patch Apply Failed" in log:
        raise GradingError("the task's test patch did not apply: " + res.stdout[-500:])
    spec = swebench.TestSpec(
        instance_id=task.instance_id,
        image="",
        eval_script_list=[],
        repo=task.repo,
        version="",
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser="parse_log_pytest",
        eval_type="pass_and_fail",
    )
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        status_map, found = swebench.get_logs_eval(spec, f.name)
    if not found and "Patch Apply Failed" not in log:
        raise GradingError("the test run left no parsable results: " + log[-800:])
    report = swebench.get_eval_tests_report(
        status_map, {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}
    )
    resolution = swebench.get_resolution_status(report)
    return Grade(
        reward=1.0 if resolution == "RESOLVED_FULL" else 0.0,
        report=TestReport(
            resolution=resolution,
            fail_to_pass=report["FAIL_TO_PASS"],
            pass_to_pass=report["PASS_TO_PASS"],
            log_tail=log[-4000:],
        ),
        dropped_files=dropped,
    )
