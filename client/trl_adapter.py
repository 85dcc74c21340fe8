"""TRL adapter: a `GRPOTrainer(rollout_func=...)` backed by swe_gym_env rollouts.

TRL's contract (trl 1.16.0, `trl/trainer/grpo_trainer.py`):

- `RolloutFunc = Callable[[list[str], GRPOTrainer], dict[str, Any]]` (line 130); `_generate` calls
  `self.rollout_func(prompts, self)` (line 2210) with this process's generation batch. The `RepeatSampler` has
  already repeated each dataset prompt `num_generations` times (lines 1309-1316), so the function returns ONE
  completion per element of `prompts`, in order (rewards must number `len(prompts)`, line 1631, and are grouped
  with `.view(-1, num_generations)`).
- The dict must have `prompt_ids`, `completion_ids`, `logprobs` (lines 2211-2215): per sample a list of token
  ids, and one logprob per completion token (they become `sampling_per_token_logps`, lines 2463-2476, 2910).
  Optional `env_mask` (line 2272: the tool mask, 1 on model tokens, 0 on environment tokens; the loss mask and
  the loss's token count are completion mask * env_mask, lines 2497-2498). Every other key is "extra": its i-th
  value is set on the i-th input row (lines 2741-2748) and so reaches every reward function as a keyword argument
  (line 1585). TRL does not truncate a rollout_func's completions (`max_completion_length` does not apply).
- A reward function may return None for a sample (line 1630): it becomes NaN, the sample is left out of its
  group's baseline and of the logged reward, and its advantage is forced to 0 (lines 2752-2811). TRL logs a
  warning naming each such sample ("All reward functions returned None ...").
- `rollout_func` works with `use_vllm=False`: nothing in the trainer requires vLLM for it.

How a swe_gym_env rollout becomes one TRL sample:

- The prompt names the task: by default the prompt text (or the last user message's content) IS the task's
  `instance_id` (`prompt_to_task`); pass `tasks_for_prompt` for another mapping (it returns `RolloutRequest`
  fields, e.g. `{"index": 3, "split": "gym"}`).
- One rollout per prompt, all concurrently (up to `max_concurrency`) over one `SweGymWSClient`.
- `training_rows` turns the result into its kept sequences (abandoned branches are never rows); a rollout whose
  agent's re-sent history re-tokenised differently, or that has subagent / auxiliary conversations, has several.
  TRL takes one sequence per sample, so `main_row` picks one: among the agent's own rows, the one with the most
  sampled tokens, on a tie the one that ends later; the others are dropped (their count is in
  `env_dropped_sequences`). Its first prompt is `prompt_ids`; the rest
  (completions, plus the tool-result tokens in between) is `completion_ids`, with `env_mask` 0 on the tool-result
  tokens and the engine's logprobs on the sampled tokens (0.0 elsewhere, as TRL's own tool loop does). The
  captured ids and logprobs are used exactly as they are: nothing is re-tokenised.
- Unscorable rollouts (`ok` false or reward None) cannot be dropped: TRL needs one sample per prompt. They get
  reward None (TRL: NaN, out of the group baseline, advantage 0) AND an all-zero `env_mask`, so none of their
  tokens enters the loss or its token count. Their ids are a one-token placeholder (the tokenizer's eos id: TRL
  reads `completion_ids[-1]`, so it cannot be empty). They are never scored 0. The same placeholder, with the
  real reward, is used for a scorable rollout that sampled no token at all (it still counts in its group's
  baseline; there is nothing to train on).
- Extra keys for reward functions: `env_reward` (float or None), `env_rollout_id`, `env_instance_id`,
  `env_error` (None when ok), `env_dropped_sequences`. `env_reward_func` is the reward function that reads
  `env_reward`.

Keep the agent's budget (`max_model_calls`, `max_tokens`) within what the model's context and your memory allow:
TRL trains the whole sequence as returned. Imports nothing from the server, nor trl or torch (the light client:
pydantic, httpx, websockets).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from swe_gym_env.client.trainer import main_row, training_rows
from swe_gym_env.client.ws_client import SweGymWSClient
from swe_gym_env.trace.compact import SequenceError
from swe_gym_env.wire import RolloutRequest, RolloutResult, TrainingRow, failed_result

REQUIRED_KEYS = ("prompt_ids", "completion_ids", "logprobs")


def prompt_to_task(prompt: Any) -> dict[str, Any]:
    """Default prompt → task mapping: the prompt text (a conversational prompt: its last user message) is the
    task's `instance_id`."""
    if isinstance(prompt, list):  # conversational: [{"role": ..., "content": ...}, ...]
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise ValueError("conversational prompt without a user message: cannot name a task")
        prompt = users[-1].get("content")
        if isinstance(prompt, list):  # typed content blocks
            prompt = "".join(b.get("text", "") for b in prompt if isinstance(b, dict))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"prompt does not name a task: {prompt!r}")
    return {"instance_id": prompt.strip()}


def placeholder_token(trainer: Any) -> int:
    """The id used for unscorable samples' placeholder: the trainer tokenizer's eos (pad if none), else 0."""
    tok = getattr(trainer, "processing_class", None)
    tok = getattr(tok, "tokenizer", tok)  # a multimodal processor wraps its tokenizer
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int):
            return value
    return 0


