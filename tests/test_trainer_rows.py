from swe_gym_env.client.trainer import group_advantages, training_rows
from swe_gym_env.wire import RolloutResult, Turn


def turn(i, prompt, completion):
    return Turn(
        index=i,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.1 * (k + 1) for k in range(len(completion))],
        finish_reason="stop",
        streamed=True,
        wall_s=0.1,
        request={},
        response_message={},
    )


def result(turns, ok=True, reward=1.0, rid="r1", iid="t1"):
    return RolloutResult(
        rollout_id=rid, ok=ok, reward=reward, harness="pi", sandbox="local", turns=turns, instance_id=iid
    )


# Rows from the rollout graph's sequences, case by case: tests/test_graph.py.


def test_unscorable_rollouts_yield_no_rows_and_no_advantage():
    t0 = turn(0, [1], [2])
    assert training_rows(result([t0], ok=False, reward=None)) == []
    assert training_rows(result([t0], ok=True, reward=None)) == []
    adv = group_advantages(
        [
            result([t0], reward=1.0, rid="a"),
            result([t0], reward=0.0, rid="b"),
            result([t0], ok=False, reward=None, rid="c"),
            result([t0], reward=1.0, rid="d", iid="t2"),
        ]
    )
    assert adv == {"a": 0.5, "b": -0.5, "d": 0.0}


def test_cross_check_verdicts():
    from swe_gym_env.server.agents.base import AgentOutcome, cross_check

    turns = [turn(0, [1], [2, 3]), turn(1, [1, 2, 3, 4], [5])]
    assert cross_check(AgentOutcome(model_calls=2, completion_tokens=[2, 1]), turns, 0)[0] == "match"
    assert cross_check(AgentOutcome(model_calls=3, completion_tokens=[2, 1, 5]), turns, 1)[0] == "match"
    verdict, detail = cross_check(AgentOutcome(model_calls=3, completion_tokens=[2, 1, 4]), turns, 0)
    assert verdict == "mismatch" and "3 model calls" in detail
    verdict, detail = cross_check(AgentOutcome(model_calls=2, completion_tokens=[2, 7]), turns, 0)
    assert verdict == "mismatch" and "call 1" in detail
    assert cross_check(AgentOutcome(), [], 0)[0] == "none"
