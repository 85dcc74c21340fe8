"""Trainer-side logprob parity: do the captured ids and logprobs mean what a trainer will compute from them?

For every captured turn the same weights are run in transformers on `prompt_token_ids + completion_token_ids`, and
the logprob of each sampled completion token is compared with the engine's captured one. The engine's logprobs are
*processed* (vLLM `--logprobs-mode processed_logprobs`): taken after temperature (and top-k / top-p, when the request
set them), so the trainer side applies the same transform, read from the turn's forwarded request.

Per turn: token count, mean and max |Δ|, the position of the first large mismatch (|Δ| > the max tolerance), and on
failure a diagnosis naming the cause it can prove:

- `length`: the numbers of completion ids and logprobs differ (ids re-tokenised or cut);
- `shifted by K`: the logprobs line up with the ids moved by K tokens (an off-by-one between ids and logprobs, or a
  prompt/completion boundary in the wrong place);
- `raw logprobs`: the values match temperature 1.0, not the turn's temperature (served with raw logprobs);
- `ids differ`: none of these; the ids are not what these weights sampled (re-tokenised or re-rendered ids, other
  weights); the token at the first mismatch is named with both logprobs.

Tolerances (`TOLERANCES`): `fp32` for an engine serving float32 weights checked in float32 (measured: mean |Δ| 1e-5,
max 3e-5 per turn; the bound leaves ~30x for kernel and thread-count differences); `bf16` where either side runs
bfloat16 (measured mean 0.03-0.05, max 0.12-0.28: rounding of a 7-bit mantissa, not a bug). A sequence shifted by
one token is off by a mean of 6-11 nats, far outside both.

Runs where torch and transformers are (`python -m swe_gym_env.client.parity`, e.g. from `.trl-venv`); imports them
lazily and never imports the server. Rollouts come from a JSON / JSONL file of results, a server
(`--server URL`: `GET /rollouts/{id}`), or the local results store (`$SWE_GYM_DATA_DIR/results` or the cache's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swe_gym_env.trace.forms import TurnsView
from swe_gym_env.wire import RolloutResult, RolloutStatus, Turn

ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SHIFTS = (-2, -1, 1, 2)


@dataclass(frozen=True)
class Tolerance:
    mean: float
    max: float


TOLERANCES = {"fp32": Tolerance(mean=1e-3, max=1e-2), "bf16": Tolerance(mean=0.1, max=1.0)}


@dataclass
class TurnParity:
    rollout_id: str
    turn: int
    tokens: int
    temperature: float
    mean_abs: float
    max_abs: float
    first_mismatch: int | None
    ok: bool
    diagnosis: str | None = None


@dataclass
class ParityReport:
    tolerance: Tolerance
    dtype: str
    turns: list[TurnParity] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.turns) and all(t.ok for t in self.turns)

    def table(self) -> str:
        cols = f"{'rollout':<26} {'turn':>4} {'tokens':>6} {'temp':>5} {'mean|Δ|':>9} {'max|Δ|':>9}"
        lines = [f"{cols} {'first':>5}  verdict"]
        for t in self.turns:
            first = "-" if t.first_mismatch is None else str(t.first_mismatch)
            verdict = "ok" if t.ok else f"FAIL: {t.diagnosis}"
            lines.append(
                f"{t.rollout_id[:26]:<26} {t.turn:>4} {t.tokens:>6} {t.temperature:>5.2f} {t.mean_abs:>9.2e} "
                f"{t.max_abs:>9.2e} {first:>5}  {verdict}"
            )
        bad = sum(not t.ok for t in self.turns)
        lines.append(
            f"{len(self.turns)} turns, {bad} failed; tolerance ({self.dtype}): mean|Δ| <= {self.tolerance.mean:g}, "
            f"max|Δ| <= {self.tolerance.max:g} -> {'PASS' if self.ok else 'FAIL'}"
        )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "dtype": self.dtype, "tolerance": asdict(self.tolerance),
                "turns": [asdict(t) for t in self.turns]}  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# sampling parameters of a turn, as the engine applied them


def sampling_of(turn: Turn) -> tuple[float, int | None, float | None]:
    """(temperature, top_k, top_p) from the turn's forwarded request (a full-form turn: `result_form`); vLLM's
    defaults where absent."""
    if turn.request is None:
        raise ValueError(f"turn {turn.index} is compact: read it with swe_gym_env.trace.forms (expand)")
    req = turn.request
    temp = req.get("temperature")
    temperature = 1.0 if temp is None else float(temp)
    top_k = req.get("top_k")
    top_k = int(top_k) if top_k is not None and int(top_k) > 0 else None
    top_p = req.get("top_p")
    top_p = float(top_p) if top_p is not None and float(top_p) < 1.0 else None
    return temperature, top_k, top_p


# ---------------------------------------------------------------------------------------------------------------
# the math (torch)


def completion_logits(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> Any:
    """The model's float logits at the positions that predict each completion token (one forward pass)."""
    import torch  # pyright: ignore[reportMissingImports]

    if not prompt_ids:
        raise ValueError("a turn without prompt ids cannot be scored")
    ids = torch.tensor([[*prompt_ids, *completion_ids]], dtype=torch.long)
    n = len(completion_ids)
    with torch.inference_mode():
        # logits at positions len(prompt)-1 .. L-2 predict the completion tokens: keep n+1 (the last is unused).
        return model(input_ids=ids, logits_to_keep=n + 1).logits[0, :-1].float()


