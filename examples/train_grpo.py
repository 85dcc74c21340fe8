"""GRPO with TRL on rollouts served by swe_gym_env: captured ids and logprobs used as they are.

Run it in the trainer venv (`bash scripts/setup_trl.sh` → `.trl-venv`: trl 1.16.0, torch, the light client), against
a swe_gym_env server whose engine is a vLLM started with the capture flags (`--return-tokens-as-token-ids
--logprobs-mode processed_logprobs`) and, for weight sync, `VLLM_SERVER_DEV_MODE=1`. See examples/README.md.

What it does, per optimizer step:
1. TRL's `GRPOTrainer` asks the `rollout_func` (client/trl_adapter.py) for `tasks x group` completions: one
   swe_gym_env rollout each (Pi in a sandbox, the model served by vLLM), over the typed websocket client. A group is
   `group` rollouts of the same task; advantages are group-relative (TRL: reward minus the group mean). Unscorable
   rollouts (`ok=false`, `reward=None`) are excluded: reward None, out of the group baseline, no token in the loss.
2. The captured prompt/completion ids and the engine's processed logprobs go to TRL unchanged (no re-rendering).
3. `CapturedLogprobGRPOTrainer` makes the behaviour policy the captured one: TRL's `old_per_token_logps` become the
   captured logprobs, so the clipped ratio is pi_theta / pi_vllm (TRL only does this itself when it drives vLLM).
   It prints the importance ratio exp(trainer - captured) over the trainable tokens before the update, taken from
   the forward pass that computes the loss (no extra pass over the batch).
4. After the step the new weights go into the serving vLLM (`--engine-url`): saved as safetensors, then
   `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` and `POST
   /reset_prefix_cache` (vLLM's dev endpoints, CPU build included). Without `--engine-url` the run is off-policy
   after the first step and the importance ratio carries it.

Per step it prints one `STEP {json}` line: rewards, groups whose rewards are all equal (advantage 0: no learning
signal from that group), trainable tokens, importance-ratio min/mean/max, |Δ logprob| mean/max, loss, sync time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections import defaultdict

import httpx
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from swe_gym_env.client.trl_adapter import env_reward_func, make_rollout_func
from swe_gym_env.client.ws_client import SyncSweGymWSClient
from swe_gym_env.wire import RolloutResult


class CapturedLogprobGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose behaviour logprobs are the engine's captured ones (see the module doc, step 3).

    The trainer's own logprobs come from the forward pass that computes the loss (one optimizer step is one batch of
    rollouts, so every micro-batch of the step runs on the weights the rollouts were sampled from): no extra pass."""

    trained_tokens_total = 0
    _scoring: dict | None = None  # the micro-batch whose loss is being computed
    _batch: dict | None = None  # this step's batch: trainable tokens, advantages, trainer - captured per token

    @staticmethod
    def _trainable(batch: dict) -> torch.Tensor:
        return (batch["completion_mask"] * batch.get("tool_mask", torch.ones_like(batch["completion_mask"]))).bool()

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        captured = out.get("sampling_per_token_logps")
        if captured is None:
            raise RuntimeError("no captured logprobs: the rollout_func must return `logprobs`")
        # The clipped ratio is taken against the captured (behaviour) logprobs. Positions outside the loss mask get
        # the trainer's own values in `_get_per_token_logps_and_entropies`, once the loss's forward pass has them.
        out["old_per_token_logps"] = captured.clone()
        n = int(self._trainable(out).sum())
        self.trained_tokens_total += n
        self._batch = {"trainable_tokens": n, "advantages": [round(float(a), 4) for a in out["advantages"]],
                       "deltas": []}  # fmt: skip
        return out

    def _compute_loss(self, model, inputs):
        self._scoring = inputs
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._scoring = None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        inputs, self._scoring = self._scoring, None  # only the loss's own forward pass, once per micro-batch
        if inputs is not None and self._batch is not None:
            trainer_lps, captured, m = out[0].detach(), inputs["sampling_per_token_logps"], self._trainable(inputs)
            # TRL reads `old_per_token_logps` after this pass (trl 1.16 `_compute_loss`)
            inputs["old_per_token_logps"] = torch.where(m, captured, trainer_lps)
            self._batch["deltas"].append((trainer_lps - captured)[m])
        return out

    @property
    def step_stats(self) -> dict:
        """This step's trainable tokens, importance ratio exp(trainer - captured) and |Δ logprob| over them, taken
        before the update (the step's forward passes), and the advantages."""
        if self._batch is None:
            return {}
        delta = torch.cat(self._batch["deltas"]) if self._batch["deltas"] else torch.zeros(0)
        ratio, n = torch.exp(delta), int(delta.numel())
        if n != self._batch["trainable_tokens"]:
            raise RuntimeError(
                f"the step's forward passes scored {n} of {self._batch['trainable_tokens']} trainable tokens"
            )
        return {
            "trainable_tokens": self._batch["trainable_tokens"],
            "is_ratio": {
                "min": round(float(ratio.min()), 5) if n else None,
                "mean": round(float(ratio.mean()), 5) if n else None,
                "max": round(float(ratio.max()), 5) if n else None,
            },
            "abs_logprob_delta": {
                "mean": round(float(delta.abs().mean()), 6) if n else None,
                "max": round(float(delta.abs().max()), 6) if n else None,
            },
            "advantages": self._batch["advantages"],
        }


