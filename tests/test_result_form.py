"""The compact result form (schema 2): turns as the proxy records them, read back exactly.

Calls go through the capture proxy's own recording (`CaptureProxy._record`: the graph, the arena, the request
digests, the store) and the result is assembled as the pipeline assembles it (`RunState.trace`). Every result is
checked by the golden check (`helpers.check_result_form`: compact → expand → compact identical, rows equal the
old full-turn rows, a schema-1 dump reads back the same) and against the prompts and requests actually sent.
"""

from __future__ import annotations

import json
import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swe_gym_env.client.trainer import training_rows
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.capture.dialect import CapturedCall
from swe_gym_env.server.capture.graph import BLOCK, RolloutGraph
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.rollout.record import RunState
from swe_gym_env.trace.compact import SequenceError
from swe_gym_env.trace.forms import TurnsView, compact, expand, prompt_ids, request_of
from swe_gym_env.wire import SCHEMA_VERSION, RolloutResult, Turn

from helpers import check_result_form, reference_rows

CHAT = DIALECTS["openai-chat"]
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def lp(ids: list[int]) -> list[float]:
    return [-0.01 * (1 + t % 7) for t in ids]


class Recorder:
    """A capture session fed call by call through the proxy's recording path."""

    def __init__(self, store: CaptureStore | None = None) -> None:
        self.proxy = CaptureProxy(store)
        self.session, _ = self.proxy.open_session(
            EngineTarget("http://engine/v1", "m"), max_calls=10_000, max_tokens=64, session_id="s1"
        )
        self.sent: list[tuple[list[int], dict]] = []

    def call(self, prompt: list[int], completion: list[int], messages: list[dict], params: dict | None = None) -> int:
        up = {"model": "m", "tools": TOOLS, **(params or {}), "messages": messages}
        captured = CapturedCall(
            prompt_token_ids=array("q", prompt),
            completion_token_ids=array("q", completion),
            logprobs=array("d", lp(completion)),
            message={"role": "assistant", "content": f"c{len(self.sent)}", "tool_calls": []},
            finish_reason="stop",
            usage=None,
        )
        self.proxy._record(self.session, CHAT, up, captured, streamed=False, wall=0.01)
        self.sent.append((list(prompt), up))
        return len(self.sent) - 1

    def result(self, demoted: set[int] | None = None, form: str = "compact") -> RolloutResult:
        self.session.demoted.update(demoted or ())
        self.proxy.close_session(self.session)
        state = RunState(session=self.session, result_form=form)  # pyright: ignore[reportArgumentType]
        return RolloutResult(rollout_id="r1", ok=True, reward=1.0, harness="pi", sandbox="local", **state.trace())


def check_exact(rec: Recorder, result: RolloutResult) -> None:
    """Every turn's whole prompt and request read back from the compact form are what was sent."""
    check_result_form(result)
    view = TurnsView(result.turns)
    for t, (prompt, up) in zip(result.turns, rec.sent, strict=True):
        assert view.prompt(t.index) == prompt
        assert view.request(t.index) == up
        assert t.prompt_len == len(prompt)
        if t.sequence is not None:
            seq = result.sequences[t.sequence]
            assert t.index in seq.turns
            ids, _, _ = view.sequence_tokens(seq.turns, seq.length)
            assert ids[: t.prompt_len] == prompt
            assert ids[t.prompt_len : t.prompt_len + len(t.completion_token_ids)] == t.completion_token_ids


# -- hand-made cases --------------------------------------------------------------------------------------------
SYS = {"role": "system", "content": "you are an agent"}
USER = {"role": "user", "content": "fix the bug"}


def linear(rec: Recorder, n: int, tool_tokens: int = 40) -> None:
    prompt, messages = list(range(1000, 1000 + 3 * BLOCK)), [SYS, USER]
    for k in range(n):
        comp = [k + 1, k + 2, k + 3]
        rec.call(prompt, comp, messages)
        reply = {"role": "assistant", "content": f"c{k}"}
        tool = {"role": "tool", "content": f"output {k}"}
        prompt = [*prompt, *comp, *range(5000 + 100 * k, 5000 + 100 * k + tool_tokens)]
        messages = [*messages, reply, tool]


