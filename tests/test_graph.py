"""The rollout graph on hand-made calls: how calls link, which are discarded, their roles, and the training rows.

Every case checks the graph's own sequences, the trainer rows (`training_rows`, through a `RolloutResult` as the
server builds it) against rows computed by hand, and that the export's sequences equal the rows. Prompts are at
least one index block (16 tokens) long where they must link: shorter shared openings are, by design, unrelated.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swe_gym_env.client.trainer import main_row, training_rows
from swe_gym_env.client.trl_adapter import trl_output
from swe_gym_env.server.capture import CaptureProxy
from swe_gym_env.server.capture.graph import BLOCK, RolloutGraph
from swe_gym_env.trace.compact import SequenceError, check_prefixes
from swe_gym_env.wire import RolloutResult, SequenceRef, Turn

SYS = list(range(1000, 1032))  # a 32-token system prompt
USER = list(range(2000, 2020))
OTHER_SYS = list(range(5000, 5040))  # a subagent / title generator with its own system prompt


def lp(ids: list[int]) -> list[float]:
    return [-0.01 * (1 + t % 7) for t in ids]


class Build:
    """Calls as an agent makes them, linked as the capture proxy links them; ends in a RolloutResult."""

    def __init__(self) -> None:
        self.g = RolloutGraph()
        self.turns: list[Turn] = []

    def call(self, prompt: list[int], completion: list[int]) -> int:
        self.g.add(prompt, completion, lp(completion))
        n = self.g.nodes[-1]
        self.turns.append(
            Turn(
                index=n.index,
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                logprobs=lp(completion),
                finish_reason="stop",
                streamed=True,
                wall_s=0.0,
                request={},
                response_message={},
                parent=n.parent,
                relation=n.relation,
                retry_of=n.retry_of,
            )
        )
        return n.index

    def seq(self, i: int) -> list[int]:
        t = self.turns[i]
        return [*t.prompt_token_ids, *t.completion_token_ids]

    def result(self, demoted: set[int] | None = None) -> RolloutResult:
        segments = CaptureProxy.apply_graph(self.g, self.turns, demoted or set())
        return RolloutResult(
            rollout_id="r1",
            ok=True,
            reward=1.0,
            instance_id="t1",
            harness="pi",
            sandbox="local",
            turns=self.turns,
            sequences=[SequenceRef(turns=s.turns, role=s.role, discarded=s.discarded) for s in segments],
        )


def row_of(b: Build, turns: list[int]) -> tuple[list[int], list[int], list[float]]:
    """The expected row, by hand: the last call's tokens; mask 1 and logprobs on each call's own completion."""
    ids = b.seq(turns[-1])
    mask, lps = [0] * len(ids), [0.0] * len(ids)
    for i in turns:
        t = b.turns[i]
        a = len(t.prompt_token_ids)
        for k, lpv in enumerate(t.logprobs):
            mask[a + k], lps[a + k] = 1, lpv
    return ids, mask, lps


def check_rows(b: Build, result: RolloutResult, expected: list[tuple[list[int], str]]) -> None:
    """Trainer rows == hand-computed rows == the export's kept sequences."""
    rows = training_rows(result)
    assert [(r.turn_indices, r.role) for r in rows] == expected
    for r, (turns, _) in zip(rows, expected, strict=True):
        assert (r.input_ids, r.loss_mask, r.logprobs) == row_of(b, turns)
    exported = [s for s in b.g.sequences() if not s["discarded"]]
    assert [(s["turns"], s["token_ids"], s["loss_mask"], s["logprobs"]) for s in exported] == [
        (r.turn_indices, r.input_ids, r.loss_mask, r.logprobs) for r in rows
    ]


def relations(b: Build) -> list[tuple[int | None, str, int | None, bool, str]]:
    return [(t.parent, t.relation, t.retry_of, t.discarded, t.role) for t in b.turns]


def test_linear_conversation_is_one_sequence():
    b = Build()
    b.call([*SYS, *USER], [1, 2, 3])
    b.call([*b.seq(0), 50, 51, 52], [4, 5])  # tool result 50-52, then the next completion
    b.call([*b.seq(1), 60], [6])
    r = b.result()
    assert relations(b) == [
        (None, "root", None, False, "agent"),
        (0, "extends", None, False, "agent"),
        (1, "extends", None, False, "agent"),
    ]
    check_rows(b, r, [([0, 1, 2], "agent")])


def test_retry_is_discarded_and_the_kept_branch_is_one_sequence():
    # the case: call 2 retries call 1; the agent goes on from call 2
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    p1 = [*b.seq(0), 50, 51]
    b.call(p1, [3, 4])
    b.call(p1, [7, 8])  # the same prompt again: a retry
    b.call([*b.seq(2), 60], [9])
    r = b.result()
    assert relations(b) == [
        (None, "root", None, False, "agent"),
        (0, "extends", None, True, "agent"),
        (0, "extends", 1, False, "agent"),
        (2, "extends", None, False, "agent"),
    ]
    assert [(s.turns, s.discarded) for s in r.sequences] == [([0, 2, 3], False), ([1], True)]
    check_rows(b, r, [([0, 2, 3], "agent")])


