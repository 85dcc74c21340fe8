"""A session as a document: every turn with its own ids and logprobs, provenance, the graph's sequences and masks.

A live session is exported from memory (its discards and roles provisional until it closes); one that is gone from
memory is read back from the durable store, so a closed session's document is the same before and after a restart.
"""

from __future__ import annotations

from swe_gym_env.server.capture.dialect import decoded_tool_calls
from swe_gym_env.server.capture.graph import RolloutGraph, Segment
from swe_gym_env.server.capture.session import CaptureSession
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.wire import Turn


def apply_graph(g: RolloutGraph, turns: list, demoted: set[int] | list[int]) -> list[Segment]:
    """Discards, roles and training sequences from the graph, written onto the turns (models or dicts)."""
    g.finalize(demoted)
    for turn, node in zip(turns, g.nodes, strict=True):
        fields = {"discarded": node.discarded, "role": node.role}
        if isinstance(turn, dict):
            turn.update(fields)
        else:
            turn.discarded, turn.role = node.discarded, node.role
    return g.segments()


def export_live(s: CaptureSession) -> dict:
    if not s.closed and s.turns:  # provisional discards and roles (final when it closes)
        apply_graph(s.graph, s.turns, s.demoted)
    turns = [t.model_dump() for t in s.turns]
    state = "closed" if s.closed else "open"
    findings = [f.model_dump() for f in s.findings]
    return document(s.id, state, s.meta(), turns, s.graph, findings, s.stop_reason)


def export_stored(store: CaptureStore | None, session_id: str) -> dict | None:
    if store is None:
        return None
    data = store.load_session(session_id)
    if data is None:
        return None
    g = RolloutGraph()
    linked = []  # what linking found; a closed session's stored findings hold it already
    turns = []
    for c in data["calls"]:
        linked += [f.model_dump() for f in g.add(c["prompt_token_ids"], c["completion_token_ids"], c["logprobs"])]
        n = g.nodes[-1]
        turn = {k: v for k, v in c.items() if k != "at"}
        turns.append(Turn(**turn, parent=n.parent, relation=n.relation, retry_of=n.retry_of).model_dump())
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
                "prompt_tokens": len(t.prompt_token_ids),
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