def test_a_linear_chain_stores_each_token_and_message_once():
    rec = Recorder()
    linear(rec, 6)
    r = rec.result()
    check_exact(rec, r)
    assert [t.prompt_base for t in r.turns] == [None, 0, 1, 2, 3, 4]
    assert [t.prompt_shared for t in r.turns[1:]] == [rec.sent[k][0].__len__() + 3 for k in range(5)]
    new = sum(len(t.prompt_new_ids) for t in r.turns) + sum(len(t.completion_token_ids) for t in r.turns[:-1])
    assert new == len(rec.sent[-1][0])  # the context once
    assert [len(t.new_messages) for t in r.turns] == [2, 2, 2, 2, 2, 2] and all(t.params is None for t in r.turns[1:])
    assert r.schema_version == SCHEMA_VERSION == 2 and all(t.prompt_token_ids is None for t in r.turns)
    assert [s.length for s in r.sequences] == [len(rec.sent[-1][0]) + 3] and {t.sequence for t in r.turns} == {0}
    assert prompt_ids(r, 4) == rec.sent[4][0] and request_of(r, 4) == rec.sent[4][1]


def test_the_full_form_is_the_compact_form_plus_every_whole_prompt_and_request():
    rec = Recorder()
    linear(rec, 3)
    full = rec.result(form="full")
    assert [(t.prompt_token_ids, t.request) for t in full.turns] == [(p, up) for p, up in rec.sent]
    assert compact(full) == rec.result()  # the same session, read compact
    check_result_form(full)


def test_retries_drift_roots_aux_and_discards_are_exact():
    rec = Recorder()
    p0 = list(range(1000, 1000 + 2 * BLOCK))
    m0 = [SYS, USER]
    rec.call(p0, [1, 2], m0)
    p1 = [*p0, 1, 2, 70, 71]
    m1 = [*m0, {"role": "assistant", "content": "c0"}, {"role": "tool", "content": "x"}]
    rec.call(p1, [3], m1)
    rec.call(p1, [4], m1, {"temperature": 0.5})  # a retry of call 1, other sampling
    rec.call([*p0, 1, 9, 70, 71], [5], m1)  # drift: call 0's completion re-tokenised
    rec.call(list(range(8000, 8000 + 2 * BLOCK)), [6], [{"role": "user", "content": "title?"}])  # an aux root
    rec.call([*p1, 4, 80], [7], [*m1, {"role": "assistant", "content": "c2"}])  # extends the retry
    r = rec.result(demoted={3})
    assert [t.relation for t in r.turns] == ["root", "extends", "extends", "drift", "root", "extends"]
    assert r.turns[2].retry_of == 1 and r.turns[1].discarded and r.turns[3].discarded
    assert r.turns[2].params == {"model": "m", "tools": TOOLS, "temperature": 0.5}  # differs from its base's
    check_exact(rec, r)
    assert {row.role for row in training_rows(r)} == {"agent", "aux"}


def test_the_store_rebuilds_the_same_compact_turns(tmp_path):
    store = CaptureStore(tmp_path / "c.sqlite")
    rec = Recorder(store)
    linear(rec, 4)
    rec.call(rec.sent[2][0], [9, 9], rec.sent[2][1]["messages"])  # a retry of call 2
    r = rec.result()
    check_exact(rec, r)
    live = rec.proxy.export("s1")
    again = CaptureProxy(CaptureStore(tmp_path / "c.sqlite")).export("s1")
    assert again == live and live is not None
    assert all("prompt_token_ids" not in t and "request" not in t for t in live["turns"])
    assert [Turn.model_validate(t) for t in live["turns"]] == r.turns


