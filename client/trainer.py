"""Trainer adapters: rollout results → training rows, using the captured ids and logprobs exactly as they are.

Turns are chained into sequences by `swe_gym_env.sequences.chain_turns` (exact token prefixes only). Rollouts
that are not `ok` (or have no reward) yield no rows: an unscorable rollout is excluded, never scored 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from swe_gym_env.sequences import chain_turns
from swe_gym_env.wire import RolloutResult, TrainingRow


def training_rows(result: RolloutResult) -> list[TrainingRow]:
    if not result.ok or result.reward is None:
        return []
    rows = []
    for chain in chain_turns(result.turns):
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        for turn in chain:
            new_prompt = turn.prompt_token_ids[len(ids) :]
            ids += [*new_prompt, *turn.completion_token_ids]
            mask += [0] * len(new_prompt) + [1] * len(turn.completion_token_ids)
            lps += [0.0] * len(new_prompt) + list(turn.logprobs)
        rows.append(
            TrainingRow(
                rollout_id=result.rollout_id,
                instance_id=result.instance_id,
                reward=result.reward,
                input_ids=ids,
                loss_mask=mask,
                logprobs=lps,
                turn_indices=[t.index for t in chain],
            )
        )
    return rows


def group_advantages(results: Iterable[RolloutResult]) -> dict[str, float]:
    """GRPO-style advantages per rollout: reward minus its task group's mean reward (scorable rollouts only)."""
    groups: dict[str | None, list[RolloutResult]] = defaultdict(list)
    for r in results:
        if r.ok and r.reward is not None:
            groups[r.instance_id].append(r)
    out: dict[str, float] = {}
    for members in groups.values():
        mean = sum(r.reward for r in members) / len(members)  # type: ignore[misc]
        for r in members:
            out[r.rollout_id] = r.reward - mean  # type: ignore[operator]
    return out
