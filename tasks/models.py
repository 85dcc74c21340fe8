"""The one validated task model every loader normalises into."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from swe_gym_env.wire import TaskView

REPO_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
INSTANCE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
TEST_ID_MAX = 2000


class Task(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str
    repo: str
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
    env_activation: str | None = Field(None, max_length=500, description="Shell prefix that activates the env.")
    test_cmd: str = Field("python -m pytest -rA -p no:cacheprovider", max_length=500)
    log_parser: str = Field("parse_log_pytest", pattern=r"^[a-z0-9_]{1,64}$")
    dataset: str = Field("bundled", max_length=200, description="Where the row came from.")
    setup_commands: list[str] = Field(
        [], max_length=32, description="Shell lines run in the work dir before the agent starts (and before grading)."
    )

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, v: str) -> str:
        if not INSTANCE_RE.match(v):
            raise ValueError("instance_id must match [A-Za-z0-9_.-]{1,200}")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not REPO_RE.match(v):
            raise ValueError("repo must look like OWNER/NAME")
        return v

    @field_validator("env_activation", "test_cmd")
    @classmethod
    def _one_line(cls, v: str | None) -> str | None:
        if v is not None and ("\n" in v or "\0" in v):
            raise ValueError("must be a single line")
        return v

    @field_validator("setup_commands")
    @classmethod
    def _setup_lines(cls, v: list[str]) -> list[str]:
        for line in v:
            if "\n" in line or "\0" in line or len(line) > 2000:
                raise ValueError("each setup command must be a single line of at most 2000 characters")
        return v

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


def patch_files(patch: str) -> list[str]:
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git a/"):
            path = line[len("diff --git a/") :].split(" b/", 1)[0]
            if path not in files:
                files.append(path)
    return files
