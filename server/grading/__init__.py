"""Grade a diff on a task's FAIL_TO_PASS / PASS_TO_PASS tests, in a fresh sandbox, with swebench's parser.

Needs a sandbox factory and a task, nothing else. The sandbox starts from the pristine repository at
`base_commit`; only the extracted diff crosses over.

How a task is graded follows its own data (`TestReport.graded_by` says which path ran):
- eval_script: a row that carries its own SWE-bench eval script (+ `log_parser`, `eval_type`) is run through
  swebench's `make_test_spec` (which also records the test command's exit status) and read with that parser;
- install_config: a SWE-rebench row runs its `install_config.test_cmd` in the env its `install_config` declares
  (the image's conda env; on `local`, a venv built from it: `swe_gym_env.tasks.envs`) and is read with its
  `log_parser`; the packages it declares are checked first, and a missing one is named;
- repo_parser / pytest: otherwise the row's test command (Django's and sympy's own runners, else pytest -rA) with the
  parser swebench's `MAP_REPO_TO_PARSER_PY` gives the repo, else swebench's pytest parser.

The reward is swebench's verdict on the log (`get_logs_eval` → `get_eval_tests_report` → `get_resolution_status`):
1.0 for RESOLVED_FULL, else 0.0 — also when the model patch does not apply.

## Threat model

The policy under training is an adversary of this grader. It controls every byte of the tree the diff carries, and
its code runs *inside* the grading test process (the tests import it). It does not see the hidden tests. What this
module does about it (`TestReport.integrity` says what it saw: `clean`, `tampered: …`, `patch_broke_run: …`):

1. **What decides the verdict is reset.** The model patch is filtered (`integrity.protected_reason`): it never adds,
   changes, deletes or renames onto the test patch's files, any file a FAIL_TO_PASS / PASS_TO_PASS pytest id names,
   `conftest.py` at any depth, `pytest.ini` / `.pytest.ini` / `pytest.toml` / `.pytest.toml`, `sitecustomize.py`,
   `usercustomize.py`, `*.pth`, bytecode, installed-package metadata (entry points), or symlinks; every section that
   names such a path (a rename's old *and* new name) is dropped (`protected_files`). Those verdict files are then
   reset to base_commit file by file before the test patch goes on.
2. **pytest's settings are pinned.** `setup.cfg`, `pyproject.toml` and `tox.ini` stay the patch's to change (a real
   fix may bump metadata), but where the patch changed what pytest reads of one (its `[pytest]`, `[tool:pytest]`,
   `[tool.pytest…]` sections, or any line naming pytest or addopts), the file is reset to base_commit in the grading
   tree (`integrity.PIN_SCRIPT`, run by the task's Python with `-I -S`, so nothing of the tree runs).
3. **An outcome record the code under test cannot easily rewrite.** Where pytest runs, our plugin
   (`guard_plugin.py`) is loaded first (`-p`, from a random directory outside the tree) and reads a per-run key that
   it deletes before any conftest or test module is imported. Through a descriptor opened then, it records per test
   phase the raw call result beside the outcome pytest's report ended with, and every logged report; each line is
   HMAC-chained. At pytest's end it checks that the reporting machinery (report classes and functions, runner,
   skipping, terminal and JUnit reporters, pluggy's call loop, hook callers) is still the one it saw at import and
   lists hook implementations registered from anything but an installed plugin or a conftest.py present at the
   start. The grader compares that record, the log (swebench's parse) and pytest's JUnit report: a report rewritten
   from failed to passed, a test passing in the log or JUnit that the record says did not, a skip/xfail raised for a
   listed test from code outside the test files, a hook implemented from a file the patch added or changed or that
   appeared during the run, a replaced reporter, an altered record: **tampering, reward 0.0** with a
   `grading_tampered` finding (the policy did it, so it gets the negative signal rather than a dropped sample).
4. **Breaking the run is the patch's fault when the empty patch runs.** A run that times out, dies before pytest's
   end (`os._exit`, a signal), leaves no parsable results or JUnit report, or whose test patch no longer applies,
   is re-run with the empty patch (once per task, sandbox and image, cached): if that run reports results, reward
   0.0 with `patch_broke_test_run: <how>`; only when it fails too is it infra (`GradingError`, reward None). The test
   timeout is the task's own measured run time times `SWE_GYM_GRADING_TIMEOUT_MULTIPLE` (floor
   `SWE_GYM_GRADING_TIMEOUT_FLOOR_S`), capped by the caller's `timeout_s`; the baseline gets the full `timeout_s`.
5. **Subtests.** A test with a failed subtest (pytest ≥ 9 logs `SUBFAILED` lines; the record and JUnit say failed)
   is FAILED, never a pass and never tampering.

Not defended (residual risk): code in the test process can, in principle, read the key out of the guard's memory
and write a consistent record, or patch objects the guard does not watch (builtins the tests call, objects reached
through the garbage collector); a patch may special-case the hidden tests' inputs or return objects whose comparisons
always succeed; tasks whose code under test is pytest itself or a
pytest plugin (the guard trusts plugins loaded before the tree and their files are the patch's to change); helper
modules the tests import that no test id names are the patch's to change; a P2P test the code under test skips via
a condition evaluated in the test file is "maintained" (swebench's rule). Other runners (Django's, sympy's: cross
check `not_pytest`) get the file filter, the reset and the broken-run rule, but no record: their log is trusted.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Literal

from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.integrity import PASSING, PINNED_CONFIGS, Record
from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.envs import EnvError, ensure_env
from swe_gym_env.tasks.models import Task, patch_files
from swe_gym_env.wire import Finding, TestReport

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code:"
APPLY_FAILED = ">>>>> Patch Apply Failed"
TEST_PATCH_FAILED = ">>>>> Test Patch Apply Failed"
MISSING_DEPS = ">>>>> Missing Dependencies:"
PINNED = ">>>>> Pinned pytest settings of"
JUNIT_LIMIT = 32 * 1024 * 1024
GUARD_MODULE = "swe_gym_guard"
TIMEOUT_FLOOR_S = float(os.environ.get("SWE_GYM_GRADING_TIMEOUT_FLOOR_S", "120"))
TIMEOUT_MULTIPLE = float(os.environ.get("SWE_GYM_GRADING_TIMEOUT_MULTIPLE", "5"))
GradedBy = Literal["eval_script", "install_config", "repo_parser", "pytest"]
CrossCheck = Literal["node_ids", "ids_rewritten", "not_pytest"]


class GradingError(RuntimeError):
    """Grading itself broke (infra): the reward is unknown, not 0."""


class BrokenRun(Exception):
    """The test run left nothing to grade (timed out, died, no results): the patch's fault or infra, decided by
    running the empty patch."""


@dataclass
class Grade:
    reward: float
    report: TestReport
    dropped_files: list[str]
    findings: list[Finding | str] = field(default_factory=list)


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


def task_verdict_files(task: Task) -> list[str]:
    return integrity.verdict_files(task.test_files(), [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])


def filter_model_patch(patch: str, task: Task) -> tuple[str, list[str]]:
    """(kept patch, dropped paths): every file section naming a protected path (threat model, item 1) is dropped."""
    verdict = set(task_verdict_files(task))
    kept, dropped = [], []
    for path, section in split_patch(patch):
        paths = integrity.section_paths(section) or [path]
        if integrity.is_symlink_section(section) or any(integrity.protected_reason(p, verdict) for p in paths):
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def pinned_configs(patch: str) -> list[str]:
    """Files of the (filtered) patch whose pytest settings grading pins to base_commit."""
    paths = [p for _, section in split_patch(patch) for p in integrity.section_paths(section)]
    return list(dict.fromkeys(p for p in paths if PurePosixPath(p).name in PINNED_CONFIGS))


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


@dataclass(frozen=True)
class Guarded:
    """Where one grading run's pytest writes what the grader reads: a random directory outside the work tree."""

    dir: str
    key: bytes
    junit: bool  # the parser keeps pytest's ids: JUnit statuses compare per test

    @classmethod
    def new(cls, junit: bool) -> Guarded:
        return cls(f"/tmp/.grading-{secrets.token_hex(12)}", secrets.token_hex(32).encode(), junit)

    @property
    def junit_path(self) -> str:
        return f"{self.dir}/junit.xml"

    @property
    def record_path(self) -> str:
        return f"{self.dir}/record"


