"""Chaining turns into training sequences (shared by the server's results and the trainer adapters).

A turn continues an earlier chain when its prompt starts with that chain's tokens so far (prompt + completion,
exact ids); the longest such chain wins. Where an agent's re-sent history re-tokenises differently from what was
sampled, the turn starts a new chain: tokens that were never sampled together are never spliced.
"""

from __future__ import annotations

from collections.abc import Iterable

from swe_gym_env.wire import Turn


def chain_turns(turns: Iterable[Turn]) -> list[list[Turn]]:
    chains: list[tuple[list[int], list[Turn]]] = []
    for turn in turns:
        prompt = turn.prompt_token_ids
        parent = max(
            (c for c in chains if len(c[0]) <= len(prompt) and prompt[: len(c[0])] == c[0]),
            key=lambda c: len(c[0]),
            default=None,
        )
        if parent is None:
            parent = ([], [])
            chains.append(parent)
        parent[0][:] = [*prompt, *turn.completion_token_ids]
        parent[1].append(turn)
    return [members for _, members in chains]
