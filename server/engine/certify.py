"""Engine certification: what a given engine returns, and so what a rollout against it is good for.

Levels: `tokens` (prompt and completion ids plus aligned logprobs: trainable), `logprobs` (logprobs but no ids),
`text` (eval only). Logprobs are probed at two temperatures on one fixed, moderately uncertain token: identical
values mean the engine reports *raw* logprobs (wrong for importance ratios), different ones *processed*.
"""

from __future__ import annotations

from typing import Literal

import httpx
from pydantic import BaseModel

PROBE = [{"role": "user", "content": "What is the capital of France?"}]


class Certificate(BaseModel):
    url: str
    reachable: bool
    served_model: str | None = None
    max_model_len: int | None = None  # the served context, where the engine says (vLLM's /v1/models does)
    level: Literal["tokens", "logprobs", "text", "unreachable"]
    logprobs_mode: Literal["processed", "raw", "placeholder", "unknown"] = "unknown"
    detail: str = ""


def probe_body(model: str, temperature: float) -> dict:
    """The certification's request: one token of a fixed prompt, with logprobs and token ids."""
    return {
        "model": model,
        "messages": PROBE,
        "max_tokens": 1,
        "temperature": temperature,
        "seed": 0,
        "logprobs": True,
        "top_logprobs": 5,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


async def _probe(client: httpx.AsyncClient, url: str, model: str, temperature: float) -> dict:
    r = await client.post(f"{url}/chat/completions", json=probe_body(model, temperature))
    r.raise_for_status()
    return r.json()


def _first_logprobs(reply: dict) -> dict[str, float]:
    entries = ((reply.get("choices") or [{}])[0].get("logprobs") or {}).get("content") or []
    if not entries:
        return {}
    return {t["token"]: t["logprob"] for t in entries[0].get("top_logprobs") or []} or {
        entries[0]["token"]: entries[0]["logprob"]
    }


async def certify(url: str, api_key: str | None = None, timeout_s: float = 60.0) -> Certificate:
    """``timeout_s`` bounds each answer; connecting gets at most 10 s (an engine that is not there fails at once, one
    that is busy — a trainer's batch queued before the probe, a loaded host — gets its time)."""
    url = url.rstrip("/")
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)), headers=headers
    ) as client:
        try:
            models = (await client.get(f"{url}/models")).json()["data"]
            model = models[0]["id"]
            max_len = models[0].get("max_model_len")
            hot = await _probe(client, url, model, 1.0)
            cold = await _probe(client, url, model, 0.5)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
            return Certificate(url=url, reachable=False, level="unreachable", detail=f"{type(e).__name__}: {e}")
    choice = (hot.get("choices") or [{}])[0]
    ids, prompt_ids = choice.get("token_ids"), hot.get("prompt_token_ids")
    entries = (choice.get("logprobs") or {}).get("content") or []
    if ids and prompt_ids and len(entries) == len(ids):
        level = "tokens"
    elif entries:
        level = "logprobs"
    else:
        level = "text"
    mode, detail = "unknown", ""
    if str(hot.get("system_fingerprint", "")).startswith("swe-gym-env-builtin"):
        mode, detail = "placeholder", "built-in engine: real token ids, placeholder logprobs (not a model)"
    else:
        a, b = _first_logprobs(hot), _first_logprobs(cold)
        common = set(a) & set(b)
        if common:
            tok = max(common, key=lambda t: a[t])
            delta = abs(a[tok] - b[tok])
            mode = "raw" if delta < 1e-4 else "processed" if delta > 0.05 else "unknown"
            detail = f"probe token {tok}: logprob {a[tok]:.4f} at T=1.0 vs {b[tok]:.4f} at T=0.5"
    return Certificate(
        url=url,
        reachable=True,
        served_model=model,
        max_model_len=max_len if isinstance(max_len, int) and max_len > 0 else None,
        level=level,
        logprobs_mode=mode,
        detail=detail,
    )
