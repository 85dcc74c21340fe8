"""The one validated task model every loader normalises into."""

from __future__ import annotations

import json
import re
import shlex
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from swe_gym_env.wire import TaskView

REPO_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
INSTANCE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
TEST_ID_MAX = 2000
PYTEST_CMD = "python -m pytest -rA -p no:cacheprovider"
EVAL_SCRIPT_MAX = 4 * 1024 * 1024


def _single_lines(v: list[str], what: str, limit: int = 2000) -> list[str]:
    for line in v:
        if "\n" in line or "\0" in line or len(line) > limit:
            raise ValueError(f"each {what} must be a single line of at most {limit} characters")
    return v


def _one_line(v: str | None, message: str = "must be a single line") -> str | None:
    if v is not None and ("\n" in v or "\0" in v):
        raise ValueError(message)
    return v


def single_lines(what: str) -> AfterValidator:
    """A list field's check: each item one line (`_single_lines`), ``what`` naming an item in the error."""
    return AfterValidator(lambda v: _single_lines(v, what))


def one_line(message: str = "must be a single line") -> AfterValidator:
    """A text field's check: no line break, no NUL (`_one_line`), else ``message``."""
    return AfterValidator(lambda v: _one_line(v, message))


def matching(pattern: re.Pattern[str], message: str) -> AfterValidator:
    """A text field's check: ``pattern`` matches it, else ``message``."""

    def check(v: str) -> str:
        if not pattern.match(v):
            raise ValueError(message)
        return v

    return AfterValidator(check)


