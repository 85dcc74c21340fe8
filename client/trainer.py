"""Trainer adapters: rollout results → training rows, using the captured ids and logprobs exactly as they are.

Turns are chained into one sequence while each prompt starts with the previous turn's prompt + completion
(exact token prefix); where an agent's re-sent history re-tokenises differently, a new sequence starts instead of
splicing tokens that were never sampled together. Rollouts that are not `ok` (or have no reward) yield no rows:
an unscorable rollout is excluded, never scored 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from swe_gym_env.wire import RolloutResult, TrainingRow


def training_rows(result: RolloutResult) -> list[TrainingRow]:
    if not result.ok or result.reward is None:
        return []
    chains: list[dict] = []
    for turn in result.turns:
        prompt, completion = turn.prompt_token_ids, turn.completion_token_ids
        parent = max(
            (c for c in chains if len(c["ids"]) <= len(prompt) and prompt[: len(c["ids"])] == c["ids"]),
            key=lambda c: len(c["ids"]),
            default=None,
        )
        if parent is None:
            parent = {"ids": [], "mask": [], "lps": [], "turns": []}
            chains.append(parent)
        new_prompt = prompt[len(parent["ids"]) :]
        parent["ids"] += [*new_prompt, *completion]
        parent["mask"] += [0] * len(new_prompt) + [1] * len(completion)
        parent["lps"] += [0.0] * len(new_prompt) + list(turn.logprobs)
        parent["turns"].append(turn.index)
    return [
        TrainingRow(
            rollout_id=result.rollout_id,
            instance_id=result.instance_id,
            reward=result.reward,
            input_ids=c["ids"],
            loss_mask=c["mask"],
            logprobs=c["lps"],
            turn_indices=c["turns"],
        )
        for c in chains
    ]


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
