"""The shell script one grading run executes in its sandbox: env, setup, pytest's setup resolved at base_commit, model
patch, verdict files reset, test patch, the run's test files, times normalised, the guarded pytest.

One procedure makes every run of a task: the main run and its canary run differ only in the bytes of the files under
`TESTS_DIR` (the test patch's own text, or the mutants), both padded to the same length; every path, the script,
the environment and every file's and folder's time are the same (`NORMALISE`)."""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.errors import GradingError
from swe_gym_env.server.grading.files import reset_verdict_files
from swe_gym_env.server.grading.plan import (
    APPLY_FAILED,
    END,
    EXIT,
    GUARD_MODULE,
    MISSING_DEPS,
    START,
    TEST_PATCH_FAILED,
)
from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.models import Task

GRADING_DIR = "/tmp/grading"
GUARD_DIR = f"{GRADING_DIR}/guard"  # the same path in every run: nothing secret is in it once the tests start
TESTS_DIR = f"{GRADING_DIR}/tests"  # the run's copies of the test patch's files (originals or mutants)
LAUNCHER = f"{GUARD_DIR}/swe_gym_launch.py"
RESOLVE_FAILED = ">>>>> Grading Setup Failed"
FIXED_TIME = 1_600_000_000  # every file's and folder's mtime and atime before the tests start
# Every run carries these two steps right after the test patch. TESTS_STEP: the run's test files go in place (the same
# paths in every run), then no copy of a test file's text is left outside the tree (the run's copies, the test patch,
# the model patch: a switch comparing the copies with the test patch would tell the canary run apart without opening
# a file of the tree). NORMALISE: every time under the tree and the grading folder is set to one instant.
TESTS_STEP = (
    f"mkdir -p {TESTS_DIR} && cp -R {TESTS_DIR}/. . "
    f"&& rm -rf {TESTS_DIR} {GRADING_DIR}/test.patch {GRADING_DIR}/model.patch || exit 3"
)
NORMALISE = f"find . {GRADING_DIR} -xdev -exec touch -h -d @{FIXED_TIME} {{}} + 2>/dev/null; :"
PY_SH = '"$(command -v python || command -v python3)"'
_PY_RE = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)*)?$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# install or build steps a row's own script would run after the model patch: the tree's code (setup.py, a build
# backend) before the guard. Never run.
_INSTALL_RE = re.compile(
    r"^\s*(?:\S*python[\d.]*\s+-m\s+pip|pip[\d.]*|\S*python[\d.]*\s+setup\.py|conda|mamba|micromamba|uv(?:\s+pip)?)"
    r"\s+(?:install|develop|build|build_ext|sync|bdist_wheel|egg_info)\b|^\s*make\b"
)


def _apply_model(has_patch: bool) -> str:
    patch = f"{GRADING_DIR}/model.patch"
    if not has_patch:
        return "echo 'empty model patch'"
    return (
        f"git apply --verbose {patch} || git apply --verbose --reject {patch} "
        f"|| patch --batch --fuzz=5 -p1 -i {patch} || {{ echo '{APPLY_FAILED}'; exit 0; }}"
    )


@dataclass(frozen=True)
class Guarded:
    """One grading run's guard: the record's key (read and deleted by the launcher's collector before the test process
    starts) and whether pytest's JUnit report is compared per test."""

    key: bytes
    junit: bool  # the parser keeps pytest's ids: JUnit statuses compare per test
    dir: str = GUARD_DIR

    @classmethod
    def new(cls, junit: bool) -> Guarded:
        return cls(secrets.token_hex(32).encode(), junit)

    @property
    def junit_path(self) -> str:
        return f"{self.dir}/junit.xml"

    @property
    def record_path(self) -> str:
        return f"{self.dir}/record"

    def extra_args(self) -> list[str]:
        return ["--junitxml", self.junit_path, "-o", "junit_logging=no"] if self.junit else []

    async def install(self, sbx: Sandbox) -> None:
        await sbx.write_file(f"{self.dir}/{GUARD_MODULE}.py", integrity.guard_plugin_source())
        await sbx.write_file(LAUNCHER, integrity.guard_launch_source())
        await sbx.write_file(f"{self.dir}/key", self.key, 0o600)


@dataclass(frozen=True)
class PytestCommand:
    """A test command that runs pytest, taken apart: what the launcher needs to start it."""

    env: list[str]  # leading VAR=value words
    python: str  # shell words of the interpreter and its own flags
    mode: str  # module (`python -m pytest`: the working directory was on sys.path) or script (`pytest`)
    args: list[str]  # pytest's own arguments

    def launch(self, what: str, extra: Sequence[str] = ()) -> str:
        q = shlex.quote
        words = [*map(q, self.env), self.python, LAUNCHER, what, GUARD_DIR, self.mode, "--"]
        return " ".join([*words, *map(q, [*extra, *self.args])])