def logprobs_of(
    logits: Any,
    completion_ids: list[int],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> list[float]:
    """Logprob of each completion token from `completion_logits`, after the engine's sampling transform."""
    import torch  # pyright: ignore[reportMissingImports]

    with torch.inference_mode():
        logits = logits / max(temperature, 1e-5) if temperature > 0 else logits
        if top_k is not None and top_k < logits.shape[-1]:
            kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p is not None:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            cum = sorted_logits.softmax(-1).cumsum(-1)
            drop = (cum - sorted_logits.softmax(-1)) > top_p  # keep the smallest prefix reaching top_p
            logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
        lps = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(completion_ids, dtype=torch.long).unsqueeze(-1)
        return lps.gather(-1, target).squeeze(-1).tolist()


def completion_logprobs(
    model: Any,
    prompt_ids: list[int],
    completion_ids: list[int],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> list[float]:
    """Logprob of each completion token given everything before it, after the engine's sampling transform."""
    if not completion_ids:
        return []
    logits = completion_logits(model, prompt_ids, completion_ids)
    return logprobs_of(logits, completion_ids, temperature, top_k, top_p)


def _stats(captured: list[float], computed: list[float]) -> tuple[float, float, list[float]]:
    pairs = zip(captured, computed, strict=False)
    diffs = [abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf for a, b in pairs]
    if not diffs:
        return 0.0, 0.0, []
    return sum(diffs) / len(diffs), max(diffs), diffs


def _within(mean: float, mx: float, tol: Tolerance) -> bool:
    return mean <= tol.mean and mx <= tol.max


def shift_of(captured: list[float], computed: list[float], tol: Tolerance) -> int | None:
    """K such that captured[j] == computed[j + K] within tolerance (at least 4 overlapping tokens), else None."""
    for k in SHIFTS:
        lo, hi = max(0, -k), min(len(captured), len(computed) - k)
        if hi - lo < 4:
            continue
        mean, mx, _ = _stats(captured[lo:hi], computed[lo + k : hi + k])
        if _within(mean, mx, tol):
            return k
    return None


def check_turn(model: Any, rollout_id: str, turn: Turn, tol: Tolerance) -> TurnParity:
    temperature, top_k, top_p = sampling_of(turn)
    if turn.prompt_token_ids is None:
        raise ValueError(f"turn {turn.index} is compact: read it with swe_gym_env.trace.forms (expand)")
    prompt, ids, captured = turn.prompt_token_ids, turn.completion_token_ids, list(turn.logprobs)
    base: dict[str, Any] = {
        "rollout_id": rollout_id,
        "turn": turn.index,
        "tokens": len(ids),
        "temperature": temperature,
    }
    if len(ids) != len(captured):
        return TurnParity(**base, mean_abs=math.inf, max_abs=math.inf, first_mismatch=min(len(ids), len(captured)),
                          ok=False, diagnosis=f"length: {len(ids)} completion ids but {len(captured)} logprobs "
                          "(ids re-tokenised or cut)")  # fmt: skip
    vocab = model.get_output_embeddings().weight.shape[0]
    bad = [i for i in [*prompt, *ids] if not 0 <= i < vocab]
    if bad:
        why = f"ids outside the model's vocabulary ({vocab}): {bad[:5]} (another tokenizer?)"
        return TurnParity(**base, mean_abs=math.inf, max_abs=math.inf, first_mismatch=None, ok=False, diagnosis=why)
    # one forward pass per turn: the raw-logprobs check below reads the same logits at temperature 1.0
    logits = completion_logits(model, prompt, ids) if ids else None
    computed = [] if logits is None else logprobs_of(logits, ids, temperature, top_k, top_p)
    mean, mx, diffs = _stats(captured, computed)
    first = next((i for i, d in enumerate(diffs) if d > tol.max), None)
    if _within(mean, mx, tol):
        return TurnParity(**base, mean_abs=mean, max_abs=mx, first_mismatch=first, ok=True)
    if (k := shift_of(captured, computed, tol)) is not None:
        why = (f"shifted by {k:+d}: the captured logprobs line up with the ids moved by {k:+d} token(s) "
               "(off-by-one between ids and logprobs, or the prompt/completion boundary moved)")  # fmt: skip
    elif (
        logits is not None and temperature != 1.0 and _within(*_stats(captured, logprobs_of(logits, ids, 1.0))[:2], tol)
    ):
        why = (f"raw logprobs: the captured values match temperature 1.0, not the turn's {temperature:g} "
               "(serve vLLM with --logprobs-mode processed_logprobs)")  # fmt: skip
    else:
        i = first if first is not None else 0
        why = (f"ids differ: token {i} (id {ids[i]}) has logprob {computed[i]:.3f} here vs {captured[i]:.3f} "
               "captured (re-tokenised or re-rendered ids, other weights, or another dtype)")  # fmt: skip
    return TurnParity(**base, mean_abs=mean, max_abs=mx, first_mismatch=first, ok=False, diagnosis=why)


def load_model(model_dir: str | Path, dtype: str = "float32") -> Any:
    import torch  # pyright: ignore[reportMissingImports]
    from transformers import AutoModelForCausalLM  # pyright: ignore[reportMissingImports]

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
    return model.eval()


def check_rollouts(results: list[RolloutResult], model: Any, tol: Tolerance, dtype: str = "float32") -> ParityReport:
    report = ParityReport(tolerance=tol, dtype=dtype)
    for result in results:
        view = TurnsView(result.turns)
        for turn in result.turns:  # one turn in the full form at a time (its whole prompt and request)
            full = turn
            if turn.prompt_token_ids is None or turn.request is None:
                update = {"prompt_token_ids": view.prompt(turn.index), "request": view.request(turn.index)}
                full = turn.model_copy(update=update)
            report.turns.append(check_turn(model, result.rollout_id, full, tol))
    return report


# ---------------------------------------------------------------------------------------------------------------
# where rollouts come from


def results_dir() -> Path:
    """The server's local results store (same rule as the server: $SWE_GYM_DATA_DIR/results, else the cache)."""
    if data := os.environ.get("SWE_GYM_DATA_DIR"):
        return Path(data) / "results"
    root = os.environ.get("SWE_GYM_ENV_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "swe_gym_env"
    )
    return Path(root) / "results"


def _parse(obj: Any) -> RolloutResult:
    if isinstance(obj, dict) and "summary" in obj and "state" in obj:  # a RolloutStatus (GET /rollouts/{id})
        status = RolloutStatus.model_validate(obj)
        if status.result is None:
            raise ValueError(f"rollout {status.rollout_id} is {status.state}, not finished")
        return status.result
    return RolloutResult.model_validate(obj)


def load_rollouts(ref: str, server: str | None = None) -> list[RolloutResult]:
    """A file (JSON result / status / list of them, or JSONL), else a rollout id (server, or the results store)."""
    path = Path(ref)
    if path.is_file():
        text = path.read_text()
        if path.suffix == ".jsonl":
            return [_parse(json.loads(line)) for line in text.splitlines() if line.strip()]
        data = json.loads(text)
        return [_parse(x) for x in data] if isinstance(data, list) else [_parse(data)]
    if not ROLLOUT_ID.match(ref):
        raise ValueError(f"{ref!r} is neither a file nor a rollout id")
    if server:
        import httpx

        r = httpx.get(f"{server.rstrip('/')}/rollouts/{ref}", timeout=60)
        if r.status_code == 404:
            raise ValueError(f"the server at {server} has no rollout {ref!r}")
        r.raise_for_status()
        return [_parse(r.json())]
    stored = results_dir() / f"{ref}.json"
    if not stored.is_file():
        raise ValueError(f"no rollout {ref!r} in {stored.parent} (give --server URL or a results file)")
    return [RolloutResult.model_validate_json(stored.read_text())]


# ---------------------------------------------------------------------------------------------------------------
# command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swe-gym-env parity", description="Trainer-side logprob parity of captured turns.")
    p.add_argument("--rollout", required=True, action="append", help="rollout id or results file (repeatable)")
    p.add_argument("--model", required=True, help="model folder with the weights the engine served")
    p.add_argument("--server", help="server URL to fetch rollouts by id (GET /rollouts/{id})")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="trainer-side dtype")
    p.add_argument("--tolerance", choices=sorted(TOLERANCES), help="fp32 (default) or bf16 (engine or trainer bf16)")
    p.add_argument("--mean-tol", type=float, help="override the mean |Δ| bound")
    p.add_argument("--max-tol", type=float, help="override the max |Δ| bound")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    preset = TOLERANCES[args.tolerance or ("bf16" if args.dtype == "bfloat16" else "fp32")]
    tol = Tolerance(
        mean=preset.mean if args.mean_tol is None else args.mean_tol,
        max=preset.max if args.max_tol is None else args.max_tol,
    )
    try:
        results = [r for ref in args.rollout for r in load_rollouts(ref, args.server)]
    except (ValueError, OSError) as e:
        print(f"parity: {e}", file=sys.stderr)
        return 2
    scored = [r for r in results if r.turns]
    if not scored:
        print("parity: no captured turns in these rollouts", file=sys.stderr)
        return 2
    report = check_rollouts(scored, load_model(args.model, args.dtype), tol, args.dtype)
    print(json.dumps(report.to_json()) if args.json else report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