# -- bad input: an error, never a plausible wrong row -----------------------------------------------------------
def small_result() -> RolloutResult:
    rec = Recorder()
    linear(rec, 3)
    return rec.result()


@pytest.mark.parametrize(
    ("turn", "update", "match"),
    [
        (1, {"prompt_base": 2}, "not an earlier turn"),
        (1, {"prompt_base": 7}, "not an earlier turn"),
        (2, {"prompt_shared": 10_000, "prompt_len": 10_000 + 40}, "shares 10000 tokens"),
        (2, {"prompt_len": 3}, "prompt_len"),
        (1, {"messages_kept": 9}, "keeps 9 messages"),
        (0, {"params": None}, "params from no turn"),
        (2, {"prompt_new_ids": [1, 2, 3]}, "prompt_len"),
    ],
)
def test_inconsistent_compact_turns_raise(turn, update, match):
    r = small_result()
    turns = list(r.turns)
    turns[turn] = turns[turn].model_copy(update=update)
    bad = r.model_copy(update={"turns": turns})
    with pytest.raises(SequenceError, match=match):
        expand(bad)


def test_a_sequence_of_the_wrong_length_or_ids_raises():
    r = small_result()
    seq = r.sequences[0]
    with pytest.raises(SequenceError, match="said to hold"):
        training_rows(r.model_copy(update={"sequences": [seq.model_copy(update={"length": seq.length + 1})]}))
    turns = list(r.turns)
    t = turns[2]  # its prompt now holds other ids where call 1's completion was
    turns[2] = t.model_copy(update={"prompt_shared": t.prompt_shared - 2, "prompt_new_ids": [7, 7, *t.prompt_new_ids]})
    with pytest.raises(SequenceError, match="does not hold the completion"):
        training_rows(r.model_copy(update={"turns": turns}))


def test_full_fields_that_disagree_with_the_compact_ones_raise():
    full = expand(small_result())
    turns = list(full.turns)
    turns[1] = turns[1].model_copy(update={"prompt_token_ids": [*turns[1].prompt_token_ids[:-1], 0]})
    with pytest.raises(SequenceError, match="prompt_token_ids differ"):
        compact(full.model_copy(update={"turns": turns}))


def test_a_schema_1_result_on_disk_is_upgraded_exactly():
    """The shape results had before schema 2: every turn with its whole prompt and request, no compact fields."""
    rec = Recorder()
    linear(rec, 4)
    r = rec.result()
    old = expand(r).model_dump(mode="json", exclude={"schema_version"})
    for t in old["turns"]:
        for k in ("prompt_len", "prompt_base", "prompt_shared", "prompt_new_ids", "sequence"):
            del t[k]
        for k in ("messages_base", "messages_kept", "new_messages", "params"):
            del t[k]
    for s in old["sequences"]:
        del s["length"]
    up = RolloutResult.model_validate(old)
    assert up == r  # the same compact result the proxy made: bases, messages, lengths, sequence indices
    assert RolloutResult.model_validate_json(r.model_dump_json()) == r


