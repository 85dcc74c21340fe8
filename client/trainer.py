"""Trainer adapters: rollout results → training rows, using the captured ids and logprobs exactly as they are.

The rows are the rollout graph's sequences (`RolloutResult.sequences`), read from the compact turns by
`swe_gym_env.trace.forms` and laid out by `swe_gym_env.trace.compact`, the same code that lays out the server's export:
a row is a chain of calls each extending the previous one exactly, with loss mask 1 on sampled tokens. Discarded
sequences (abandoned branches: retried calls, calls the agent never used) never become rows. Rollouts that are not
`ok` (or have no reward) yield no rows: an unscorable rollout is excluded, never scored 0. A result whose sequences do
not match its turns is an error, not a row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from swe_gym_env.trace.compact import SequenceError
from swe_gym_env.trace.forms import TurnsView
from swe_gym_env.wire import RolloutResult, TrainingRow


def training_rows(result: RolloutResult, roles: Iterable[str] = ("agent", "aux")) -> list[TrainingRow]:
    """One row per kept sequence whose role is in ``roles`` (both by default; ``("agent",)`` for the agent's
    own conversations only)."""
    if not result.ok or result.reward is None:
        return []
    if result.turns and not result.sequences:
        raise SequenceError(f"rollout {result.rollout_id} has turns but no sequences (a result from an older server?)")
    view = TurnsView(result.turns)
    wanted = set(roles)
    rows = []
    for seq in result.sequences:
        if seq.discarded or seq.role not in wanted:
            continue
        try:
            chain = [view.turn(i) for i in seq.turns]
        except SequenceError:
            raise SequenceError(f"rollout {result.rollout_id}: sequence {seq.turns} names a turn it lacks") from None
        if any(t.discarded for t in chain):
            raise SequenceError(f"rollout {result.rollout_id}: kept sequence {seq.turns} holds a discarded turn")
        ids, mask, lps = view.sequence_tokens(seq.turns, seq.length)
        rows.append(
            TrainingRow(
                rollout_id=result.rollout_id,
                instance_id=result.instance_id,
                reward=result.reward,
                input_ids=ids,
                loss_mask=mask,
                logprobs=lps,
                turn_indices=list(seq.turns),
                role=seq.role,
            )
        )
    return rows


def main_row(rows: list[TrainingRow]) -> TrainingRow | None:
    """The row that stands for a rollout where only one fits (TRL takes one sequence per sample): among the
    agent's rows (any row when there is none), the one with the most sampled tokens; on a tie, the one that ends
    later in the rollout. Discarded branches are never rows, so this is always a branch the agent kept."""
    pool = [r for r in rows if r.role == "agent"] or rows
    return max(pool, key=lambda r: (sum(r.loss_mask), r.turn_indices[-1]), default=None)


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