# A requirement string starts with a distribution name (then extras, specifiers, a marker or `@ URL`); never "-":
# pip_packages go to pip as argv items, so a leading dash would be an option.
REQUIREMENT_RE = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]{0,100}[A-Za-z0-9])?)(?=$|[\s\[<>=!~;@])")


class InstallConfig(BaseModel):
    """The environment a task's tests need (SWE-rebench's `install_config`, SWE-bench's per-version spec): the
    requirement set a `local` task environment is built from, and what an image's environment must hold."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    python: str | None = Field(None, pattern=r"^3(\.\d{1,2}){0,2}$", description="Python version, e.g. 3.9.")
    packages: str | None = Field(
        None, max_length=2000, description="`requirements.txt`, `environment.yml`, or conda package names."
    )
    reqs_path: list[str] = Field(
        [], max_length=16, description="Requirements files in the repo (packages=requirements.txt)."
    )
    env_yml_path: list[str] = Field([], max_length=16)
    pip_packages: list[str] = Field([], max_length=200, description="pip requirement strings (the test tooling).")
    pre_install: Annotated[list[str], single_lines("pre_install command")] = Field(
        [], max_length=64, description="Shell lines run before `install`."
    )
    install: Annotated[str | None, one_line("install must be a single line")] = Field(
        None, max_length=2000, description="Installs the repo itself, e.g. `pip install -e .`."
    )

    @field_validator("python", mode="before")
    @classmethod
    def _python(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int | float) else v

    @field_validator("reqs_path", "env_yml_path", "pip_packages", "pre_install", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("pip_packages")
    @classmethod
    def _requirements(cls, v: list[str]) -> list[str]:
        for req in v:
            if not REQUIREMENT_RE.match(req) or "\n" in req or "\0" in req or len(req) > 500:
                raise ValueError(f"pip_packages: not a plain requirement: {req[:80]!r}")
        return v

    @field_validator("reqs_path", "env_yml_path")
    @classmethod
    def _paths(cls, v: list[str]) -> list[str]:
        for path in v:
            if not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,200}$", path) or ".." in path.split("/"):
                raise ValueError(f"not a relative path in the repo: {path[:80]!r}")
        return v

    @field_validator("install")
    @classmethod
    def _install(cls, v: str | None) -> str | None:
        return v or None

    def requirement_names(self) -> list[str]:
        """The distribution names `pip_packages` declares (what must be importable metadata in the env)."""
        return [m.group(1) for req in self.pip_packages if (m := REQUIREMENT_RE.match(req))]


class Task(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: Annotated[str, matching(INSTANCE_RE, "instance_id must match [A-Za-z0-9_.-]{1,200}")]
    repo: Annotated[str, matching(REPO_RE, "repo must look like OWNER/NAME")]
    base_commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    problem_statement: str = Field(min_length=1, max_length=200_000)
    hints_text: str = ""
    patch: str = Field("", description="Gold patch. Server-side only: never sent to an agent.")
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str] = []
    repo_source: str | None = Field(None, description="Local git repo or bundle (absolute path) for `local`.")
    image: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._/:@-]{0,254}$", description="Container image.")
    workdir: str = Field("/testbed", pattern=r"^/[A-Za-z0-9_./-]{0,200}$")
    env_activation: Annotated[str | None, one_line()] = Field(
        None,
        max_length=1000,
        description="Shell line that activates the task's environment: the image's (conda `testbed`), or for a task "
        "with an `install_config` and a local repository, the `local` venv built from it when the image's is absent.",
    )
    test_cmd: Annotated[str, one_line()] = Field(PYTEST_CMD, max_length=500)
    test_args: Literal["files", "django_labels"] = Field(
        "files", description="How the test patch's files are passed to test_cmd (django_labels: Django's runner)."
    )
    log_parser: str | None = Field(
        None,
        pattern=r"^[a-z0-9_]{1,64}$",
        description="A swebench parser name; None: the one swebench maps to the repo, else parse_log_pytest.",
    )
    install_config: InstallConfig | None = Field(None, description="The requirement set of the task's environment.")
    eval_script: str | None = Field(
        None, max_length=EVAL_SCRIPT_MAX, description="The row's own SWE-bench eval script (graded via make_test_spec)."
    )
    eval_type: Literal["pass_and_fail", "fail_only"] = "pass_and_fail"
    version: str = Field("", max_length=100)
    dataset: str = Field("bundled", max_length=200, description="Where the row came from.")
    setup_commands: Annotated[list[str], single_lines("setup command")] = Field(
        [], max_length=32, description="Shell lines run in the work dir before the agent starts (and before grading)."
    )

    @field_validator("eval_script")
    @classmethod
    def _eval_script(cls, v: str | None) -> str | None:
        if v is not None and "\0" in v:
            raise ValueError("eval_script must not contain NUL")
        return v or None

    def setup_script(self) -> str:
        """The setup commands as one script: env activation, the work dir, then each line; stops at a failure."""
        lines = [*([self.env_activation] if self.env_activation else []), f"cd {shlex.quote(self.workdir)}"]
        return "set -e\n" + "\n".join([*lines, *self.setup_commands]) + "\n"

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _test_list(cls, v: Any) -> Any:
        if isinstance(v, str):  # SWE-bench ships these as JSON strings
            v = json.loads(v)
        if isinstance(v, list):
            for t in v:
                if not isinstance(t, str) or not t or len(t) > TEST_ID_MAX or "\n" in t or "\0" in t:
                    raise ValueError(f"bad test id: {str(t)[:80]!r}")
        return v

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("FAIL_TO_PASS must not be empty")
        return v

    def public_view(self) -> dict[str, Any]:
        """What an agent, a client or the UI may see: never the gold patch or the test patch."""
        return self.view().model_dump()

    def view(self) -> TaskView:
        return TaskView.model_validate(self.model_dump(include=set(TaskView.model_fields)))

    def test_files(self) -> list[str]:
        """Files the test patch touches (these are reset to base_commit before grading)."""
        return patch_files(self.test_patch)

    def test_targets(self) -> list[str]:
        """What test_cmd gets as arguments: the test files, or for Django's runner their module labels."""
        files = self.test_files()
        if self.test_args == "django_labels":
            return [django_label(f) for f in files]
        return files


def django_label(path: str) -> str:
    """tests/admin_views/test_forms.py -> admin_views.test_forms (how Django's runtests.py names test modules)."""
    parts = path.split("/")
    if parts[0] == "tests":
        parts = parts[1:]
    if parts and parts[-1].endswith(".py"):
        parts[-1] = parts[-1][:-3]
    return ".".join(parts)


def patch_files(patch: str) -> list[str]:
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git a/"):
            path = line[len("diff --git a/") :].split(" b/", 1)[0]
            if path not in files:
                files.append(path)
    return files