def sync_weights(model, engine_url: str, workdir: str) -> float:
    """Load the trainer's weights into the serving vLLM (dev endpoints); returns the seconds it took."""
    start = time.monotonic()
    model.save_pretrained(workdir)
    base = engine_url.rstrip("/").removesuffix("/v1")
    r = httpx.post(
        f"{base}/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": workdir}},
        timeout=600,
    )
    r.raise_for_status()
    httpx.post(f"{base}/reset_prefix_cache", timeout=60).raise_for_status()
    return time.monotonic() - start


def group_report(results: list[RolloutResult]) -> dict:
    groups: dict[str, list] = defaultdict(list)
    for r in results:
        groups[r.instance_id or "?"].append(r.reward if r.ok else None)
    equal = [t for t, rs in groups.items() if len({x for x in rs if x is not None}) <= 1]
    return {"groups": dict(groups), "groups_without_signal": equal}


class StepPrinter(TrainerCallback):
    def __init__(self, trainer_ref: dict, batches: list, engine_url: str | None, workdir: str) -> None:
        self.ref, self.batches, self.engine_url, self.workdir = trainer_ref, batches, engine_url, workdir
        self.pending: dict | None = None

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.ref["trainer"]
        results = self.batches[-1] if self.batches else []
        scorable = [r.reward for r in results if r.ok and r.reward is not None]
        line = {
            "step": state.global_step,
            "rollouts": len(results),
            "unscorable": len(results) - len(scorable),
            "reward_mean": round(sum(scorable) / len(scorable), 4) if scorable else None,
            **group_report(results),
            **getattr(trainer, "step_stats", {}),
            "errors": sorted({r.error for r in results if not r.ok and r.error})[:3],
        }
        if self.engine_url:
            line["weight_sync_s"] = round(sync_weights(trainer.model, self.engine_url, self.workdir), 2)
        else:
            line["weight_sync_s"] = None  # off-policy from the next step on: the importance ratio carries it
        self.pending = line

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.pending is not None:
            self.pending["loss"] = (logs or {}).get("loss")
            print("STEP " + json.dumps(self.pending), flush=True)
            self.pending = None


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True, help="swe_gym_env server URL (http://host:port)")
    p.add_argument("--model", required=True, help="the weights the engine serves (a transformers model folder)")
    p.add_argument("--engine-url", help="the serving vLLM (…/v1), started with VLLM_SERVER_DEV_MODE=1: weight sync")
    p.add_argument("--split", default="bundled")
    p.add_argument("--tasks", type=int, default=2, help="tasks per step (the first N of the split)")
    p.add_argument("--group", type=int, default=2, help="rollouts per task (GRPO group size)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--max-model-calls", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (trainer uses the same)")
    p.add_argument("--deadline", type=float, default=300.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--train-last-layers", type=int, default=0, help="train only the last N decoder layers (0: all)")
    p.add_argument("--bf16", action="store_true", help="train in bfloat16 (GPUs)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for memory (large models)")
    p.add_argument("--output-dir", default=None)
    return p.parse_args()


def rollout_func_for(args: argparse.Namespace, batches: list[list[RolloutResult]]):
    """TRL's `rollout_func`: one swe_gym_env rollout per completion, each step's results appended to ``batches``."""
    return make_rollout_func(
        args.server,
        split=args.split,
        purpose="train",  # the server refuses engines without token ids + processed logprobs
        request_fields={
            "max_model_calls": args.max_model_calls,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "deadline_s": args.deadline,
        },
        max_concurrency=args.tasks * args.group,
        on_results=batches.append,
    )


def load_model(args: argparse.Namespace):
    """The policy, with only its last ``--train-last-layers`` decoder layers (and the final norm) trainable if set."""
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    if args.train_last_layers:
        model.requires_grad_(False)
        for layer in model.model.layers[-args.train_last_layers :]:
            layer.requires_grad_(True)
        model.model.norm.requires_grad_(True)
    return model


def grpo_config(args: argparse.Namespace, out_dir: str) -> GRPOConfig:
    return GRPOConfig(
        output_dir=out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=args.tasks * args.group,  # one optimizer step = one batch of rollouts
        num_generations=args.group,
        temperature=args.temperature,  # TRL divides logits by it: the same processed logprobs as the engine's
        use_vllm=False,  # generation is swe_gym_env's (rollout_func); TRL does not drive vLLM here
        use_cpu=not torch.cuda.is_available(),
        bf16=args.bf16,
        learning_rate=args.lr,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        seed=0,
        dataloader_num_workers=0,
        # TRL turns it on by default; with frozen layers it would still backpropagate through all of them.
        gradient_checkpointing=args.gradient_checkpointing,
    )


def finish(trainer: CapturedLogprobGRPOTrainer, steps: int, took_s: float) -> int:
    """Say what the run trained; 0 when every step ran with a finite loss and some token was trained."""
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    trained = getattr(trainer, "trained_tokens_total", 0)
    ok = trainer.state.global_step == steps and all(math.isfinite(x) for x in losses) and trained > 0
    print(
        f"done: {trainer.state.global_step} optimizer steps, {trained} trainable tokens in "
        f"{took_s:.0f} s" + ("" if trained else " (no scorable rollout: nothing was trained)"),
        flush=True,
    )
    return 0 if ok else 1


def main() -> int:
    args = parse_args()
    with SyncSweGymWSClient(args.server) as client:
        page = client.list_tasks(args.split, limit=args.tasks)
    prompts = [t.instance_id for t in page.tasks][: args.tasks]
    print(f"tasks: {prompts}; group size {args.group}; {args.steps} steps", flush=True)

    batches: list[list[RolloutResult]] = []
    rollout_func = rollout_func_for(args, batches)
    model = load_model(args)
    out_dir = args.output_dir or tempfile.mkdtemp(prefix="grpo-")
    ref: dict = {}
    trainer = CapturedLogprobGRPOTrainer(
        model=model,
        reward_funcs=env_reward_func,
        args=grpo_config(args, out_dir),
        rollout_func=rollout_func,
        train_dataset=Dataset.from_dict({"prompt": prompts * args.steps}),
        callbacks=[StepPrinter(ref, batches, args.engine_url, os.path.join(out_dir, "sync"))],
    )
    ref["trainer"] = trainer
    start = time.monotonic()
    trainer.train()
    return finish(trainer, args.steps, time.monotonic() - start)


if __name__ == "__main__":
    raise SystemExit(main())