def _pytest_env(guard: Guarded | None) -> list[str]:
    """The guard plugin first (-p), and the JUnit report where it is compared, for every pytest the run starts."""
    if guard is None:
        return []
    opts = f"-p {GUARD_MODULE}" + (f" --junitxml={guard.junit_path} -o junit_logging=no" if guard.junit else "")
    return [
        f"export SWE_GYM_GUARD={shlex.quote(guard.dir)}",
        f'export PYTHONPATH={shlex.quote(guard.dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
        f'export PYTEST_ADDOPTS="${{PYTEST_ADDOPTS:+$PYTEST_ADDOPTS }}"{shlex.quote(opts)}',
    ]


def _protect(task: Task, pinned: list[str]) -> list[str]:
    """After the model patch: pytest's settings pinned, then the verdict's files reset to base_commit one by one (a
    file new in the test patch is removed: the test patch creates it)."""
    q, base = shlex.quote, shlex.quote(task.base_commit)
    lines = []
    for f in pinned:
        lines.append(
            f"{{ git show {base}:{q(f)} > /tmp/grading/pin.base 2>/dev/null || : > /tmp/grading/pin.base; }}; "
            f'"$(command -v python3 || command -v python || echo false)" -I -S /tmp/grading/pin.py {q(f)} '
            f"/tmp/grading/pin.base || {{ git checkout -q {base} -- {q(f)} 2>/dev/null || rm -f -- {q(f)}; "
            f"echo {q(f'{PINNED} {f}')}; }}"
        )
    files = " ".join(q(f) for f in task_verdict_files(task))
    if files:
        lines.append(f'for f in {files}; do git checkout -q {base} -- "$f" 2>/dev/null || rm -rf -- "$f"; done')
    return lines


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


