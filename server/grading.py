"""Grade a diff on a task's FAIL_TO_PASS / PASS_TO_PASS tests, in a fresh sandbox, with swebench's parser.

Needs a sandbox factory and a task, nothing else. The sandbox starts from the pristine repository at
`base_commit`; only the extracted diff crosses over. Edits to the test files the test patch touches and to pytest
configuration (conftest.py, pytest.ini, tox.ini, setup.cfg, pyproject.toml) are dropped from the model patch, and
the test files are reset to `base_commit` before the test patch goes on: an agent cannot change how it is graded.

How a task is graded follows its own data (`TestReport.graded_by` says which path ran):
- eval_script: a row that carries its own SWE-bench eval script (+ `log_parser`, `eval_type`) is run through
  swebench's `make_test_spec` (which also records the test command's exit status) and read with that parser;
- install_config: a SWE-rebench row runs its `install_config.test_cmd` in the env its `install_config` declares
  (the image's conda env; on `local`, a venv built from it: `swe_gym_env.tasks.envs`) and is read with its
  `log_parser`; the packages it declares are checked first, and a missing one is named;
- repo_parser / pytest: otherwise the row's test command (Django's and sympy's own runners, else pytest -rA) with the
  parser swebench's `MAP_REPO_TO_PARSER_PY` gives the repo, else swebench's pytest parser.

The reward is swebench's verdict on the log (`get_logs_eval` → `get_eval_tests_report` → `get_resolution_status`):
1.0 for RESOLVED_FULL, else 0.0 — also when the model patch does not apply. Code under test can print fake
`PASSED` lines, so where pytest runs (any path: `PYTEST_ADDOPTS` carries the option) the log is cross-checked against
a JUnit XML report written to a fresh random path outside the work tree: a test the log calls passing that the XML
does not is an infra failure (`GradingError`, reward None), never a pass. Other runners are graded by their swebench
parser alone (`junit_cross_check="not_pytest"`).
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Literal

from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.envs import EnvError, ensure_env
from swe_gym_env.tasks.models import Task, patch_files
from swe_gym_env.wire import TestReport

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code:"
APPLY_FAILED = ">>>>> Patch Apply Failed"
TEST_PATCH_FAILED = ">>>>> Test Patch Apply Failed"
MISSING_DEPS = ">>>>> Missing Dependencies:"
PROTECTED_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"}
PASSING = {"PASSED", "XFAIL"}
JUNIT_LIMIT = 32 * 1024 * 1024
GradedBy = Literal["eval_script", "install_config", "repo_parser", "pytest"]
CrossCheck = Literal["node_ids", "ids_rewritten", "not_pytest"]


class GradingError(RuntimeError):
    """Grading itself broke (infra): the reward is unknown, not 0."""


@dataclass
class Grade:
    reward: float
    report: TestReport
    dropped_files: list[str]
    findings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """How one task is graded: the path, the swebench parser (by name) and what the JUnit report can check."""

    graded_by: GradedBy
    parser: str
    cross_check: CrossCheck
    pytest_cmd: bool  # our own command runs pytest: its JUnit report must exist


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


@functools.cache
def load_swebench():
    """swebench's grading functions, imported once (it takes seconds: the server warms them up in a thread)."""
    from swebench.harness import grading
    from swebench.harness.constants import EvalType
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers import python as py_parsers
    from swebench.harness.utils import make_test_spec as swebench_make_test_spec
    from swebench.types import TestSpec

    return SimpleNamespace(
        TestSpec=TestSpec,
        get_logs_eval=grading.get_logs_eval,
        get_eval_tests_report=grading.get_eval_tests_report,
        get_resolution_status=grading.get_resolution_status,
        EvalType=EvalType,
        PARSER_REGISTRY=PARSER_REGISTRY,
        MAP_REPO_TO_PARSER_PY=py_parsers.MAP_REPO_TO_PARSER_PY,
        make_test_spec=swebench_make_test_spec,
        node_id_parsers=(py_parsers.parse_log_pytest, py_parsers.parse_log_pytest_v2, py_parsers.parse_log_seaborn),
        rewriting_parsers=(py_parsers.parse_log_pytest_options, py_parsers.parse_log_matplotlib),
    )


def _swebench_loaded() -> bool:
    return load_swebench.cache_info().currsize > 0


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


def parser_name(fn, repo: str, registry: dict) -> str:
    """The registry name of a parser function (aliases share one function: prefer the repo's own name)."""
    own = "parse_log_" + repo.split("/")[-1].replace("-", "_").lower()
    if registry.get(own) is fn:
        return own
    if registry.get(fn.__name__) is fn:
        return fn.__name__
    return next((name for name, f in registry.items() if f is fn), fn.__name__)


