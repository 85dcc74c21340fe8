"""A session as a document: every turn in the compact form (`wire.Turn`: its new prompt ids and messages), provenance,
the graph's sequences (each one's token ids, loss mask and logprobs once) and findings.

A live session is exported from memory (its discards and roles provisional until it closes); one that is gone from
memory is read back from the durable store, so a closed session's document is the same before and after a restart.
"""

from __future__ import annotations

import numpy as np

from swe_gym_env.server.capture.compact import RequestDigests
from swe_gym_env.server.capture.dialect import decoded_tool_calls
from swe_gym_env.server.capture.graph import RolloutGraph, Segment
from swe_gym_env.server.capture.session import CaptureSession
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.wire import SCHEMA_VERSION, Turn

FULL_FIELDS = {"prompt_token_ids", "request"}  # a document's turns are compact: each prompt once, in its sequence


def apply_graph(g: RolloutGraph, turns: list, demoted: set[int] | list[int]) -> list[Segment]:
    """Discards, roles, training sequences (and each turn's sequence) from the graph, written onto the turns (models
    or dicts)."""
    g.finalize(demoted)
    segments = g.segments()
    seq_of = {i: k for k, s in enumerate(segments) for i in s.turns}
    for turn, node in zip(turns, g.nodes, strict=True):
        fields = {"discarded": node.discarded, "role": node.role, "sequence": seq_of.get(node.index)}
        if isinstance(turn, dict):
            turn.update(fields)
        else:
            turn.discarded, turn.role, turn.sequence = node.discarded, node.role, fields["sequence"]
    return segments


def export_live(s: CaptureSession) -> dict:
    if not s.closed and s.turns:  # provisional discards and roles (final when it closes)
        apply_graph(s.graph, s.turns, s.demoted)
    turns = [t.model_dump(exclude=FULL_FIELDS) for t in s.turns]
    state = "closed" if s.closed else "open"
    findings = [f.model_dump() for f in s.findings]
    return document(s.id, state, s.meta(), turns, s.graph, findings, s.stop_reason)


def rebuild(calls: list[dict]) -> tuple[RolloutGraph, list[dict], list[dict]]:
    """The graph, the compact turns (as the proxy made them) and what linking found, from a session's stored calls.
    Prompts are rebuilt from the graph's own storage (a chain's tokens once), never one whole list per call."""
    g = RolloutGraph()
    requests = RequestDigests()
    linked: list[dict] = []
    turns: list[dict] = []
    messages: list = []
    for c in calls:
        base = c["base"]
        if base is not None and not 0 <= base < len(g.nodes):
            raise ValueError(f"stored call {c['index']} continues call {base}, which is not an earlier call")
        head = g.nodes[base].seq()[: c["shared"]] if base is not None else np.empty(0, np.int32)
        prompt = np.concatenate([head, c["prompt_rest"]])
        linked += [f.model_dump() for f in g.add(prompt, c["completion_token_ids"], c["logprobs"])]
        n = g.nodes[-1]
        messages = messages[: c["keep_messages"]] + c["new_messages"]
        request = requests.add(n.base, messages, c["params"])
        skip = {"at", "base", "shared", "prompt_rest", "keep_messages", "new_messages", "params"}
        turn = Turn(
            **{k: v for k, v in c.items() if k not in skip},
            prompt_len=n.prompt_len,
            prompt_base=n.base,
            prompt_shared=n.shared,
            prompt_new_ids=prompt[n.shared :].tolist(),
            **request,
            parent=n.parent,
            relation=n.relation,
            retry_of=n.retry_of,
        )
        turns.append(turn.model_dump(exclude=FULL_FIELDS))
    return g, turns, linked


def export_stored(store: CaptureStore | None, session_id: str) -> dict | None:
    if store is None:
        return None
    data = store.load_session(session_id)
    if data is None:
        return None
    g, turns, linked = rebuild(data["calls"])  # what linking found: a closed session's stored findings hold it
    if g.nodes:
        apply_graph(g, turns, data["demoted"])
    findings = list(data["findings"]) + (linked if data["state"] != "closed" else [])
    return document(session_id, data["state"], data["meta"], turns, g, findings, data["stop_reason"])


def document(
    sid: str, state: str, meta: dict, turns: list[dict], g: RolloutGraph, findings: list, stop_reason: str | None
) -> dict:
    for t in turns:
        t["tool_calls"] = decoded_tool_calls(t.get("response_message") or {})
    return {
        "schema_version": SCHEMA_VERSION,  # the turns' form (wire.Turn, compact): read them with result_form
        "session_id": sid,
        "state": state,
        "stop_reason": stop_reason,
        "provenance": {
            "engine": meta.get("engine"),
            "sampling": meta.get("sampling"),
            "seed": (meta.get("sampling") or {}).get("seed"),
            "max_tokens": meta.get("max_tokens"),
            "mode": meta.get("mode"),
        },
        "roots": g.roots(),
        "turns": turns,
        "sequences": g.sequences() if g.nodes else [],
        "findings": findings,
    }


def live_detail(s: CaptureSession) -> dict:
    return {
        **s.summary(),
        "findings": [f.model_dump() for f in s.findings],
        "calls": [
            {
                "index": t.index,
                "parent": t.parent,
                "relation": t.relation,
                "role": t.role,
                "discarded": t.discarded,
                "prompt_tokens": t.prompt_len,
                "completion_tokens": len(t.completion_token_ids),
                "finish_reason": t.finish_reason,
                "wall_s": t.wall_s,
            }
            for t in s.turns
        ],
    }


def stored_detail(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("turns", "sequences")} | {
        "calls": [{k: t[k] for k in ("index", "parent", "relation", "finish_reason")} for t in doc["turns"]]
    }