def eval_script(task: Task, has_patch: bool, guard: Guarded | None, pinned: Sequence[str] = ()) -> str:
    """Our eval script: env, setup, declared-deps check, model patch, pinned settings and reset verdict files, test
    patch, the tests."""
    q = shlex.quote
    targets = " ".join(q(f) for f in task.test_targets())
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,  # the task's setup, as the agent had it (a failure shows in the test log)
                *_deps_check(task),
                _apply_model(has_patch),
                *_protect(task, list(pinned)),
                f"git apply --verbose /tmp/grading/test.patch || {{ echo '{TEST_PATCH_FAILED}'; exit 3; }}",
                *_pytest_env(guard),
                f"echo '{START}'",
                f"{task.test_cmd} {targets} 2>&1",  # one stream, as swebench's harness reads a runner's output
                "rc=$?",
                f"echo '{END}'",
                f'echo "{EXIT} $rc"',
            ]
        )
        + "\n"
    )


def row_eval_wrapper(task: Task, has_patch: bool, guard: Guarded | None, pinned: Sequence[str] = ()) -> str:
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
                *_protect(task, list(pinned)),
                *_pytest_env(guard),
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
) -> Grade:
    """swebench's verdict on a log, cross-checked against the JUnit statuses and the guard's record when given.
    Tampering seen is a 0.0 with a `grading_tampered` finding; a log with nothing to parse is a `BrokenRun`."""
    plan = plan or plan_for(task, swebench)
    findings: list[Finding | str] = []
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        status_map, found = swebench.get_logs_eval(make_test_spec(task, swebench), f.name)
    listed = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    guarded = record is not None and record.started and APPLY_FAILED not in log
    row_runner = junit is None and plan.graded_by == "eval_script" and not guarded  # a row script's own runner
    per_test = plan.cross_check == "node_ids" and not row_runner
    subfailed = integrity.subtest_failures(log, listed) if plan.cross_check != "not_pytest" else set()
    own = None
    if guarded and record is not None:
        own_all, own_sub = integrity.guard_statuses(record)
        subfailed |= {t for t in listed if any(t == i or t.endswith("/" + i) for i in own_sub)}
        own = {t: _own_status(own_all, t) for t in listed} if per_test else None
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
        )
    if not found and APPLY_FAILED not in log and not tampered:
        raise BrokenRun(f"the test run left no parsable results ({plan.parser}): {diagnose(log)}" + log[-800:])
    cross_check: Literal["match", "mismatch", "not_pytest", "ids_rewritten"] | None = None
    if plan.cross_check != "node_ids":
        cross_check = plan.cross_check
    elif junit is None and plan.graded_by == "eval_script" and APPLY_FAILED not in log:
        cross_check = "not_pytest"  # the row's own script ran a runner that wrote no JUnit report
    elif junit_by_id is not None and found:
        forged = [t for t in listed if status_map.get(t) in PASSING and junit_by_id[t] not in PASSING]
        if forged:
            tampered.append(
                f"the log reports {len(forged)} test(s) passing that the JUnit report does not: {forged[:5]}"
            )
        missed = [t for t in listed if status_map.get(t) not in PASSING and junit_by_id[t] in PASSING]
        cross_check = "mismatch" if missed else "match"
        if missed and not forged:
            findings.append(
                f"JUnit reports passing tests the log parser missed (kept swebench's verdict): {missed[:5]}"
            )
    if tampered:
        what = "; ".join(dict.fromkeys(tampered))
        report = _failed_report(task, plan, environment, log, f"tampered: {what}"[:2000])
        return Grade(
            reward=0.0,
            report=report.model_copy(update={"junit_cross_check": cross_check}),
            dropped_files=[],
            findings=[Finding(severity="warning", code="grading_tampered", message=what[:2000])],
        )
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


