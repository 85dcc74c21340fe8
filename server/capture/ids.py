"""Token ids and logprobs as an engine sends them: checked into arrays (int64 ids, float64 logprobs, the engine's
values exactly), and vLLM's prompt ids cut from a streamed first chunk without parsing them."""

from __future__ import annotations

import re
import warnings
from array import array
from typing import Any

import numpy as np

from swe_gym_env.server.capture.dialect import DialectError


def token_ids(x: Any) -> array | None:
    """``x`` as int64 ids when it is a non-empty flat list (or array) of token ids in [0, 2**31), else None. The
    range is checked in C: this runs on every prompt, 50k ids and more."""
    if isinstance(x, array) and x.typecode == "q":
        a = x
    elif isinstance(x, list) and x:
        try:
            a = array("q", x)
        except (TypeError, OverflowError):
            return None
    else:
        return None
    if not a:
        return None
    v = np.frombuffer(a, np.int64)
    return a if int(v.min()) >= 0 and int(v.max()) < 2**31 else None


def parse_id_list(raw: bytes) -> array | None:
    """A JSON list of ints (``[1,2,3]``, as the engine wrote it) straight into int64, without a list of Python ints
    in between; None when it is not plainly that (the caller then parses it as JSON and reports what is wrong)."""
    inner = raw[1:-1]
    if raw[:1] != b"[" or raw[-1:] != b"]" or not inner.strip():
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (and stops early) where the text is not all numbers
            v = np.fromstring(inner, dtype=np.int64, sep=",")  # pyright: ignore[reportCallIssue]
    except (ValueError, DeprecationWarning):
        return None
    if len(v) != inner.count(b",") + 1:  # a trailing or doubled comma, or a float numpy read in part
        return None
    return array("q", v.tobytes())


def check_ids(prompt_ids: Any, ids: Any, content: Any) -> tuple[array, array, array]:
    """Validate a call's ids and logprobs; returns them as arrays (prompt and completion ids int64, logprobs
    float64, exactly the engine's values). Anything off is an error, never a success."""
    prompt = token_ids(prompt_ids)
    if prompt is None:
        raise DialectError(502, "engine returned no prompt_token_ids (is it vLLM >= 0.10.2?)", "no_token_ids")
    completion = token_ids(ids)
    if completion is None:
        raise DialectError(502, "engine returned no completion token_ids", "no_token_ids")
    if not isinstance(content, list) or len(content) != len(completion):
        raise DialectError(502, f"engine returned {len(content or [])} logprobs for {len(completion)} tokens")
    lps = array("d")
    for i, (tid, entry) in enumerate(zip(completion, content, strict=True)):
        if not isinstance(entry, dict) or entry.get("token") != f"token_id:{tid}":
            raise DialectError(502, f"logprob entry {i} does not name token {tid} (need --return-tokens-as-token-ids)")
        lp = entry.get("logprob")
        if not isinstance(lp, int | float) or isinstance(lp, bool) or lp > 0:
            raise DialectError(502, f"logprob entry {i} is not a log-probability: {lp!r}")
        lps.append(lp)
    return prompt, completion, lps


_PROMPT_KEY = b'"prompt_token_ids"'
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


def cut_prompt_ids(data: bytes) -> tuple[bytes, bytes] | None:
    """vLLM's first chunk without its top-level ``prompt_token_ids`` (a few hundred bytes to parse instead of the
    whole prompt's ids), and those ids' JSON list, uncut; None when the chunk is not plainly of that shape (the
    caller then parses it whole)."""
    k = data.find(_PROMPT_KEY)
    if k < 0:
        return None
    i = k + len(_PROMPT_KEY)
    j = data.find(b"[", i)
    if j < 0 or data[i:j].strip() != b":":
        return None
    end = data.find(b"]", j)  # a flat list of ints: its first "]" closes it
    if end < 0:
        return None
    head, tail = data[:k].rstrip(), data[end + 1 :].lstrip()
    if head.endswith(b","):
        head = head[:-1]
    elif tail.startswith(b","):
        tail = tail[1:]
    elif not (head.endswith(b"{") and tail.startswith(b"}")):
        return None
    bare = _STRINGS.sub(b"", head)  # the key must sit at the top level: one object open before it
    if bare.count(b"{") + bare.count(b"[") - bare.count(b"}") - bare.count(b"]") != 1:
        return None
    return head + tail, data[j : end + 1]
