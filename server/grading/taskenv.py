"""The task's environment made usable in a grading sandbox: the image's conda env where it has one, else the `local`
venv of the task's requirement set, built on the host once (`swe_gym_env.tasks.envs`)."""

from __future__ import annotations

from swe_gym_env.server.sandbox.base import Sandbox
from swe_gym_env.tasks.envs import CONDA_ACTIVATE_SCRIPT, prepare_env, task_env
from swe_gym_env.tasks.models import Task


async def ensure_env(sbx: Sandbox, task: Task) -> str:
    """Make the env `task.env_activation` selects usable in ``sbx`` (building the `local` venv on the host when the
    sandbox has no conda env of its own); returns a description of that env for the grading report."""
    env = task_env(task)
    if env is not None:
        probe = await sbx.exec(f"[ -f {CONDA_ACTIVATE_SCRIPT} ]", timeout=60)
        if probe.exit_code != 0:
            env = await prepare_env(task)
            assert env is not None
            why = f" ({'; '.join(env.notes)})" if env.notes else ""
            return f"local venv {env.sandbox_path} (python {env.python}){why}"
    if task.env_activation and CONDA_ACTIVATE_SCRIPT in task.env_activation:
        return "the image's conda env testbed"
    return "the sandbox's default Python (task runtime)"
