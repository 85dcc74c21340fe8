"""Long sessions with real agents: Pi and OpenCode fill the engine's context, compact, and still finish the task.

The built-in engine with a small `--max-model-len` and the `oracle+compact` policy (server/engine/policy.py): it
fills the context with long listings until the agent compacts, answers the agent's own summary request, and only
then applies the fix. The rollout graph shows the compaction (a new root in the agent's family), the trainer's rows
are exactly its kept sequences, the cross-check matches and the fix is graded.
"""

from __future__ import annotations

import json
import time

import pytest

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.client.trainer import training_rows
from swe_gym_env.server.engine.policy import FILLER, FILLER_MARK, SUMMARY_MARK, make_policy
from swe_gym_env.server.rollout.pipeline import PROMPT
from swe_gym_env.tasks.catalog import get_task

from helpers import PI_TOOLS, Stack, rows_match_export

# Pi 0.73.1's own texts (pi-coding-agent/dist/core/compaction/): what it sends to compact, and how its summary
# comes back into the agent's prompt
PI_SUMMARY_SYSTEM = "You are a context summarization assistant. Your task is to read a conversation between a user"
PI_TURN_PREFIX = "This is the PREFIX of a turn that was too large to keep. The SUFFIX (recent work) is retained."
PI_SUMMARY_PREFIX = (
    "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
)


def test_the_oracle_fills_the_context_until_the_agent_compacts_then_fixes_from_its_summary():
    task = get_task()
    policy = make_policy("oracle+compact")
    prompt = PROMPT.format(workdir="/work/tree", problem=task.problem_statement)
    start = [{"role": "system", "content": "You are an expert coding assistant"}, {"role": "user", "content": prompt}]
    filler = policy.reply(start, PI_TOOLS)
    assert filler.tool_calls == [("bash", {"command": FILLER})]
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": FILLER})}}
        ],
    }
    output = {"role": "tool", "tool_call_id": "c1", "content": "line 1 of the long listing"}
    assert policy.reply([*start, call, output], PI_TOOLS).tool_calls == filler.tool_calls  # not compacted yet
    # the agent's summary request: answered with a summary that keeps the task and its work tree
    ask = [
        {"role": "system", "content": PI_SUMMARY_SYSTEM},
        {"role": "user", "content": f"<conversation>\n[User]: {prompt}\n</conversation>\n\n{PI_TURN_PREFIX}"},
    ]
    summary = policy.reply(ask, None).content or ""
    assert SUMMARY_MARK in summary and task.problem_statement.strip() in summary and "/work/tree." in summary
    # after compaction: the summary and the kept filler call; the fix, in the tree the summary names, then done
    after = [start[0], {"role": "user", "content": PI_SUMMARY_PREFIX + summary + "\n</summary>"}, call, output]
    (edit,) = policy.reply(after, PI_TOOLS).tool_calls
    assert edit[0] == "edit" and edit[1]["path"] == "batchtools/chunks.py"
    done = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "edit", "arguments": json.dumps(edit[1])}}
        ],
    }
    assert policy.reply([*after, done, {"role": "tool", "tool_call_id": "c2", "content": "ok"}], PI_TOOLS).content


@pytest.fixture(scope="module")
def stacks():
    """Built-in engine (policy `oracle+compact`) + server per engine context, shared by the module's rollouts."""
    made: dict[int, Stack] = {}

    def at(context: int) -> Stack:
        if context not in made:
            made[context] = Stack("oracle+compact", env={"SWE_GYM_ENGINE_MAX_MODEL_LEN": str(context)})
        return made[context]

    yield at
    for stack in made.values():
        stack.stop()


async def rollout_at(stack: Stack, harness: str, **options):
    """One rollout, its rows checked against the capture's export."""
    t0 = time.monotonic()
    async with SweGymClient(stack.mcp_url) as c:
        result = await c.run_rollout(harness=harness, max_model_calls=40, deadline_s=400, **options)
    wall = time.monotonic() - t0
    await rows_match_export(stack, result)
    context = stack.env["SWE_GYM_ENGINE_MAX_MODEL_LEN"]
    fillers = sum(1 for t in result.turns if FILLER_MARK in str(t.response_message.get("tool_calls")))
    print(
        f"{harness} {options}: context {context}, {len(result.turns)} calls ({fillers} filling the context), "
        f"wall {wall:.1f}s"
    )
    return result


def agent_roots(result) -> list[int]:
    return [t.index for t in result.turns if t.parent is None and t.role == "agent"]


def assert_compacted_and_resolved(result, context: int, refused: bool) -> None:
    """``refused``: the engine refused the prompt that outgrew its context (vLLM refuses only a prompt longer than
    the context: a prompt that fits gets its output cut to the room left), and the agent compacted on that refusal
    (Pi); else the agent compacted from the engine's usage before its next prompt could outgrow it (OpenCode)."""
    assert result.ok, result.error
    # the graph: the agent's conversation restarts from its summary (a new root in the agent's family); the summary
    # call itself is a conversation of its own (another system prompt: aux)
    assert len(agent_roots(result)) == 2, [(t.index, t.parent, t.relation, t.role) for t in result.turns]
    summary = [t for t in result.turns if SUMMARY_MARK in str(t.response_message.get("content"))]
    assert len(summary) == 1 and summary[0].parent is None and summary[0].role == "aux"
    assert agent_roots(result)[1] > summary[0].index and not any(t.discarded for t in result.turns)
    # the trainer's rows are exactly the kept sequences, each with its own sampled tokens under the loss
    rows = training_rows(result)
    assert [r.turn_indices for r in rows] == [s.turns for s in result.sequences if not s.discarded]
    by_index = {t.index: t for t in result.turns}
    for row in rows:
        assert sum(row.loss_mask) == sum(len(by_index[i].completion_token_ids) for i in row.turn_indices)
    assert result.cross_check == "match", result.cross_check_detail
    assert any(f.code == "context_limit" for f in result.findings) == refused  # the engine's refusal, if any
    before = [t for t in result.turns if t.role == "agent" and t.index < summary[0].index]
    last, growth = before[-1], before[-1].prompt_len - before[-2].prompt_len
    assert last.prompt_len + len(last.completion_token_ids) + growth > context, "compacted before the limit"
    assert result.reward == 1.0 and result.grading.resolution == "RESOLVED_FULL"


@pytest.mark.usefixtures("need_pi")
@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
async def test_pi_with_compaction_on_compacts_at_the_engines_context_limit_and_resolves(stacks):
    result = await rollout_at(stacks(6144), "pi", harness_options={"compaction": "on"})
    assert_compacted_and_resolved(result, 6144, refused=True)


@pytest.mark.usefixtures("need_pi")
@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
async def test_pi_with_compaction_off_fails_at_the_engines_context_limit(stacks):
    result = await rollout_at(stacks(6144), "pi")  # off: the default
    assert not result.ok and result.phase == "agent" and "maximum context length is 6144" in (result.error or "")
    assert agent_roots(result) == [0] and result.reward is None


@pytest.mark.usefixtures("need_opencode")
@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
async def test_opencode_compacts_at_the_engines_context_limit_and_resolves(stacks):
    assert_compacted_and_resolved(await rollout_at(stacks(12288), "opencode"), 12288, refused=False)
