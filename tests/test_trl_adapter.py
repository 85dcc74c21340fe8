"""client/trl_adapter.py: TRL's `rollout_func` contract, on real rollouts, through the installed trl.

- In process (the app's venv): `trl_output` shapes on hand-made results: multi-turn masks, the main row,
  unscorable rollouts as reward None with an all-zero env_mask (never 0).
- Integration (`.trl-venv`, from `bash scripts/setup_trl.sh`, plus SmolLM2's weights from
  `bash scripts/setup_vllm.sh`): a real server + built-in oracle engine (tests/helpers.Stack), then a script run by
  `.trl-venv/bin/python`, where only the light client is installed (no server extra):
  (a) the rollout_func on 2 prompts (a real task, an unknown one), checked against TRL's contract and against the
      captured turns (ids and logprobs exactly as captured);
  (b) one real `GRPOTrainer` step on CPU (`use_vllm=False`, SmolLM2-135M from the local folder, cut to its first 2
      decoder layers: the oracle's logprobs are placeholders, the trainer's model only shares the vocabulary) with
      that rollout_func and `env_reward_func`: the tensors TRL builds from our output are checked (ids, sampling
      logprobs, tool mask, advantages, token count), the optimizer step changes the trained weights, and the loss
      is printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import require

from swe_gym_env.cli import free_port
from swe_gym_env.client.trl_adapter import REQUIRED_KEYS, env_reward_func, make_rollout_func, trl_output
from swe_gym_env.core.assets import tokenizer_dir
from swe_gym_env.wire import RolloutResult, SequenceRef, Turn

from helpers import Stack

REPO = Path(__file__).resolve().parent.parent
TRL_PYTHON = REPO / ".trl-venv" / "bin" / "python"


def turn(i, prompt, completion):
    return Turn(
        index=i,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        finish_reason="stop",
        streamed=False,
        wall_s=0.1,
        request={},
        response_message={},
    )


def result(turns, ok=True, reward=1.0, rid="r", error=None, sequences=None):
    """A result as the server builds it: its sequences are the rollout graph's (one chain of all turns by default)."""
    seqs = [SequenceRef(turns=s) for s in (sequences if sequences is not None else [[t.index for t in turns]])]
    return RolloutResult(
        rollout_id=rid,
        ok=ok,
        reward=reward,
        error=error,
        harness="pi",
        sandbox="local",
        turns=turns,
        instance_id="t",
        sequences=seqs if turns else [],
    )


def test_trl_output_shapes_multi_turn_main_row_and_unscorable():
    chained = [turn(0, [1, 2, 3], [10, 11]), turn(1, [1, 2, 3, 10, 11, 20, 21], [30])]
    drifted = [*chained, turn(2, [5], [6])]  # a second, shorter sequence: dropped, counted
    out = trl_output(
        [
            result(drifted, rid="a", sequences=[[0, 1], [2]]),
            result(chained, reward=0.0, rid="b"),
            result([turn(0, [1], [2])], ok=False, reward=None, rid="c", error="agent: boom"),
            result([], ok=True, reward=None, rid="d"),
        ],
        placeholder_token_id=2,
    )
    assert set(REQUIRED_KEYS) <= out.keys() and all(len(v) == 4 for v in out.values())
    assert out["prompt_ids"][0] == [1, 2, 3] and out["completion_ids"][0] == [10, 11, 20, 21, 30]
    assert out["logprobs"][0] == [-0.5, -0.5, 0.0, 0.0, -0.5] and out["env_mask"][0] == [1, 1, 0, 0, 1]
    assert out["env_dropped_sequences"][:2] == [1, 0]
    assert out["env_reward"] == [1.0, 0.0, None, None]  # 0.0 stays 0.0; unscorable is None, never 0
    for i in (2, 3):
        assert out["prompt_ids"][i] == out["completion_ids"][i] == [2] and out["env_mask"][i] == [0]
    assert out["env_error"][0] is None and out["env_error"][2] == "agent: boom" and out["env_error"][3]
    assert env_reward_func(prompts=[""] * 4, completions=[""] * 4, env_reward=out["env_reward"]) == [
        1.0,
        0.0,
        None,
        None,
    ]


def test_adapter_import_stays_light():
    code = "import sys, swe_gym_env.client.trl_adapter; print('\\n'.join(sys.modules))"
    mods = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "swe_gym_env.client.trl_adapter" in mods
    heavy = [m for m in mods if m.split(".")[0] in ("torch", "trl", "transformers") or "swe_gym_env.server" in m]
    assert not heavy, heavy


def test_unreachable_server_gives_unscorable_samples_inside_and_outside_an_event_loop():
    rf = make_rollout_func(f"http://127.0.0.1:{free_port()}", placeholder_token_id=7, client_kwargs={"timeout_s": 5})
    for out in (rf(["swe-gym-env__batchtools-1", "x"], None), asyncio.run(_in_loop(rf))):
        assert out["env_reward"] == [None, None] and out["env_mask"] == [[0], [0]]
        assert out["completion_ids"] == [[7], [7]] and all("ConnectionRefusedError" in e for e in out["env_error"])


