"""The shell script one grading run executes in its sandbox: env, setup, model patch, pins and resets, test patch,
the guarded pytest."""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from swe_gym_env.server.grading.files import _protect
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    END,
    EXIT,
    GUARD_MODULE,
    MISSING_DEPS,
    START,
    TEST_PATCH_FAILED,
)
from swe_gym_env.tasks.models import Task


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


CANARY_DIR = "/tmp/grading/canary"
# Every run's script carries this step, right after the test patch: where the grader wrote mutants (a canary run),
# they go in place of their originals and the folder is removed before the tests start. The script is the same text
# in a canary run and a plain one, so nothing the code under test can read of it tells the two apart.
CANARY_STEP = f"if [ -d {CANARY_DIR} ]; then cp -R {CANARY_DIR}/. . && rm -rf {CANARY_DIR} || exit 3; fi"


def eval_script(task: Task, has_patch: bool, guard: Guarded | None, pinned: Sequence[str] = ()) -> str:
    """Our eval script: env, setup, declared-deps check, model patch, pinned settings and reset verdict files, test
    patch (then the canary mutants in place of their originals, where the grader wrote any), the tests."""
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
                CANARY_STEP,
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