_RUNTIMES: dict[tuple, float] = {}  # (task, sandbox kind) -> the shortest complete test run seen, seconds
_BASELINES: dict[tuple, str | None] = {}  # (task, sandbox kind) -> why the empty patch's run broke (None: it did not)
_BASELINE_LOCKS: dict[tuple, asyncio.Lock] = {}  # one empty-patch run per task at a time, however many broke
_CACHE_MAX = 4096


def _task_key(task: Task, cache_key: str) -> tuple:
    return (task.instance_id, task.image or task.repo_source or "", task.base_commit, cache_key)


def _remember(cache: dict, key: tuple, value) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.pop(next(iter(cache)))
    cache[key] = value


def test_timeout(task: Task, timeout_s: float, cache_key: str = "") -> float:
    """The task's own measured run time times the multiple (at least the floor), never above ``timeout_s``."""
    seen = _RUNTIMES.get(_task_key(task, cache_key))
    if seen is None:
        return timeout_s
    return min(timeout_s, max(TIMEOUT_FLOOR_S, TIMEOUT_MULTIPLE * seen))


async def _run_tests(
    task: Task,
    patch: str,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    plan: Plan,
    spec,
    timeout_s: float,
    clock: _Clock,
) -> Run:
    guard = Guarded.new(junit=plan.cross_check == "node_ids") if plan.cross_check != "not_pytest" else None
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
        if pinned:
            await sbx.write_file("/tmp/grading/pin.py", integrity.PIN_SCRIPT.encode())
        if guard is not None:
            await sbx.write_file(f"{guard.dir}/{GUARD_MODULE}.py", integrity.guard_plugin_source())
            await sbx.write_file(f"{guard.dir}/key", guard.key, 0o600)
        if spec is not None:
            await sbx.write_file("/tmp/grading/row_eval.sh", spec.eval_script.encode(), 0o700)
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


def judge(task: Task, run: Run, swebench, plan: Plan, touched: set[str]) -> Grade:
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
    unfinished = ran and rec is not None and rec.started and not rec.ended
    if (unfinished or (ran and run.junit_error and plan.pytest_cmd)) and (why := diagnose(log)):
        raise BrokenRun(f"{why}pytest stopped before running the tests")
    if unfinished:
        raise BrokenRun("the test process exited before pytest's end (os._exit, a signal or a crash)")
    if ran and run.junit_error and plan.pytest_cmd:
        raise BrokenRun(f"no readable JUnit report from the test run: {run.junit_error}")
    if ran and plan.pytest_cmd and plan.cross_check != "not_pytest" and (rec is None or not rec.started):
        raise BrokenRun(f"pytest left no outcome record (it died before loading the grading guard?): {diagnose(log)}")
    return score_log(task, log, swebench, run.junit, plan, run.environment, rec, touched, run.junit_bytes)