def pytest_command(cmd: str) -> PytestCommand | None:
    """``pytest …``, ``py.test …`` or ``python[X.Y] [flags] -m pytest …`` (after VAR=value words); None: another
    command."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return None
    i = 0
    while i < len(words) and _ENV_RE.match(words[i]):
        i += 1
    env, rest = words[:i], words[i:]
    if not rest:
        return None
    if PurePosixPath(rest[0]).name in ("pytest", "py.test"):
        return PytestCommand(env, PY_SH, "script", rest[1:])
    if not _PY_RE.match(rest[0]):
        return None
    j = 1
    while j < len(rest) and rest[j].startswith("-") and rest[j] != "-m":
        j += 2 if rest[j] in ("-W", "-X") else 1
    if j + 1 < len(rest) and rest[j] == "-m" and rest[j + 1] in ("pytest", "py.test"):
        python = " ".join(shlex.quote(w) for w in rest[:j])
        return PytestCommand(env, python, "module", rest[j + 2 :])
    return None


def _guarded_command(task: Task) -> PytestCommand:
    cmd = pytest_command(task.test_cmd)
    if cmd is None:
        raise GradingError(f"the task's test command is not one the grading guard can start: {task.test_cmd[:200]!r}")
    return cmd


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


def _resolve(cmd: PytestCommand, extra: Sequence[str]) -> str:
    """pytest's setup as base_commit has it (before the model patch): the launcher's `resolve` mode."""
    return f"{cmd.launch('resolve', extra)} || {{ echo '{RESOLVE_FAILED}'; exit 3; }}"


def eval_script(task: Task, has_patch: bool, guard: Guarded | None) -> str:
    """Our eval script: env, setup, declared-deps check, pytest's setup resolved at base_commit, model patch, reset
    verdict files, test patch, the run's test files, times normalised, the tests (through the launcher where guarded:
    the guard first, settings from the pinned copy, the record chained outside the test process)."""
    q = shlex.quote
    targets = [*task.test_targets()]
    if guard is not None:
        cmd = _guarded_command(task)
        resolve = [_resolve(cmd, targets)]
        run = cmd.launch("run", guard.extra_args()) + " " + " ".join(map(q, targets))
    else:
        resolve = []
        run = f"{task.test_cmd} {' '.join(map(q, targets))}"
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,  # the task's setup, as the agent had it (a failure shows in the test log)
                *_deps_check(task),
                *resolve,
                _apply_model(has_patch),
                *reset_verdict_files(task),
                f"git apply --verbose {GRADING_DIR}/test.patch || {{ echo '{TEST_PATCH_FAILED}'; exit 3; }}",
                TESTS_STEP,
                NORMALISE,
                f"echo '{START}'",
                f"{run} 2>&1",  # one stream, as swebench's harness reads a runner's output
                "rc=$?",
                f"echo '{END}'",
                f'echo "{EXIT} $rc"',
            ]
        )
        + "\n"
    )


def guard_row_script(script: str, guard: Guarded | None) -> tuple[str, PytestCommand | None]:
    """A row's own eval script as grading runs it: install and build steps turned off (they would run the tree's
    code after the model patch), and where guarded, its pytest lines started through the launcher (the first one's
    command returned, for the resolve step)."""
    lines = script.split("\n")
    first: PytestCommand | None = None
    out = []
    heredoc: str | None = None
    for line in lines:
        if heredoc is not None:
            out.append(line)
            if line == heredoc:
                heredoc = None
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m:
            heredoc = m.group(1)
            out.append(line)
            continue
        if _INSTALL_RE.search(line):
            out.append(": " + shlex.quote(f"swe-gym: not run after the model patch: {line.strip()[:300]}"))
            continue
        cmd = pytest_command(line) if guard is not None else None
        if cmd is not None:
            first = first or cmd
            line = cmd.launch("run", guard.extra_args() if guard is not None else [])
        out.append(line)
    if guard is not None and first is None:
        raise GradingError("the row's eval script runs no pytest command the grading guard can start")
    return "\n".join(out), first


def row_eval_wrapper(task: Task, has_patch: bool, first: PytestCommand | None) -> str:
    """For a row with its own eval script: env, setup, pytest's setup resolved at base_commit, the model patch, then
    the row's script (which resets the test files, applies the test patch and prints the markers), stdout and
    stderr in one stream as swebench reads them."""
    q = shlex.quote
    return (
        "\n".join(
            [
                *([task.env_activation] if task.env_activation else []),
                f"cd {q(task.workdir)}",
                *task.setup_commands,
                *([_resolve(first, [])] if first is not None else []),
                _apply_model(has_patch),
                *reset_verdict_files(task),
                f"bash {GRADING_DIR}/row_eval.sh 2>&1",
            ]
        )
        + "\n"
    )


def pad_pair(a: str, b: str) -> tuple[bytes, bytes]:
    """Two texts as bytes of one length: the shorter gets a trailing comment, so a file's size never tells a
    mutant from its original."""
    x, y = a.encode(), b.encode()
    n = max(len(x), len(y))
    return _pad(x, n), _pad(y, n)


def _pad(data: bytes, n: int) -> bytes:
    short = n - len(data)
    if short <= 0:
        return data
    if short == 1:
        return data + b"\n"
    return data + b"\n#" + b"-" * (short - 2)
