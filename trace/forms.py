"""Reading a compact rollout result: any turn's whole prompt ids and request, the full form, and training tokens.

A schema-2 result stores each turn as what the turn it continues did not have (`wire.Turn`): ``prompt_shared``
tokens of turn ``prompt_base``'s prompt + completion, then ``prompt_new_ids``; the first ``messages_kept`` messages
of turn ``messages_base``'s request, then ``new_messages``; ``params`` (None: the base's). A long conversation
therefore costs its context once, not once per call.

``TurnsView`` resolves turns, memoised: walking every turn in order costs the size of what it returns, not a walk
back through the chain per turn. ``expand`` gives the full form (every turn with ``prompt_token_ids`` and
``request``: the schema-1 shape, for debugging), ``compact`` takes it back (checking that the full fields agree),
``recompact`` rebuilds the compact fields from the full ones alone. Anything inconsistent (a base that is not an
earlier turn, more shared tokens than the base has, a sequence whose length or ids do not match) raises
`SequenceError`: never a plausible wrong answer.

Pure Python (the light client imports it): no server code, no numpy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from swe_gym_env.trace.compact import SequenceError, compact_turns, materialize
from swe_gym_env.wire import RolloutResult, RolloutSummary, SequenceRef, Turn

CACHED_SEQUENCES = 8  # whole token lists a view keeps (most recently used): enough for a chain walked in order


class TurnsView:
    """Memoised access to compact turns (a result's, or a live session's)."""

    def __init__(self, turns: Sequence[Turn]) -> None:
        self.turns = list(turns)
        self._by_index: dict[int, Turn] = {}
        for t in self.turns:
            if t.index in self._by_index:
                raise SequenceError(f"two turns have index {t.index}")
            self._by_index[t.index] = t
        self._seqs: OrderedDict[int, list[int]] = OrderedDict()
        self._messages: dict[int, list[dict]] = {}
        self._params: dict[int, dict] = {}
        self._verified: dict[int, int] = {}  # per turn: how much of its prompt + completion matches `_against`
        self._against: list[int] | None = None

    def turn(self, index: int) -> Turn:
        t = self._by_index.get(index)
        if t is None:
            raise SequenceError(f"no turn {index}")
        return t

    def _base(self, t: Turn, base: int | None) -> Turn | None:
        if base is None:
            return None
        if base >= t.index or base not in self._by_index:
            raise SequenceError(f"turn {t.index} continues turn {base}, which is not an earlier turn")
        return self._by_index[base]

    @staticmethod
    def _check(t: Turn) -> None:
        if t.prompt_len != t.prompt_shared + len(t.prompt_new_ids):
            raise SequenceError(
                f"turn {t.index}: prompt_len {t.prompt_len} != {t.prompt_shared} shared + {len(t.prompt_new_ids)} new"
            )
        if len(t.logprobs) != len(t.completion_token_ids):
            raise SequenceError(f"turn {t.index}: {len(t.completion_token_ids)} ids but {len(t.logprobs)} logprobs")
        if t.prompt_base is None and t.prompt_shared:
            raise SequenceError(f"turn {t.index} shares {t.prompt_shared} tokens with no base")

    # -- tokens ------------------------------------------------------------------------------------------------
    def seq(self, index: int) -> list[int]:
        """The turn's prompt + completion (a cached list: do not change it)."""
        cached = self._seqs.get(index)
        if cached is not None:
            self._seqs.move_to_end(index)
            return cached
        chain: list[Turn] = []
        t: Turn | None = self.turn(index)
        start: list[int] = []
        while t is not None:
            if t.index in self._seqs and chain:
                start = self._seqs[t.index]
                break
            chain.append(t)
            t = self._base(t, t.prompt_base)
        buf = list(start)
        for t in reversed(chain):
            self._check(t)
            if t.prompt_shared > len(buf):
                raise SequenceError(
                    f"turn {t.index} shares {t.prompt_shared} tokens of turn {t.prompt_base}, which has {len(buf)}"
                )
            del buf[t.prompt_shared :]
            buf += t.prompt_new_ids
            buf += t.completion_token_ids
        self._seqs[index] = buf
        while len(self._seqs) > CACHED_SEQUENCES:
            self._seqs.popitem(last=False)
        return buf

    def prompt(self, index: int) -> list[int]:
        """The turn's whole prompt ids (a new list)."""
        return self.seq(index)[: self.turn(index).prompt_len]

    def _prefix_holds(self, index: int, n: int, ids: list[int]) -> bool:
        """Whether the turn's first ``n`` tokens of prompt + completion are ``ids[:n]``: each turn's own new ids
        compared once per ``ids`` (what it shares was compared through its base)."""
        if self._against is not ids:
            self._against, self._verified = ids, {}
        todo: list[tuple[Turn, int]] = []
        t: Turn | None = self.turn(index)
        while t is not None and n > 0 and self._verified.get(t.index, -1) < n:
            self._check(t)
            todo.append((t, n))
            n = min(n, t.prompt_shared)
            t = self._base(t, t.prompt_base)
        for t, n in reversed(todo):
            own = [*t.prompt_new_ids, *t.completion_token_ids]
            a = t.prompt_shared
            if n > a + len(own) or n > len(ids) or ids[a:n] != own[: max(0, n - a)]:
                return False
            self._verified[t.index] = n
        return True

    def sequence_tokens(
        self, turns: Sequence[int], length: int | None = None
    ) -> tuple[list[int], list[int], list[float]]:
        """Tokens, loss mask and logprobs of a training sequence (its calls in order), laid out by
        `sequences.materialize`; every call's prompt must be a prefix of the sequence."""
        if not turns:
            raise SequenceError("an empty sequence")
        chain = [self.turn(i) for i in turns]
        for t in chain:
            self._check(t)
        ids, mask, lps = materialize(
            self.prompt(turns[-1]), [(t.prompt_len, t.completion_token_ids, t.logprobs) for t in chain]
        )
        if length is not None and length != len(ids):
            raise SequenceError(f"sequence {list(turns)} is said to hold {length} tokens but holds {len(ids)}")
        for t in chain:
            if not self._prefix_holds(t.index, t.prompt_len, ids):
                raise SequenceError(f"call {t.index} of sequence {list(turns)}: its prompt is not a prefix of it")
        return ids, mask, lps

    # -- requests ----------------------------------------------------------------------------------------------
    def messages(self, index: int) -> list[dict]:
        """The turn's request messages (a cached list: do not change it)."""
        got = self._messages.get(index)
        if got is not None:
            return got
        chain: list[Turn] = []
        t: Turn | None = self.turn(index)
        while t is not None and t.index not in self._messages:
            chain.append(t)
            t = self._base(t, t.messages_base)
        for t in reversed(chain):
            base = self._messages[t.messages_base] if t.messages_base is not None else []
            if t.messages_kept > len(base):
                raise SequenceError(
                    f"turn {t.index} keeps {t.messages_kept} messages of turn {t.messages_base}, which has {len(base)}"
                )
            self._messages[t.index] = [*base[: t.messages_kept], *t.new_messages]
        return self._messages[index]

    def params(self, index: int) -> dict:
        """The turn's request without its messages (a cached dict: do not change it)."""
        if index in self._params:
            return self._params[index]
        chain: list[Turn] = []
        t = self.turn(index)
        while t.params is None and t.index not in self._params:
            chain.append(t)
            base = self._base(t, t.messages_base)
            if base is None:
                raise SequenceError(f"turn {t.index} takes its request's params from no turn")
            t = base
        p = self._params[t.index] if t.index in self._params else t.params
        assert p is not None
        self._params[t.index] = p
        for c in chain:
            self._params[c.index] = p
        return p

    def request(self, index: int) -> dict:
        """The turn's whole request as forwarded upstream (a new dict; messages are shared with other turns)."""
        return {**self.params(index), "messages": list(self.messages(index))}


