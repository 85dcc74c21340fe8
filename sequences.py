"""Training sequences from captured calls: the one way their tokens, loss mask and logprobs are laid out.

The rollout graph (server side) decides which calls form a sequence; this module turns such a chain of calls into
tokens. It is shared by the server's export and the trainer-side rows, so the two cannot disagree. Pure Python: the
light client imports it.

A chain is a list of calls in order, each extending the previous one exactly: call k's prompt is call k-1's prompt +
completion + whatever came in between (tool results). The sequence's tokens are the last call's prompt + completion;
each call's completion sits at its own position with loss mask 1 and its captured logprobs; everything else has mask
0 and logprob 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence


class SequenceError(ValueError):
    """The calls given as a chain do not extend one another exactly: not a training sequence."""


def materialize(
    last_prompt: Sequence[int], members: Sequence[tuple[int, Sequence[int], Sequence[float]]]
) -> tuple[list[int], list[int], list[float]]:
    """Tokens, loss mask and logprobs of a chain. ``members`` are (prompt length, completion ids, logprobs) per
    call, in order; ``last_prompt`` is the last call's full prompt."""
    if not members:
        raise SequenceError("an empty chain")
    ids = [*last_prompt, *members[-1][1]]
    mask = [0] * len(ids)
    lps = [0.0] * len(ids)
    end = 0
    for prompt_len, completion, logprobs in members:
        a, b = prompt_len, prompt_len + len(completion)
        if a < end or b > len(ids):
            raise SequenceError(f"a call's completion at [{a}, {b}) does not follow the previous one (ends {end})")
        if len(logprobs) != len(completion):
            raise SequenceError(f"{len(completion)} completion ids but {len(logprobs)} logprobs")
        if list(ids[a:b]) != list(completion):
            raise SequenceError(f"a later prompt does not hold the completion at [{a}, {b}) exactly")
        mask[a:b] = [1] * (b - a)
        lps[a:b] = [float(x) for x in logprobs]
        end = b
    return ids, mask, lps


def check_prefixes(prompts: Sequence[Sequence[int]], full: Sequence[int]) -> None:
    """Each call's prompt must be a prefix of the chain's tokens (not only its completion at the right place)."""
    for k, p in enumerate(prompts):
        if len(p) > len(full) or list(full[: len(p)]) != list(p):
            raise SequenceError(f"call {k} of the chain: its prompt is not a prefix of the sequence")