def plan_for(task: Task, swebench) -> Plan:
    registry = swebench.PARSER_REGISTRY
    if task.log_parser:
        if task.log_parser not in registry:
            raise GradingError(f"unknown log parser {task.log_parser!r} (not in swebench's PARSER_REGISTRY)")
        parser, from_repo = task.log_parser, False
    elif task.repo in swebench.MAP_REPO_TO_PARSER_PY:
        parser, from_repo = parser_name(swebench.MAP_REPO_TO_PARSER_PY[task.repo], task.repo, registry), True
    else:
        parser, from_repo = "parse_log_pytest", False
    graded_by: GradedBy = (
        "eval_script"
        if task.eval_script
        else "install_config"
        if task.install_config is not None
        else "repo_parser"
        if from_repo
        else "pytest"
    )
    fn = registry[parser]
    runs_pytest = task.eval_script is not None or re.search(r"(^|[\s/])(py\.test|pytest)(\s|$)", task.test_cmd)
    if fn in swebench.node_id_parsers and runs_pytest:
        cross: CrossCheck = "node_ids"
    elif fn in swebench.rewriting_parsers and runs_pytest:
        cross = "ids_rewritten"
    else:
        cross = "not_pytest"
    return Plan(graded_by, parser, cross, pytest_cmd=bool(runs_pytest) and task.eval_script is None)


def _apply_model(has_patch: bool) -> str:
    patch = "/tmp/grading/model.patch"
    if not has_patch:
        return "echo 'empty model patch'"
    return (
        f"git apply --verbose {patch} || git apply --verbose --reject {patch} "
        f"|| patch --batch --fuzz=5 -p1 -i {patch} || {{ echo '{APPLY_FAILED}'; exit 0; }}"
    )


def _junit_env(junit_path: str | None) -> list[str]:
    if not junit_path:
        return []
    opts = f"--junitxml={junit_path} -o junit_logging=no"
    return [f'export PYTEST_ADDOPTS="${{PYTEST_ADDOPTS:+$PYTEST_ADDOPTS }}"{shlex.quote(opts)}']


def _deps_check(task: Task) -> list[str]:
    """Shell that stops grading, naming them, when packages the row declares are not in the active env."""
    names = task.install_config.requirement_names() if task.install_config else []
    if not names:
        return []
    code = (
        "import importlib.metadata as m, sys\n"
        "miss = []\n"
        "for n in sys.argv[1:]:\n"
        "    try: m.distribution(n)\n"
        "    except m.PackageNotFoundError: miss.append(n)\n"
        f"print('{MISSING_DEPS} ' + ' '.join(miss)) if miss else None\n"
    )
    args = " ".join(shlex.quote(n) for n in names)
    return [f"python -c {shlex.quote(code)} {args} | grep -F '{MISSING_DEPS}' && exit 0"]


def eval_script(task: Task, has_patch: bool, junit_path: str | None) -> str:
    """Our eval script: env, setup, declared-deps check, model patch, test files reset + test patch, the tests."""
    q = shlex.quote
    files = " ".join(q(f) for f in task.test_files())
    targets = " ".join(q(f) for f in task.test_targets())
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,  # the task's setup, as the agent had it (a failure shows in the test log)
                *_deps_check(task),
                _apply_model(has_patch),
                f"git checkout {q(task.base_commit)} -- {files} 2>/dev/null || true",
                f"git apply --verbose /tmp/grading/test.patch || {{ echo '{TEST_PATCH_FAILED}'; exit 3; }}",
                *_junit_env(junit_path),
                f"echo '{START}'",
                f"{task.test_cmd} {targets} 2>&1",  # one stream, as swebench's harness reads a runner's output
                "rc=$?",
                f"echo '{END}'",
                f'echo "{EXIT} $rc"',
            ]
        )
        + "\n"
    )


def row_eval_wrapper(task: Task, has_patch: bool, junit_path: str | None) -> str:
    """For a row with its own eval script: env, setup, the model patch, then the row's script (which resets the test
    files, applies the test patch and prints the markers), stdout and stderr in one stream as swebench reads them."""
    q = shlex.quote
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,
                _apply_model(has_patch),
                *_junit_env(junit_path),
                "bash /tmp/grading/row_eval.sh 2>&1",
            ]
        )
        + "\n"
    )


def row_test_spec(task: Task, swebench) -> object:
    """swebench's own TestSpec for a row that carries its eval script (make_test_spec validates the row's shape)."""
    try:
        return swebench.make_test_spec(
            {
                "instance_id": task.instance_id,
                "image": task.image or "",
                "repo": task.repo,
                "version": task.version,
                "FAIL_TO_PASS": list(task.FAIL_TO_PASS),
                "PASS_TO_PASS": list(task.PASS_TO_PASS),
                "log_parser": task.log_parser or "parse_log_pytest",
                "eval_type": task.eval_type,
                "eval_script": task.eval_script,
            }
        )
    except (KeyError, ValueError, TypeError) as e:
        raise GradingError(f"swebench's make_test_spec rejects the row: {type(e).__name__}: {e}") from e


