"""How one task is graded: the path (eval_script / install_config / repo_parser / pytest), the swebench parser, the
log markers our scripts print and swebench's TestSpec."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

from swe_gym_env.server.grading.errors import GradingError
from swe_gym_env.tasks.models import Task

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
EXIT = ">>>>> Test Exit Code:"
APPLY_FAILED = ">>>>> Patch Apply Failed"
TEST_PATCH_FAILED = ">>>>> Test Patch Apply Failed"
MISSING_DEPS = ">>>>> Missing Dependencies:"
JUNIT_LIMIT = 32 * 1024 * 1024
GUARD_MODULE = "swe_gym_guard"
GradedBy = Literal["eval_script", "install_config", "repo_parser", "pytest"]
CrossCheck = Literal["node_ids", "ids_rewritten", "not_pytest"]


@dataclass(frozen=True)
class Plan:
    """How one task is graded: the path, the swebench parser (by name) and what the JUnit report can check."""

    graded_by: GradedBy
    parser: str
    cross_check: CrossCheck
    pytest_cmd: bool  # our own command runs pytest: its JUnit report must exist


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