# -- property: random agents ------------------------------------------------------------------------------------
@st.composite
def agent_runs(draw):
    """Calls as agents make them (fresh roots, extensions, retries, forks, drift, aux calls, other sampling), each
    with the request whose messages would have rendered to it."""
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 25))
    calls: list[tuple[list[int], list[int], list[dict], dict]] = []
    fresh = iter(range(10_000, 10**9, 1000))
    for k in range(n):
        kind = rnd.choice(["root", "extend", "extend", "extend", "retry", "fork", "drift"]) if calls else "root"
        comp = [rnd.randrange(1, 500) for _ in range(rnd.randint(1, 6))]
        params = {"temperature": 0.5} if rnd.random() < 0.15 else {}
        if kind == "root":
            start = next(fresh)
            prompt = list(range(start, start + rnd.randint(BLOCK, 3 * BLOCK)))
            messages = [{"role": "system", "content": f"s{start}"}, {"role": "user", "content": f"u{k}"}]
        else:
            p, c, m, _ = calls[rnd.randrange(len(calls))]
            if kind == "extend":
                prompt = [*p, *c, *(rnd.randrange(500, 900) for _ in range(rnd.randint(0, 20)))]
                messages = [*m, {"role": "assistant", "content": f"a{k}"}, {"role": "tool", "content": f"t{k}"}]
            elif kind == "retry":
                prompt, messages = list(p), list(m)
            elif kind == "drift":
                prompt = [*p, *(x + 1 for x in c), 77]
                messages = [*m, {"role": "assistant", "content": f"d{k}"}]
            else:  # fork: keep part of that prompt, then something new
                cut = rnd.randint(BLOCK, len(p))
                prompt = [*p[:cut], *(rnd.randrange(900, 999) for _ in range(rnd.randint(1, 20)))]
                messages = [*m[: rnd.randint(1, len(m))], {"role": "user", "content": f"f{k}"}]
        calls.append((prompt, comp, messages, params))
    demote = {i for i in range(n) if rnd.random() < 0.1}
    return calls, demote


@settings(max_examples=120, deadline=None)
@given(agent_runs())
def test_property_compact_results_read_back_exactly(run):
    calls, demoted = run
    rec = Recorder()
    for prompt, comp, messages, params in calls:
        rec.call(prompt, comp, messages, params)
    r = rec.result(demoted)
    check_exact(rec, r)
    rows = training_rows(r)
    assert [(x.turn_indices, x.role, x.input_ids, x.loss_mask, x.logprobs) for x in rows] == reference_rows(expand(r))


# -- memory: the graph's nodes share storage ----------------------------------------------------------------------
def test_a_linear_chain_costs_about_its_final_context_in_the_graph():
    g = RolloutGraph()
    prompt = list(range(100, 100 + 4 * BLOCK))
    for k in range(60):
        comp = [k + 1] * 8
        g.add(prompt, comp, lp(comp))
        prompt = [*prompt, *comp, *range(3000, 3000 + 200)]
    final = g.nodes[-1].seq_len
    ids_bytes = g.stored_bytes() - sum(n.logprobs.nbytes for n in g.nodes)
    assert ids_bytes <= 2 * 4 * final + 4 * 1024  # one growing int32 arena, not 60 prompts
    assert len({id(n.arena) for n in g.nodes}) == 1
    assert g.nodes[30].prompt.tolist() == [*g.nodes[29].seq().tolist(), *range(3000, 3200)]
    g.add(g.nodes[10].prompt, [1], [-0.5])  # a retry forks: a copy of its own, the chain untouched
    assert g.nodes[-1].arena is not g.nodes[10].arena and g.nodes[-1].retry_of == 10
    assert g.nodes[59].seq().tolist()[: g.nodes[10].seq_len] == g.nodes[10].seq().tolist()
    g.seal()  # the session closed: no growth room, no prefix index; reading is the same
    assert g.nodes[0].arena.nbytes == 4 * final and not g._index
    assert g.nodes[30].prompt.tolist() == [*g.nodes[29].seq().tolist(), *range(3000, 3200)]
    with pytest.raises(ValueError, match="sealed"):
        g.add([1] * BLOCK, [1], [-0.1])


def test_the_result_bench_runs_and_the_compact_form_is_far_smaller(capsys):
    """`swe-gym-env bench result --quick`: 12 calls of the 80-call shape (the full run: README, `bench result`)."""
    from swe_gym_env.benchmarks import result as bench

    assert bench.run(as_json=True, quick=True) == 0
    doc = json.loads(capsys.readouterr().out)
    small, full = doc["compact"], doc["full"]
    assert doc["row_tokens"] == doc["last_prompt_tokens"] + bench.COMPLETION
    assert small["prompt_ids_in_result"] < doc["row_tokens"] < full["prompt_ids_in_result"] / 5
    assert full["result_bytes"] > 5 * small["result_bytes"] and small["session_heap_mb"] < full["old_proxy_heap_mb"]