async def grade(
    task: Task,
    model_patch: str,
    make_sandbox: Callable[[], Awaitable[Sandbox]],
    timeout_s: float = 300.0,
    timings: dict[str, float] | None = None,
    cache_key: str = "",
) -> Grade:
    """Grade ``model_patch`` on ``task`` in a sandbox from ``make_sandbox``. Where ``timings`` is given, the seconds
    of each step go into it under `grade.*` (imports, sandbox, env, tests, close, parse; `grade.baseline` when the
    empty patch had to run). ``cache_key`` names the sandbox kind for the per-task caches (run time, baseline)."""
    clock = _Clock(timings)
    swebench = load_swebench() if _swebench_loaded() else await asyncio.to_thread(load_swebench)
    plan = plan_for(task, swebench)
    spec = row_test_spec(task, swebench) if task.eval_script else None
    patch, dropped = filter_model_patch(model_patch, task)
    touched = {p for _, section in split_patch(patch) for p in integrity.section_paths(section)}
    key = _task_key(task, cache_key)
    clock.lap("grade.imports")
    run = await _run_tests(task, patch, make_sandbox, plan, spec, test_timeout(task, timeout_s, cache_key), clock)
    try:
        g = judge(task, run, swebench, plan, touched)
    except BrokenRun as e:
        how = str(e)
        if not patch.strip():
            _remember(_BASELINES, key, how)
            raise GradingError(how) from e
        why = await _baseline(task, make_sandbox, swebench, plan, spec, timeout_s, key, clock)
        if why is not None:
            raise GradingError(f"{how} (the empty patch's run broke too: {why}: infra, not the patch)") from e
        g = Grade(
            reward=0.0,
            report=_failed_report(task, plan, run.environment, run.log, f"patch_broke_run: {how}"[:2000]),
            dropped_files=[],
            findings=[Finding(severity="warning", code="patch_broke_test_run", message=how[:2000])],
        )
    else:
        if not run.timed_out:
            _remember(_RUNTIMES, key, min(run.duration_s, _RUNTIMES.get(key, run.duration_s)))
        if not patch.strip():
            _remember(_BASELINES, key, None)
    # the patch's changes to pytest's settings that grading reset (pytest.ini-style files are dropped above)
    pinned = [line[len(PINNED) :].strip() for line in run.log.splitlines() if line.startswith(PINNED)]
    g.dropped_files = list(dict.fromkeys([*dropped, *pinned]))
    clock.lap("grade.parse")
    return g


async def _baseline(task, make_sandbox, swebench, plan, spec, timeout_s, key, clock) -> str | None:
    """Why the empty patch's run of this task breaks (None: it reports results), cached per task and sandbox kind."""
    if key in _BASELINES:
        return _BASELINES[key]
    lock = _BASELINE_LOCKS.setdefault((*key, id(asyncio.get_running_loop())), asyncio.Lock())
    async with lock:
        if key in _BASELINES:  # another rollout's broken run paid for it meanwhile
            return _BASELINES[key]
        return await _run_baseline(task, make_sandbox, swebench, plan, spec, timeout_s, key, clock)


async def _run_baseline(task, make_sandbox, swebench, plan, spec, timeout_s, key, clock) -> str | None:
    t = time.monotonic()
    run = await _run_tests(task, "", make_sandbox, plan, spec, timeout_s, _Clock(None))
    try:
        judge(task, run, swebench, plan, set())
        why = None
        if not run.timed_out:
            _remember(_RUNTIMES, key, min(run.duration_s, _RUNTIMES.get(key, run.duration_s)))
    except (BrokenRun, GradingError) as e:
        why = str(e)
    _remember(_BASELINES, key, why)
    if clock.timings is not None:
        clock.timings["grade.baseline"] = clock.timings.get("grade.baseline", 0.0) + time.monotonic() - t
    clock.t = time.monotonic()
    return why