def test_retry_as_the_last_call_the_trl_adapter_takes_the_kept_branch():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    p1 = [*b.seq(0), 50, 51]
    b.call(p1, [3, 4, 5, 6, 7])  # longer than the retry that replaced it: "longest row" would pick it
    b.call(p1, [8])
    r = b.result()
    assert [t.discarded for t in b.turns] == [False, True, False]
    check_rows(b, r, [([0, 2], "agent")])
    out = trl_output([r])
    assert out["completion_ids"][0][-1] == 8 and 3 not in out["completion_ids"][0]
    assert out["env_dropped_sequences"] == [0]


def test_a_branch_that_grew_after_its_retry_is_kept():
    # two live conversations that happen to open identically (e.g. parallel subagents): both kept
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*SYS, *USER], [3, 4])  # same prompt
    b.call([*b.seq(0), 50], [5])  # ... but call 0's branch goes on after it
    b.call([*b.seq(1), 60], [6])
    r = b.result()
    assert not any(t.discarded for t in b.turns)
    check_rows(b, r, [([0, 2], "agent"), ([1, 3], "agent")])


def test_resample_of_a_root():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*SYS, *USER], [3, 4])  # the first call resampled
    b.call([*b.seq(1), 50], [5])
    r = b.result()
    assert relations(b) == [
        (None, "root", None, True, "agent"),
        (None, "root", 0, False, "agent"),
        (1, "extends", None, False, "agent"),
    ]
    check_rows(b, r, [([1, 2], "agent")])


def test_subagent_root_is_aux():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*b.seq(0), 50], [3])
    b.call([*OTHER_SYS, 7, 7], [8])  # its own conversation: shares nothing with the agent's
    b.call([*b.seq(1), 60], [4])
    r = b.result()
    assert [t.role for t in b.turns] == ["agent", "agent", "aux", "agent"]
    check_rows(b, r, [([0, 1, 3], "agent"), ([2], "aux")])
    assert [x.turn_indices for x in training_rows(r, roles=("agent",))] == [[0, 1, 3]]
    assert main_row(training_rows(r)).turn_indices == [0, 1, 3]  # type: ignore[union-attr]


def test_drift_starts_a_new_sequence():
    b = Build()
    b.call([*SYS, *USER], [1, 2, 3])
    b.call([*SYS, *USER, 1, 99, 3, 50], [4])  # the history re-tokenised: 2 became 99
    b.call([*b.seq(1), 60], [5])
    r = b.result()
    assert [(t.parent, t.relation) for t in b.turns] == [(None, "root"), (0, "drift"), (1, "extends")]
    check_rows(b, r, [([0], "agent"), ([1, 2], "agent")])


def test_compaction_rewrites_history_and_both_parts_stay_the_agents():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*b.seq(0), 50], [3])
    b.call([*b.seq(1), 51], [4])
    summary = list(range(3000, 3020))
    b.call([*SYS, *summary], [5])  # after compaction: system prompt + summary, the old turns gone
    b.call([*b.seq(3), 52], [6])
    r = b.result()
    assert [t.parent for t in b.turns] == [None, 0, 1, None, 3]
    assert not any(t.discarded for t in b.turns) and {t.role for t in b.turns} == {"agent"}
    check_rows(b, r, [([0, 1, 2], "agent"), ([3, 4], "agent")])


def test_two_interleaved_conversations():
    b = Build()
    b.call([*SYS, *USER], [1])  # A
    b.call([*OTHER_SYS, 9], [2])  # B
    b.call([*b.seq(0), 50], [3])  # A
    b.call([*b.seq(1), 60], [4])  # B
    b.call([*b.seq(2), 51], [5])  # A
    r = b.result()
    assert [t.parent for t in b.turns] == [None, None, 0, 1, 2]
    assert [t.role for t in b.turns] == ["agent", "aux", "agent", "aux", "agent"]
    check_rows(b, r, [([0, 2, 4], "agent"), ([1, 3], "aux")])


def test_demoted_calls_and_their_descendants_are_discarded():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*b.seq(0), 50], [3])
    b.call([*b.seq(1), 51], [4])
    r = b.result(demoted={1})  # the agent's own record shows it never used call 1
    assert [t.discarded for t in b.turns] == [False, True, True]
    check_rows(b, r, [([0], "agent")])