def _view(source: RolloutResult | Sequence[Turn] | TurnsView) -> TurnsView:
    if isinstance(source, TurnsView):
        return source
    return TurnsView(source.turns if isinstance(source, RolloutResult) else source)


def prompt_ids(source: RolloutResult | Sequence[Turn] | TurnsView, index: int) -> list[int]:
    """A turn's whole prompt ids. Reading many turns: build one `TurnsView` and pass it (memoised)."""
    return _view(source).prompt(index)


def request_of(source: RolloutResult | Sequence[Turn] | TurnsView, index: int) -> dict:
    """A turn's whole request (messages, tools, sampling), as forwarded to the engine."""
    return _view(source).request(index)


def expand_turns(turns: Sequence[Turn]) -> list[Turn]:
    """The turns in the full form: each also with its whole ``prompt_token_ids`` and ``request``."""
    view = TurnsView(turns)
    return [
        t.model_copy(update={"prompt_token_ids": view.prompt(t.index), "request": view.request(t.index)})
        for t in view.turns
    ]


def expand(result: RolloutResult) -> RolloutResult:
    """The full form: every turn also with its whole ``prompt_token_ids`` and ``request`` (schema-1 shape)."""
    return result.model_copy(update={"turns": expand_turns(result.turns)})


def compact(result: RolloutResult) -> RolloutResult:
    """The compact form: the full-form fields dropped, after checking they are what the compact fields say."""
    view = TurnsView(result.turns)
    turns = []
    for t in result.turns:
        if t.prompt_token_ids is not None and t.prompt_token_ids != view.prompt(t.index):
            raise SequenceError(f"turn {t.index}: its prompt_token_ids differ from its compact prompt")
        if t.request is not None and t.request != view.request(t.index):
            raise SequenceError(f"turn {t.index}: its request differs from its compact request")
        turns.append(t.model_copy(update={"prompt_token_ids": None, "request": None}))
    return result.model_copy(update={"turns": turns})


