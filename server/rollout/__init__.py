"""Rollouts: the service (front door, registry, queue, subscriptions), the pipeline of phases (the one place that
composes task, capture, sandbox, agent and grading), the agent phase and its cross-check, engine choice, and the git
steps in a workspace.

- `config`: `ServerConfig` (from the environment)
- `record`: `RolloutRecord` (a rollout as the server tracks it), `RunState` (what a run has learned), `RolloutFailure`
- `service`: `RolloutService`
- `pipeline`: `Pipeline` (phases), `PROMPT`
- `agent_run`: run and watch the agent, cross-check, engine failures, task-seen check
- `engines`: engine choice and certificates
- `workspace`: task setup commit, diff extraction, reading the agent's files
"""

from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.server.rollout.pipeline import PROMPT
from swe_gym_env.server.rollout.record import RolloutFailure, RolloutRecord, RunState
from swe_gym_env.server.rollout.service import RolloutService

__all__ = ["PROMPT", "RolloutFailure", "RolloutRecord", "RolloutService", "RunState", "ServerConfig"]