def test_rows_refuse_sequences_that_do_not_match_the_turns():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    b.call([*b.seq(0), 50], [3])
    r = b.result()
    bad = r.model_copy(update={"sequences": [SequenceRef(turns=[1, 0])]})
    with pytest.raises(SequenceError):
        training_rows(bad)
    out = trl_output([bad])  # the TRL adapter: an unscorable sample, never a wrong one
    assert out["env_reward"] == [None] and out["env_mask"] == [[0]] and "bad training sequences" in out["env_error"][0]


def test_a_result_with_turns_but_no_sequences_is_an_error():
    b = Build()
    b.call([*SYS, *USER], [1, 2])
    r = b.result().model_copy(update={"sequences": []})
    with pytest.raises(SequenceError, match="no sequences"):
        training_rows(r)


# -- property: random agents ------------------------------------------------------------------------------------
@st.composite
def agent_runs(draw):
    """Call sequences built the ways agents make them: fresh roots, extensions, retries and forks."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 25))
    calls: list[tuple[list[int], list[int]]] = []
    fresh = iter(range(10_000, 10**9, 1000))
    for _ in range(n):
        kind = rnd.choice(["root", "extend", "extend", "extend", "retry", "fork"]) if calls else "root"
        comp = [rnd.randrange(1, 500) for _ in range(rnd.randint(1, 6))]
        if kind == "root":
            start = next(fresh)
            prompt = list(range(start, start + rnd.randint(BLOCK, 3 * BLOCK)))
        else:
            p, c = calls[rnd.randrange(len(calls))]
            if kind == "extend":
                prompt = [*p, *c, *(rnd.randrange(500, 900) for _ in range(rnd.randint(0, 20)))]
            elif kind == "retry":
                prompt = list(p)
            else:  # fork: keep part of that prompt, then something new
                cut = rnd.randint(BLOCK, len(p))
                prompt = [*p[:cut], *(rnd.randrange(900, 999) for _ in range(rnd.randint(1, 20)))]
        calls.append((prompt, comp))
    demote = {i for i in range(n) if rnd.random() < 0.1}
    return calls, demote


@settings(max_examples=150, deadline=None)
@given(agent_runs())
def test_property_sequences_are_exact_paths_and_never_hold_discarded_calls(run):
    calls, demoted = run
    b = Build()
    for prompt, comp in calls:
        b.call(prompt, comp)
    r = b.result(demoted)
    seen: list[int] = []
    for seq in r.sequences:
        members = [b.turns[i] for i in seq.turns]
        assert all(m.discarded == seq.discarded for m in members)
        assert all(m.parent == prev for m, prev in zip(members[1:], seq.turns, strict=False))  # a path
        assert all(m.relation == "extends" for m in members[1:])
        full = b.seq(seq.turns[-1])
        check_prefixes([m.prompt_token_ids for m in members], full)
        for m in members:  # each call's own ids at its own place
            a = len(m.prompt_token_ids)
            assert full[a : a + len(m.completion_token_ids)] == m.completion_token_ids
        seen += seq.turns
    assert sorted(seen) == list(range(len(calls)))  # every call in exactly one sequence
    rows = training_rows(r)
    kept = [s for s in r.sequences if not s.discarded]
    assert [row.turn_indices for row in rows] == [s.turns for s in kept]
    assert not {i for row in rows for i in row.turn_indices} & {t.index for t in b.turns if t.discarded}
    for row in rows:
        assert sum(row.loss_mask) == sum(len(b.turns[i].completion_token_ids) for i in row.turn_indices)
    assert demoted <= {t.index for t in b.turns if t.discarded}


def test_task_seen_only_in_an_agent_calls_request():
    from swe_gym_env.server.capture import CaptureSession, EngineTarget
    from swe_gym_env.server.rollout.agent_run import saw_task

    problem = "The  last chunk\nis dropped\twhen the size does not divide the length."
    s = CaptureSession(id="s", engine=EngineTarget("http://e/v1", "m"), max_calls=5, max_tokens=5, call_timeout_s=5)
    b = Build()
    b.call([*SYS, *USER], [1])

    def asks(index: int, content, role: str = "agent") -> Turn:  # a turn whose request holds one user message
        messages = [{"role": "user", "content": content}]
        return b.turns[0].model_copy(
            update={"index": index, "role": role, "messages_base": None, "messages_kept": 0, "new_messages": messages}
        )

    aux = asks(0, f"Title: {problem}", role="aux")
    s.turns = [aux]
    assert not saw_task(s, problem)  # only an aux call (a title generator) carried it
    parts = [{"type": "text", "text": "Fix this:"}, {"type": "text", "text": "The last chunk is dropped when the size"}]
    s.turns = [aux, asks(1, parts)]
    assert not saw_task(s, problem)  # a part of it is not the task
    parts[1]["text"] = " The last chunk is\n dropped when the size does not divide the length. Thanks"
    s.turns = [aux, asks(1, parts)]
    assert saw_task(s, problem)  # whitespace normalised
