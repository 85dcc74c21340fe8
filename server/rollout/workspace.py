"""Git steps in a rollout's sandbox: the task's setup as the agent's starting point, the agent's diff, its files."""

from __future__ import annotations

import shlex

from swe_gym_env.server.rollout.record import RolloutFailure
from swe_gym_env.server.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import backend_class
from swe_gym_env.tasks.models import Task
from swe_gym_env.wire import Phase

DIFF_LIMIT = 4 * 1024 * 1024
SETUP_TIMEOUT_S = 600.0
DIFF_EXCLUDES = "':(exclude)**/__pycache__/**' ':(exclude)*.pyc' ':(exclude).pytest_cache/**'"
SETUP_SCRIPT = "/tmp/.swe-gym-setup.sh"


def task_spec(task: Task, backend: str, **fields) -> SandboxSpec:
    """A sandbox for this task on ``backend``: the task's image and the repository already in it where the backend
    runs images and the task names one; else its host repository (cloned), base commit and workdir."""
    in_image = bool(task.image) and backend_class(backend).uses_image
    return SandboxSpec(
        repo_source="" if in_image else task.repo_source or "",
        base_commit=task.base_commit,
        workdir=task.workdir,
        image=task.image,
        **fields,
    )


async def run_task_setup(sbx: Sandbox, task: Task) -> str:
    """Run the task's own setup before the agent starts and commit its effects: what it changed is the agent's
    starting point, not part of its diff (grading re-runs setup). Returns the commit to diff against."""
    await sbx.write_file(SETUP_SCRIPT, task.setup_script().encode(), 0o700)
    r = await sbx.exec(f"bash {SETUP_SCRIPT}", timeout=SETUP_TIMEOUT_S)
    if not r.ok:
        why = "timed out" if r.timed_out else f"exit {r.exit_code}"
        raise RolloutFailure("boot", f"task setup commands failed ({why}): {r.stderr[-500:]}")
    return await commit_workspace(sbx, "task setup", "could not record the state after task setup")


async def _git(sbx: Sandbox, command: str, phase: Phase, failure: str, tail: int) -> ExecResult:
    """Run ``command`` (git, two minutes at most); a failure is ``phase``'s, saying ``failure`` and the last
    ``tail`` characters of its stderr."""
    r = await sbx.exec(command, timeout=120)
    if not r.ok:
        raise RolloutFailure(phase, f"{failure}: {r.stderr[-tail:]}")
    return r


async def commit_workspace(sbx: Sandbox, message: str, failure: str, before: str = "") -> str:
    """Run ``before`` (shell, may be empty), then commit everything in the workspace as ``message``; returns the
    commit, which the agent's diff is taken against. A failure is the boot phase's, saying ``failure``."""
    r = await _git(
        sbx,
        f"{before}git add -A -- . && git -c user.name=swe-gym -c user.email=swe-gym@localhost commit -q "
        f"--allow-empty --no-verify -m {shlex.quote(message)} && git rev-parse HEAD",
        "boot",
        failure,
        300,
    )
    return r.stdout.strip().splitlines()[-1]


async def extract_diff(sbx: Sandbox, base: str) -> str:
    await _git(
        sbx,
        f"git add -A -- . {DIFF_EXCLUDES} && git diff --cached --binary --no-color "
        f"--no-ext-diff {shlex.quote(base)} > /tmp/.model.patch",
        "diff",
        "could not extract the agent's diff",
        500,
    )
    data = await sbx.read_file("/tmp/.model.patch", DIFF_LIMIT + 1)
    if len(data) > DIFF_LIMIT:
        raise RolloutFailure("diff", f"the agent's diff is over {DIFF_LIMIT} bytes")
    return data.decode("utf-8", "replace")


async def read_text(sbx: Sandbox, path: str, tail: int | None = None) -> str:
    """A file the agent wrote (it may be missing if the agent died early: then empty)."""
    try:
        text = (await sbx.read_file(path)).decode("utf-8", "replace")
    except (OSError, SandboxError):
        return ""
    return text[-tail:] if tail else text