def make_test_spec(task: Task, swebench) -> object:
    """The TestSpec swebench grades a log with (our eval script: its command list is not used)."""
    if task.eval_script:
        return row_test_spec(task, swebench)
    return swebench.TestSpec(
        instance_id=task.instance_id,
        image=task.image or "",
        eval_script_list=[],
        repo=task.repo,
        version=task.version,
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser=plan_for(task, swebench).parser,
        eval_type=task.eval_type,
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


def score_log(
    task: Task,
    log: str,
    swebench,
    junit: dict[tuple[str, str], str] | None = None,
    plan: Plan | None = None,
    environment: str = "",
) -> Grade:
    """swebench's verdict on a log, cross-checked against the JUnit statuses when given."""
    plan = plan or plan_for(task, swebench)
    findings: list[str] = []
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        status_map, found = swebench.get_logs_eval(make_test_spec(task, swebench), f.name)
    if not found and APPLY_FAILED not in log:
        raise GradingError(f"the test run left no parsable results ({plan.parser}): {diagnose(log)}" + log[-800:])
    cross_check: Literal["match", "mismatch", "not_pytest", "ids_rewritten"] | None = None
    if plan.cross_check != "node_ids":
        cross_check = plan.cross_check
    elif junit is None and plan.graded_by == "eval_script" and APPLY_FAILED not in log:
        cross_check = "not_pytest"  # the row's own script ran a runner that wrote no JUnit report
    elif junit is not None and found:
        listed = (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)
        forged = [t for t in listed if status_map.get(t) in PASSING and junit.get(junit_key(t)) not in PASSING]
        if forged:
            raise GradingError(
                f"the log reports {len(forged)} test(s) passing that the JUnit report does not "
                f"(forged output?): {forged[:5]}"
            )
        missed = [t for t in listed if status_map.get(t) not in PASSING and junit.get(junit_key(t)) in PASSING]
        cross_check = "mismatch" if missed else "match"
        if missed:
            findings.append(
                f"JUnit reports passing tests the log parser missed (kept swebench's verdict): {missed[:5]}"
            )
    xfailed = [t for t in task.FAIL_TO_PASS if status_map.get(t) == "XFAIL"]
    if xfailed:
        findings.append(f"FAIL_TO_PASS tests ended XFAIL (swebench counts them as passing): {xfailed[:5]}")
    report = swebench.get_eval_tests_report(
        status_map,
        {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS},
        eval_type=swebench.EvalType(task.eval_type),
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
            graded_by=plan.graded_by,
            parser=plan.parser,
            junit_cross_check=cross_check,
            environment=environment,
        ),
        dropped_files=[],
        findings=findings,
    )


async def grade(
    task: Task,
    model_patch: str,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    timeout_s: float = 300.0,
    timings: dict[str, float] | None = None,
) -> Grade:
    """Grade ``model_patch`` on ``task`` in a sandbox from ``make_sandbox``. Where ``timings`` is given, the seconds
    of each step go into it under `grade.*` (imports, sandbox, env, tests, close, parse)."""
    clock = _Clock(timings)
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    patch, dropped = filter_model_patch(model_patch, task)
    junit_path = f"/tmp/.grading-{secrets.token_hex(12)}/junit.xml" if plan.cross_check == "node_ids" else None
    clock.lap("grade.imports")
    sbx = await make_sandbox()
    clock.lap("grade.sandbox")
    try:
        try:
            environment = await ensure_env(sbx, task)
        except EnvError as e:
            raise GradingError(str(e)) from e
        clock.lap("grade.env")
        await sbx.write_file("/tmp/grading/model.patch", patch.encode())
        await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
        if spec is not None:
            await sbx.write_file("/tmp/grading/row_eval.sh", spec.eval_script.encode(), 0o700)  # type: ignore[attr-defined]
            script = row_eval_wrapper(task, bool(patch.strip()), junit_path)
        else:
            script = eval_script(task, bool(patch.strip()), junit_path)
        await sbx.write_file("/tmp/grading/eval.sh", script.encode(), 0o700)
        res = await sbx.exec("bash /tmp/grading/eval.sh", timeout=timeout_s)
        clock.lap("grade.tests")
        junit = None
        ran = START in res.stdout and APPLY_FAILED not in res.stdout and not res.timed_out
        if junit_path and ran:
            try:
                junit = parse_junit(await sbx.read_file(junit_path, JUNIT_LIMIT))
            except Exception as e:
                if plan.pytest_cmd:  # our pytest command ran: a missing report is an infra failure, with its cause
                    if why := diagnose(res.stdout + "\n" + res.stderr):
                        raise GradingError(f"{why}pytest stopped before running the tests") from e
                    raise GradingError(f"no readable JUnit report from the test run: {type(e).__name__}: {e}") from e
    finally:
        clock.lap("grade.parse")  # the JUnit report (or the step that failed)
        await sbx.close()
        clock.lap("grade.close")
    log = res.stdout + "\n" + res.stderr
    if res.timed_out:
        raise GradingError(f"tests timed out after {timeout_s:.0f}s")
    if MISSING_DEPS in log:
        names = log.split(MISSING_DEPS, 1)[1].splitlines()[0].strip()
        raise GradingError(
            f"the task's environment ({environment}) lacks test dependencies the task declares in "
            f"install_config.pip_packages: {names}"
        )
    if TEST_PATCH_FAILED in log:
        raise GradingError("the task's test patch did not apply: " + res.stdout[-500:])
    g = score_log(task, log, swebench, junit, plan, environment)
    g.dropped_files = dropped
    clock.lap("grade.parse")
    return g