def _sample(result: RolloutResult, placeholder: int) -> tuple[dict[str, Any], int]:
    """One TRL sample for one result, and how many of its sequences were left out."""
    try:
        rows: list[TrainingRow] = training_rows(result)
    except SequenceError as e:  # a result whose sequences do not match its turns: unscorable, loudly
        result = result.model_copy(update={"ok": False, "reward": None, "error": f"bad training sequences: {e}"})
        rows = []
    reward = result.reward if (result.ok and result.reward is not None) else None
    row = main_row(rows)
    start = row.loss_mask.index(1) if row is not None and 1 in row.loss_mask else None
    if row is None or start is None:  # unscorable, or nothing sampled: placeholder, no token in the loss
        sample = {"prompt_ids": [placeholder], "completion_ids": [placeholder], "logprobs": [0.0], "env_mask": [0]}
    else:
        sample = {
            "prompt_ids": [int(i) for i in row.input_ids[:start]],
            "completion_ids": [int(i) for i in row.input_ids[start:]],
            "logprobs": [float(lp) for lp in row.logprobs[start:]],
            "env_mask": [int(m) for m in row.loss_mask[start:]],
        }
    sample["env_reward"] = reward
    sample["env_error"] = None if reward is not None else (result.error or "no reward: grading did not run")
    return sample, max(len(rows) - 1, 0)


def trl_output(results: Sequence[RolloutResult], placeholder_token_id: int = 0) -> dict[str, list]:
    """What a TRL rollout_func returns for these results (one sample per result, in order); see the module doc."""
    out: dict[str, list] = {
        k: []
        for k in (
            *REQUIRED_KEYS,
            "env_mask",
            "env_reward",
            "env_rollout_id",
            "env_instance_id",
            "env_error",
            "env_dropped_sequences",
        )
    }
    for result in results:
        sample, dropped = _sample(result, placeholder_token_id)
        for key, value in sample.items():
            out[key].append(value)
        out["env_rollout_id"].append(result.rollout_id)
        out["env_instance_id"].append(result.instance_id)
        out["env_dropped_sequences"].append(dropped)
    return out


def env_reward_func(prompts: Any = None, completions: Any = None, env_reward: Any = None, **_: Any) -> list:
    """TRL reward function: the environment's reward forwarded by the rollout_func (`env_reward`); None (TRL:
    NaN, unscorable) stays None, never 0."""
    if env_reward is None:
        raise ValueError("env_reward missing: use env_reward_func with make_rollout_func's rollout_func")
    return [None if r is None else float(r) for r in env_reward]


async def run_rollouts(
    base_url: str | Sequence[str],
    requests: Sequence[RolloutRequest],
    *,
    max_concurrency: int = 8,
    timeout_s: float | None = None,
    client_kwargs: dict[str, Any] | None = None,
) -> list[RolloutResult]:
    """Run the requests concurrently over one websocket per server (several URLs: spread by free capacity);
    results in request order. Never raises for a rollout: a connection or server failure is a failed result
    (reward None)."""
    sem = asyncio.Semaphore(max(1, max_concurrency))
    try:
        async with SweGymWSClient(base_url, **(client_kwargs or {})) as client:

            async def one(req: RolloutRequest) -> RolloutResult:
                async with sem:
                    return await client.run_rollout(req, timeout_s=timeout_s)

            return list(await asyncio.gather(*(one(r) for r in requests)))
    except (OSError, TimeoutError) as e:  # could not connect at all
        return [failed_result(r, f"{type(e).__name__}: {e}", phase="validate") for r in requests]


def _run_sync(coro_factory: Callable[[], Any]) -> Any:
    """Run a coroutine to completion from sync code, also when the caller is inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_factory())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(coro_factory())).result()


def make_rollout_func(
    base_url: str | Sequence[str],
    *,
    harness: str = "pi",
    tasks_for_prompt: Callable[[Any], dict[str, Any]] = prompt_to_task,
    split: str = "bundled",
    purpose: str = "train",
    request_fields: dict[str, Any] | None = None,
    max_concurrency: int = 8,
    timeout_s: float | None = None,
    placeholder_token_id: int | None = None,
    on_results: Callable[[list[RolloutResult]], None] | None = None,
    client_kwargs: dict[str, Any] | None = None,
) -> Callable[[list, Any], dict[str, list]]:
    """A TRL `rollout_func(prompts, trainer) -> dict`: one swe_gym_env rollout per prompt (see the module doc).

    - `base_url`: the server (`http://host:port`; the websocket is `/ws`), or a list of servers: each rollout
      goes to the one with most free capacity (`swe_gym_env.client.servers`).
    - `tasks_for_prompt(prompt) -> dict`: `RolloutRequest` fields naming the task (default: `prompt_to_task`).
    - `purpose`: `train` (default) makes the server refuse engines without token ids and processed logprobs;
      `eval` is needed for the built-in scripted engine (placeholder logprobs).
    - `request_fields`: other `RolloutRequest` fields for every rollout (`max_model_calls`, `max_tokens`,
      `temperature`, `deadline_s`, `engine`).
    - `placeholder_token_id`: the id of unscorable samples' one-token placeholder (default: the trainer's eos).
    - `on_results(results)`: called with each batch's `RolloutResult`s (for logging or storing them).
    """
    base = {"harness": harness, "split": split, "purpose": purpose, **(request_fields or {})}

    def rollout_func(prompts: list, trainer: Any = None) -> dict[str, list]:
        requests = [RolloutRequest(**{**base, **tasks_for_prompt(p)}) for p in prompts]
        results = _run_sync(
            lambda: run_rollouts(
                base_url, requests, max_concurrency=max_concurrency, timeout_s=timeout_s, client_kwargs=client_kwargs
            )
        )
        if on_results is not None:
            on_results(results)
        token = placeholder_token_id if placeholder_token_id is not None else placeholder_token(trainer)
        return trl_output(results, token)

    return rollout_func