async def _in_loop(rf):
    return rf(["swe-gym-env__batchtools-1", "x"], None)


SCRIPT = textwrap.dedent(
    r"""
    import itertools, json, math, os, sys, tempfile, time

    base_url, model_dir = sys.argv[1], sys.argv[2]
    t0 = time.monotonic()
    from swe_gym_env.client.trl_adapter import REQUIRED_KEYS, env_reward_func, make_rollout_func
    from swe_gym_env.trace.forms import expand_turns

    heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "trl", "transformers", "fastapi", "fastmcp")]
    assert not heavy and not any(m.startswith("swe_gym_env.server") for m in sys.modules), heavy
    GOOD, BAD = "swe-gym-env__batchtools-1", "swe-gym-env__no-such-task"
    timings = {}

    def check_contract(out, n):
        assert set(REQUIRED_KEYS) <= out.keys(), out.keys()
        assert all(isinstance(v, list) and len(v) == n for v in out.values()), {k: len(v) for k, v in out.items()}
        for p, c, lp, m in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
            assert p and c and all(type(i) is int for i in p + c)
            assert len(lp) == len(c) == len(m) and all(type(x) is float for x in lp) and set(m) <= {0, 1}

    # (a) the rollout_func alone, on 2 prompts -------------------------------------------------------------------
    results = []
    rf = make_rollout_func(base_url, purpose="eval", on_results=results.extend)  # built-in engine: eval only
    t = time.monotonic()
    out = rf([GOOD, BAD], None)
    timings["a_rollouts_s"] = round(time.monotonic() - t, 1)
    check_contract(out, 2)
    good, bad = results
    assert good.ok and good.reward == 1.0 and len(good.turns) >= 2, good.error
    assert not bad.ok and bad.reward is None
    assert out["env_reward"] == [1.0, None] and out["env_error"][0] is None and out["env_error"][1]
    assert out["env_rollout_id"] == [good.rollout_id, bad.rollout_id]
    full, lps, mask = out["prompt_ids"][0] + out["completion_ids"][0], out["logprobs"][0], out["env_mask"][0]
    assert out["prompt_ids"][0] == expand_turns(good.turns)[0].prompt_token_ids
    plen = len(out["prompt_ids"][0])
    for tr in expand_turns(good.turns):  # the oracle's turns chain exactly: each captured id and logprob in place
        a, b = len(tr.prompt_token_ids), len(tr.prompt_token_ids) + len(tr.completion_token_ids)
        assert full[:a] == tr.prompt_token_ids and full[a:b] == tr.completion_token_ids
        assert lps[a - plen : b - plen] == tr.logprobs and set(mask[a - plen : b - plen]) == {1}
    assert sum(mask) == sum(len(tr.completion_token_ids) for tr in good.turns)
    assert out["env_mask"][1] == [0] and out["prompt_ids"][1] == out["completion_ids"][1]

    # (b) one real GRPOTrainer step with the rollout_func ----------------------------------------------------------
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    # Within a group the oracle always resolves the task; the second generation of each prompt gets a 20-token
    # budget (truncated tool call: graded, reward 0.0), so the group has rewards 1.0 and 0.0 and a real gradient.
    seen_prompts = {}

    def tasks_for_prompt(prompt):
        n = seen_prompts[prompt] = seen_prompts.get(prompt, 0) + 1
        return {"instance_id": prompt, **({"max_tokens": 20} if n % 2 == 0 else {})}

    step_results, spy = [], {}
    rf2 = make_rollout_func(base_url, purpose="eval", tasks_for_prompt=tasks_for_prompt, on_results=step_results.extend)

    def rollout_func(prompts, trainer):
        spy["prompts"], spy["rf"] = list(prompts), rf2(prompts, trainer)
        return spy["rf"]

    args = GRPOConfig(
        # 4 completions (2 prompts x 2 generations), trained one per micro-batch: no padding of the long Pi
        # sequences against each other (2 cores: a 2000-token forward+backward of SmolLM2-135M is ~15 s).
        output_dir=tempfile.mkdtemp(), max_steps=1, per_device_train_batch_size=1, gradient_accumulation_steps=4,
        num_generations=2,
        use_vllm=False, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
        shuffle_dataset=False, learning_rate=1e-5, seed=0, dataloader_num_workers=0, gradient_checkpointing=False,
    )
    t = time.monotonic()
    # The trainer's model only has to share the engine's vocabulary: the built-in engine's logprobs are placeholders,
    # not this model's, and nothing here compares the two. So SmolLM2-135M's own weights, cut to its first 2 of 30
    # decoder layers (+ final norm, tied head), and only the last of them and the norm train: every micro-batch is
    # padded to the longest Pi sequence (~2000 tokens), and the full depth made 4 forward passes the bulk of this
    # test (~15 s each on 2 cores). What TRL does with our output is the same whatever the depth and whichever
    # parameters train; the step is as real (forward, loss, backward, optimizer step that changes the weights).
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, num_hidden_layers=2)
    assert len(model.model.layers) == 2 and model.config.vocab_size == 49152, model.config
    model.requires_grad_(False)
    trained = [*model.model.layers[-1].parameters(), *model.model.norm.parameters()]
    for p in trained:
        p.requires_grad_(True)
    trainer = GRPOTrainer(
        model=model, reward_funcs=env_reward_func, args=args, rollout_func=rollout_func,
        train_dataset=Dataset.from_dict({"prompt": [GOOD, BAD]}),
    )
    timings["b_init_s"] = round(time.monotonic() - t, 1)
    orig = trainer._generate_and_score_completions

    def generate_and_score(inputs):
        spy["inputs"], spy["out"] = inputs, orig(inputs)
        return spy["out"]

    trainer._generate_and_score_completions = generate_and_score
    params_before = [p.detach().clone() for p in trained]
    t = time.monotonic()
    trainer.train()
    timings["b_train_step_s"] = round(time.monotonic() - t, 1)

    rf_out, o, prompts = spy["rf"], spy["out"], spy["prompts"]
    assert sorted(prompts) == [GOOD, GOOD, BAD, BAD], prompts
    check_contract(rf_out, 4)
    rewards = rf_out["env_reward"]
    assert sorted(r for r in rewards if r is not None) == [0.0, 1.0] and rewards.count(None) == 2, rewards
    loss_mask = o["completion_mask"] * o["tool_mask"]
    for i, (c, lp, m, r) in enumerate(zip(rf_out["completion_ids"], rf_out["logprobs"], rf_out["env_mask"], rewards)):
        n = len(c)
        assert o["completion_ids"][i, :n].tolist() == c and int(o["completion_mask"][i].sum()) == n
        p = rf_out["prompt_ids"][i]
        assert o["prompt_ids"][i, o["prompt_ids"].shape[1] - len(p) :].tolist() == p  # left-padded
        assert torch.allclose(o["sampling_per_token_logps"][i, :n], torch.tensor(lp))
        assert loss_mask[i, :n].tolist() == m and int(loss_mask[i, n:].sum()) == 0
        assert spy["inputs"][i]["env_reward"] == r  # forwarded to the reward function's kwargs
        if r is None:
            assert float(o["advantages"][i]) == 0.0 and int(loss_mask[i].sum()) == 0
    assert int(o["num_items_in_batch"]) == sum(map(sum, rf_out["env_mask"]))
    adv = {r: float(a) for r, a in zip(rewards, o["advantages"]) if r is not None}
    assert adv[1.0] > 0 > adv[0.0], adv
    logs = {k: v for h in trainer.state.log_history for k, v in h.items()}
    assert logs["rewards/env_reward_func/mean"] == 0.5, logs  # unscorable rows are out of the mean, not zeros
    assert math.isfinite(logs["loss"]), logs
    changed = any(not torch.equal(a, b) for a, b in zip(params_before, trained))
    import trl
    print("RESULT " + json.dumps({
        "trl": trl.__version__, "torch": torch.__version__, "loss": logs["loss"], "reward_mean": logs["reward"],
        "advantages": [round(float(a), 4) for a in o["advantages"]], "env_reward": rewards,
        "completion_tokens": [len(c) for c in rf_out["completion_ids"]],
        "trained_tokens": int(o["num_items_in_batch"]), "params_changed": changed,
        "timings": {**timings, "total_s": round(time.monotonic() - t0, 1)},
    }))
    """
)


@pytest.mark.integration
@pytest.mark.slow
def test_rollout_func_through_real_trl_grpo_step(need_pi, tmp_path):
    require(TRL_PYTHON.is_file(), f"{TRL_PYTHON} missing: run `bash scripts/setup_trl.sh`")
    model = tokenizer_dir()
    require(
        (model / "config.json").is_file() and (model / "model.safetensors").is_file(),
        f"SmolLM2 weights missing in {model}: run `bash scripts/setup_vllm.sh`",
    )
    script = tmp_path / "trl_step.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRL_EXPERIMENTAL_SILENCE="1",
        TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
    )  # fmt: skip
    stack = Stack("oracle")
    try:
        start = time.monotonic()
        proc = subprocess.run(
            [str(TRL_PYTHON), str(script), f"http://127.0.0.1:{stack.server_port}", str(model)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        wall = time.monotonic() - start
    finally:
        stack.stop()
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    print(f"trl step in {wall:.0f} s: {res}")
    assert res["params_changed"] and res["trained_tokens"] > 0