def recompact(full: RolloutResult) -> RolloutResult:
    """The compact form rebuilt from the full-form fields alone (every turn needs ``prompt_token_ids`` and
    ``request``), as a schema-1 result is upgraded."""
    if any(t.prompt_token_ids is None or t.request is None for t in full.turns):
        raise SequenceError("recompact needs the full form (prompt_token_ids and request on every turn)")
    keep = (
        set(Turn.model_fields)
        - {"prompt_len", "prompt_base", "prompt_shared", "prompt_new_ids"}
        - {
            "messages_base",
            "messages_kept",
            "new_messages",
            "params",
        }
    )
    dicts = compact_turns([{k: getattr(t, k) for k in keep} for t in full.turns])
    turns = [Turn.model_validate({**d, "prompt_token_ids": None, "request": None}) for d in dicts]
    return full.model_copy(update={"turns": turns})


def sequence_tokens(
    result: RolloutResult, seq: SequenceRef, view: TurnsView | None = None
) -> tuple[list[int], list[int], list[float]]:
    """A training sequence's tokens, loss mask (1 on sampled tokens) and logprobs (0.0 elsewhere)."""
    return (view or TurnsView(result.turns)).sequence_tokens(seq.turns, seq.length)


def check_sequences(result: RolloutResult, view: TurnsView | None = None) -> None:
    """Every sequence lays out (``SequenceError`` otherwise) and every turn's ``sequence`` names one holding it."""
    view = view or TurnsView(result.turns)
    for k, seq in enumerate(result.sequences):
        view.sequence_tokens(seq.turns, seq.length)
        for i in seq.turns:
            if view.turn(i).sequence not in (None, k):
                raise SequenceError(f"turn {i} names sequence {view.turn(i).sequence}, but sequence {k} holds it")


def summary_of(result: RolloutResult, form: type[RolloutSummary] = RolloutSummary, **more) -> RolloutSummary:
    """The one summary of a finished result: a listing's `RolloutSummary`, or (``form=ResultSummary``, with the
    fields only it has in ``more``) the summary form's. Its error is cut to 4,000 characters."""
    fields = dict(
        rollout_id=result.rollout_id,
        instance_id=result.instance_id,
        harness=result.harness,
        sandbox=result.sandbox,
        phase=result.phase,
        state="finished",
        ok=result.ok,
        reward=result.reward,
        turns=len(result.turns),
        roots=result.roots,
        error=result.error[:4000] if result.error else None,
        capture_session_id=result.capture_session_id,
        variant=result.variant,
    )
    return form(**fields, **more)


__all__ = [
    "SequenceError",
    "TurnsView",
    "check_sequences",
    "compact",
    "expand",
    "expand_turns",
    "prompt_ids",
    "recompact",
    "request_of",
    "sequence_tokens",
    "summary_of",
]
