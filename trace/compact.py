"""The trace format's pure layer: compact turns (each prompt and request as what the turn it continues lacks) and
training sequences (tokens, loss mask and logprobs of a chain of calls). Dicts and id lists only, no project import:
`wire.py` builds its models on it and the light client imports it.

Compact turns: `compact_turns` takes full-form turn dicts (whole ``prompt_token_ids`` and ``request``) to the
compact form, each taken from the earlier turn sharing the longest prefix of ids among its parent, the turn it
retries and the turn before it; `swe_gym_env.trace.forms.expand` gives the same prompts and requests back.

Training sequences: the rollout graph (server side) decides which calls form a sequence; `materialize` turns such a
chain of calls into tokens. It is shared by the server's export and the trainer-side rows, so the two cannot
disagree. A chain is a list of calls in order, each extending the previous one exactly: call k's prompt is call
k-1's prompt + completion + whatever came in between (tool results). The sequence's tokens are the last call's
prompt + completion; each call's completion sits at its own position with loss mask 1 and its captured logprobs;
everything else has mask 0 and logprob 0.0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


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


# -- compact turns -----------------------------------------------------------------------------------------------------


def standalone(turn: dict) -> dict:
    """A full-form turn dict's compact fields when it stands on its own (nothing taken from an earlier turn)."""
    prompt = list(turn["prompt_token_ids"])
    request = turn.get("request") or {}
    return {
        "prompt_len": len(prompt),
        "prompt_base": None,
        "prompt_shared": 0,
        "prompt_new_ids": prompt,
        "messages_base": None,
        "messages_kept": 0,
        "new_messages": list(request.get("messages") or []),
        "params": {k: v for k, v in request.items() if k != "messages"},
    }


def _canon(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def lcp(a: Sequence[int], b: Sequence[int], start: int = 0) -> int:
    """Length of the longest common prefix of two id lists (slices compared in C, a chunk at a time)."""
    n = min(len(a), len(b))
    i = start
    step = 4096
    while i < n:
        j = min(n, i + step)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def compact_turns(turns: list[dict]) -> list[dict]:
    """Full-form turn dicts (each with its whole ``prompt_token_ids`` and ``request``) in the compact form: each
    prompt and request taken from the earlier turn sharing the longest prefix of ids among its parent, the turn it
    retries and the turn before it. Exact: `result_form.expand` gives the same prompts and requests back."""
    out: list[dict] = []
    canon: dict[int, list[str]] = {}
    by_index: dict[int, dict] = {}
    for t in turns:
        prompt = list(t["prompt_token_ids"])
        request = t.get("request") or {}
        messages = list(request.get("messages") or [])
        params = {k: v for k, v in request.items() if k != "messages"}
        i = t["index"]
        best, shared = None, 0
        for c in dict.fromkeys(x for x in (t.get("parent"), t.get("retry_of"), i - 1) if x is not None):
            prev = by_index.get(c)
            if prev is None or c >= i:
                continue
            pp, pc = prev["prompt_token_ids"], prev["completion_token_ids"]
            n = lcp(prompt, pp)
            if n == len(pp):
                n += lcp(prompt[n:], pc)
            if n > shared or (n == shared and n > 0 and best is not None and c > best):
                best, shared = c, n
        mine = [_canon(m) for m in messages]
        kept = 0
        if best is not None:
            theirs = canon[best]
            while kept < min(len(theirs), len(mine)) and theirs[kept] == mine[kept]:
                kept += 1
            base_request = by_index[best].get("request") or {}
            same = _canon(params) == _canon({k: v for k, v in base_request.items() if k != "messages"})
        else:
            same = False
        canon[i] = mine
        by_index[i] = t
        compact = {k: v for k, v in t.items() if k not in ("prompt_token_ids", "request")}
        compact.update(
            prompt_len=len(prompt),
            prompt_base=best,
            prompt_shared=shared,
            prompt_new_ids=prompt[shared:],
            messages_base=best,
            messages_kept=kept,
            new_messages=messages[kept:],
            params=None if same else params,
        )
        out.append(compact)
    return out


def count_roots(turns: Sequence[Any]) -> int:
    """Conversations in the rollout graph: calls that continue none before them (the one count of roots)."""
    return sum(1 for t in turns if t.parent is None)
