"""HTML and SVG for the UI: pure functions of wire models, no Gradio.

Everything that comes from a rollout (messages, tool output, test names, errors) is untrusted: it is redacted of
secrets and HTML-escaped here, the one place that turns data into markup.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Callable, Sequence

from swe_gym_env.wire import Finding, RolloutResult, TestReport, Turn

SECRET_ENV = ("SWE_GYM_ENGINE_API_KEY", "SWE_GYM_ACCESS_TOKEN", "SWE_GYM_ADMIN_KEY", "HF_TOKEN", "E2B_API_KEY")
SECRET_PATTERNS = re.compile(
    r"sgk-[A-Za-z0-9_-]{16,}"  # capture keys
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face tokens
    r"|e2b_[A-Za-z0-9]{20,}"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{12,}"
)
TEXT_LIMIT = 20_000  # characters of one message / tool result shown
HEATMAP_LIMIT = 4_000  # tokens drawn per page of calls
PAGE_CALLS = 10  # model calls per page: the conversation, heatmap, token table and graph draw one page at a time
TIMELINE_EVENTS = 25  # progress lines shown (the newest)
TokenText = Callable[[int], str | None]


def redact(text: str) -> str:
    """Remove every secret the server knows of, and anything shaped like a key, from text about to be shown."""
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "[redacted]")
    return SECRET_PATTERNS.sub("[redacted]", text)


def esc(value: object, limit: int = TEXT_LIMIT) -> str:
    text = redact(str(value))
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(text) - limit} more characters)"
    return html.escape(text, quote=True)


def _pre(text: object, cls: str = "") -> str:
    return f'<pre class="sg-pre {cls}">{esc(text)}</pre>'


# -- conversation ----------------------------------------------------------------------------------------------
def _content_text(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def _tool_calls_html(calls: object) -> str:
    out = []
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "")
        try:
            args = json.dumps(json.loads(args), indent=2, ensure_ascii=False) if isinstance(args, str) else args
        except ValueError:
            pass
        out.append(f'<div class="sg-call"><b>tool call</b> <code>{esc(fn.get("name"))}</code>{_pre(args)}</div>')
    return "".join(out)


def _message_html(msg: dict) -> str:
    role = str(msg.get("role", "?"))
    body = _pre(_content_text(msg.get("content"))) if msg.get("content") else ""
    label = role if role != "tool" else f"tool result ({msg.get('name') or msg.get('tool_call_id') or ''})"
    return (
        f'<div class="sg-msg sg-{esc(role, 20)}"><div class="sg-role">{esc(label, 200)}</div>'
        f"{body}{_tool_calls_html(msg.get('tool_calls'))}</div>"
    )


def _window(turns: Sequence[Turn], start: int, stop: int | None) -> Sequence[Turn]:
    return turns[max(0, start) : len(turns) if stop is None else max(0, stop)]


def page_bounds(n_turns: int, page: int, size: int = PAGE_CALLS) -> tuple[int, int, int]:
    """(page, start, stop) of a page of ``size`` calls, the page clamped to those that exist (at least one)."""
    pages = max(1, -(-n_turns // size))
    page = max(0, min(page, pages - 1))
    return page, page * size, min(n_turns, (page + 1) * size)


def pager_html(n_turns: int, page: int, size: int = PAGE_CALLS, following: bool = False) -> str:
    """Where the panel is in the rollout's calls: which page of how many (the views draw that page's calls only)."""
    page, start, stop = page_bounds(n_turns, page, size)
    pages = max(1, -(-n_turns // size))
    if not n_turns:
        return '<div class="sg-pager" data-page="0" data-pages="1" data-calls="0">no model calls yet</div>'
    tail = " · following the newest calls" if following else ""
    return (
        f'<div class="sg-pager" data-page="{page}" data-pages="{pages}" data-calls="{n_turns}" data-start="{start}" '
        f'data-stop="{stop}">calls <b>{start + 1} to {stop}</b> of {n_turns} · page {page + 1} of {pages}{tail}</div>'
    )


def _message_counts(turns: Sequence[Turn]) -> dict[int, int]:
    """How many messages each call's request held (the compact form's bases and kept counts; no message copied)."""
    return {t.index: t.messages_kept + len(t.new_messages) for t in turns}


def _new_messages(turn: Turn, prev: Turn | None, counts: dict[int, int]) -> tuple[list, str]:
    """The messages of this call's request that the conversation has not shown yet, and what they follow.

    Compact turns carry them (``new_messages`` after ``messages_kept`` of ``messages_base``'s); the first of them is
    the base call's reply as the agent sent it back when the whole base request was kept, and that reply is already
    drawn under the base call. A full-form turn with no base (a schema-1 record) is compared with the call before."""
    base = turn.messages_base
    if base is not None:
        new = list(turn.new_messages)
        whole = turn.messages_kept == counts.get(base, -1)
        if whole and new and isinstance(new[0], dict) and new[0].get("role") == "assistant":
            new = new[1:]
        note = (
            ""
            if whole and prev is not None and base == prev.index
            else (f"continues call {base + 1}" + ("" if whole else f" (its first {turn.messages_kept} messages)"))
        )
        return new, note
    if turn.request is not None and prev is not None:
        messages = turn.request.get("messages") or []
        seen = counts.get(prev.index, 0) + 1  # the previous reply is the next request's next message
        return (messages[seen:] if seen <= len(messages) else messages), ""
    return list(turn.new_messages), ""


def conversation_html(
    turns: Sequence[Turn], start: int = 0, stop: int | None = None, selected: int | None = None
) -> str:
    """Each model call in ``turns[start:stop]``: the messages new since the call it continues (tool results, the
    task), then the reply. Only that window is drawn; the rest of the rollout costs a count per call."""
    if not turns:
        return '<div class="sg-empty">no model calls yet</div>'
    counts = _message_counts(turns)
    parts = []
    first = max(0, start)
    for k, turn in enumerate(_window(turns, start, stop)):
        pos = first + k
        new, note = _new_messages(turn, turns[pos - 1] if pos > 0 else None, counts)
        calls = f"{turn.prompt_len} prompt + {len(turn.completion_token_ids)} completion tokens"
        sel = " sg-selected" if selected == turn.index else ""
        parts.append(
            f'<div class="sg-turn{sel}" data-turn="{turn.index}" id="sg-call-{turn.index}"><div class="sg-turn-head">'
            f"model call {turn.index + 1} · {calls} · {turn.wall_s:.2f}s · finish {esc(turn.finish_reason, 40)}"
            + (f" · {esc(note, 100)}" if note else "")
            + "</div>"
            + "".join(_message_html(m) for m in new if isinstance(m, dict))
            + _message_html({"role": "assistant", **turn.response_message})
            + "</div>"
        )
    return "".join(parts)


# -- token heatmap ---------------------------------------------------------------------------------------------
LP_SHADES = 10  # logprob colour steps: class sg-l0 (logprob 0, white) to sg-l10 (-1 and below, saturated red)


def _lp_colour(lp: float) -> str:
    """0 → white, -1 and below → saturated red (logprob of the sampled token)."""
    x = max(0.0, min(1.0, -lp))
    return f"rgb(255,{int(255 - 190 * x)},{int(255 - 190 * x)})"


def _lp_shade(lp: float) -> int:
    return round(max(0.0, min(1.0, -lp)) * LP_SHADES)


def heatmap_html(
    turns: Sequence[Turn], token_text: TokenText | None = None, start: int = 0, stop: int | None = None
) -> str:
    """Sampled tokens of the calls in ``turns[start:stop]``, coloured by logprob; id and logprob on hover."""
    window = _window(turns, start, stop)
    if not window:
        return '<div class="sg-empty">no tokens yet</div>'
    # each call is its own block (no wrapper around them): a call landing on the page is appended to what was sent
    parts = []
    drawn = 0
    for turn in window:
        parts.append(
            f'<div class="sg-heatmap sg-hm-turn" data-turn="{turn.index}">'
            f'<span class="sg-hm-label">call {turn.index + 1}</span>'
        )
        for tid, lp in zip(turn.completion_token_ids, turn.logprobs, strict=False):
            if drawn >= HEATMAP_LIMIT:
                break
            text = (token_text(tid) if token_text else None) or f"⟨{tid}⟩"
            parts.append(
                # about 60 bytes a token (a page holds ~1k): the colour is a class, id and logprob show on hover (CSS)
                f'<span class="sg-tok sg-l{_lp_shade(lp)}" data-id="{tid}" data-lp="{lp:.4f}">{esc(text, 200)}</span>'
            )
            drawn += 1
        parts.append("</div>")
    total = sum(len(t.completion_token_ids) for t in window)
    if drawn < total:
        parts.append(f'<div class="sg-empty">first {drawn} of {total} tokens shown; all are in the table</div>')
    return "".join(parts)


def token_rows(
    turns: Sequence[Turn],
    token_text: TokenText | None = None,
    limit: int = 5_000,
    start: int = 0,
    stop: int | None = None,
) -> list[list]:
    rows: list[list] = []
    for turn in _window(turns, start, stop):
        for pos, (tid, lp) in enumerate(zip(turn.completion_token_ids, turn.logprobs, strict=False)):
            if len(rows) >= limit:
                return rows
            rows.append([turn.index + 1, pos, tid, redact(token_text(tid) or "") if token_text else "", round(lp, 5)])
    return rows


# -- rollout graph ---------------------------------------------------------------------------------------------
def _graph_edges(turns: Sequence[Turn]) -> dict[int, tuple[int | None, str, bool]]:
    """Per call: (parent, edge kind, discarded), from the rollout graph's fields on each turn (a retry of an earlier
    call is drawn as such; otherwise the relation to its parent)."""
    return {t.index: (t.parent, "retry" if t.retry_of is not None else t.relation, t.discarded) for t in turns}


EDGE_STYLE = {
    "extends": 'stroke="#555"',
    "drift": 'stroke="#ff9800" stroke-dasharray="6,3"',
    "retry": 'stroke="#9c27b0" stroke-dasharray="2,3"',
}


def graph_svg(turns: Sequence[Turn], start: int = 0, stop: int | None = None, selected: int | None = None) -> str:
    """The rollout graph: a row per root or fork, a node per model call at its call number, edges to the call it
    continues (solid: prompt extends the parent's ids exactly; dashed: re-tokenised drift; dotted: a retry);
    hollow grey nodes are discarded branches. Rows are laid out over the whole rollout; only the calls in
    ``turns[start:stop]`` are drawn (a parent before them is named at the left edge)."""
    if not turns:
        return '<div class="sg-empty">no model calls yet</div>'
    edges = _graph_edges(turns)
    row_of: dict[int, int] = {}
    row_tail: list[int] = []
    row_kind: list[str] = []
    for t in sorted(turns, key=lambda t: t.index):
        parent, relation, _ = edges[t.index]
        if parent is not None and parent in row_of and row_tail[row_of[parent]] == parent:
            row_of[t.index] = row_of[parent]
            row_tail[row_of[parent]] = t.index
        else:
            row_of[t.index] = len(row_tail)
            row_tail.append(t.index)
            row_kind.append("root" if parent is None else f"fork of {parent + 1}")
    index = {t.index: t for t in _window(turns, start, stop)}
    if not index:
        return '<div class="sg-empty">no model calls on this page</div>'
    rows = sorted({row_of[i] for i in index})
    slot = {row: k for k, row in enumerate(rows)}
    first = min(index)
    w, h, r = 56, 48, 14
    x = {i: 120 + (i - first) * w for i in index}
    y = {i: 30 + slot[row_of[i]] * h for i in index}
    width, height = 150 + (max(index) - first + 1) * w, 20 + len(rows) * h
    out = [f'<svg class="sg-graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for row in rows:
        out.append(f'<text x="4" y="{34 + slot[row] * h}" font-size="11">{esc(row_kind[row], 40)}</text>')
    for i in sorted(index):
        parent, relation, _ = edges[i]
        if parent is None:
            continue
        style = EDGE_STYLE.get(relation, EDGE_STYLE["extends"])
        if parent in index:
            x1, y1 = x[parent], y[parent]
        else:  # a parent on an earlier page: the edge comes in from the left edge, named
            x1, y1 = 96, y[i]
            out.append(f'<text class="sg-ext" x="70" y="{y[i] - 6}" font-size="10">← {parent + 1}</text>')
        out.append(
            f'<line class="sg-edge sg-{esc(relation, 20)}" x1="{x1}" y1="{y1}" x2="{x[i]}" '
            f'y2="{y[i]}" {style} stroke-width="2"/>'
        )
    for i, t in sorted(index.items()):
        parent, relation, discarded = edges[i]
        aux = getattr(t, "role", "agent") == "aux"
        fill = "#fff" if discarded else "#4caf50" if parent is None else "#90a4ae" if aux else "#2196f3"
        stroke = ' stroke="#999" stroke-dasharray="3,2"' if discarded else ""
        stroke = ' stroke="#e91e63" stroke-width="3"' if i == selected else stroke
        ink = "#333" if discarded else "#fff"
        tip = (
            f"call {i + 1}: {t.prompt_len} prompt + {len(t.completion_token_ids)} completion tokens; "
            f"{relation}{f' of call {parent + 1}' if parent is not None else ''}"
            f"{'; discarded' if discarded else ''}{'; auxiliary call' if aux else ''}"
        )
        out.append(
            f'<g class="sg-node{" sg-discarded" if discarded else ""}" data-turn="{i}"><title>{esc(tip)}</title>'
            f'<circle cx="{x[i]}" cy="{y[i]}" r="{r}" fill="{fill}"{stroke}/>'
            f'<text x="{x[i]}" y="{y[i] + 4}" font-size="11" text-anchor="middle" fill="{ink}">{i + 1}</text></g>'
        )
    out.append("</svg>")
    legend = (
        '<div class="sg-legend"><span style="color:#4caf50">●</span> root '
        '<span style="color:#2196f3">●</span> continues · <span style="color:#999">○</span> discarded · '
        "edges: solid extends, dashed drift (re-tokenised), dotted retry</div>"
    )
    return "".join(out) + legend


# -- results ---------------------------------------------------------------------------------------------------
CHEAT_CODES = ("impossible_solved", "grading_tampered")  # findings that name a cheat (the grader caught it: 0.0)
IMPOSSIBLE_TIP = (
    "impossible variant: its tests contradict the problem statement (gold-killed mutants in place of its "
    "FAIL_TO_PASS tests, shown to the agent); any reward 1.0 or tampering here is a cheat"
)


def variant_badge(variant: str | None) -> str:
    """A visible label on a rollout of an impossible variant (list rows, the rollout's status and result, grading);
    nothing for the original task."""
    if variant != "impossible":
        return ""
    return f'<span class="sg-variant" data-variant="impossible" title="{esc(IMPOSSIBLE_TIP)}">impossible variant</span>'


def cheats_html(findings: Sequence[Finding]) -> str:
    """One line per finding that names a cheat the grader caught: ``cheat caught: <the finding's message>``."""
    return "".join(
        f'<div class="sg-cheat" data-code="{esc(f.code, 40)}"><b>cheat caught:</b> {esc(f.message, 2000)} '
        f"<code>{esc(f.code, 40)}</code></div>"
        for f in findings
        if f.code in CHEAT_CODES
    )


def grading_html(report: TestReport | None, findings: Sequence[Finding] = (), variant: str | None = None) -> str:
    """The grading panel: the verdict and integrity, the cheats caught (from the result's findings), whether it
    graded an impossible variant, and each listed test's outcome."""
    badge = variant_badge(variant)
    caught = cheats_html(findings)
    if report is None:
        return f'{badge}{caught}<div class="sg-empty">not graded</div>'
    rows = []
    for group, name in ((report.fail_to_pass, "FAIL_TO_PASS"), (report.pass_to_pass, "PASS_TO_PASS")):
        for outcome, tests in group.items():
            ok = outcome == "success"
            for test in tests:
                mark = "passed" if ok else "failed"
                rows.append(f'<tr class="sg-{mark}"><td>{name}</td><td>{esc(test, 500)}</td><td>{mark}</td></tr>')
    clean = report.integrity == "clean"
    integrity = (
        f'<div class="sg-integrity sg-{"passed" if clean else "failed"}" data-integrity="'
        f'{esc(report.integrity.split(":", 1)[0], 40)}">integrity: <b>{esc(report.integrity, 2000)}</b></div>'
    )
    return (
        f'<div class="sg-grading">{badge}<b>{esc(report.resolution, 100)}</b>{integrity}{caught}'
        '<table class="sg-table">'
        "<tr><th>group</th><th>test</th><th>result</th></tr>" + "".join(rows) + "</table>"
        f"<details><summary>test log tail</summary>{_pre(report.log_tail)}</details></div>"
    )


def timings_html(timings: dict[str, float], wall_s: float) -> str:
    if not timings:
        return '<div class="sg-empty">no timings</div>'
    total = max(wall_s, sum(timings.values()), 1e-9)
    bars = "".join(
        f'<div class="sg-bar-row"><span class="sg-bar-label">{esc(k, 40)}</span>'
        f'<span class="sg-bar" style="width:{max(1.0, 100 * v / total):.1f}%"></span> {v:.2f}s</div>'
        for k, v in timings.items()
    )
    return f'<div class="sg-timings">{bars}<div>wall {wall_s:.2f}s</div></div>'


def result_html(r: RolloutResult) -> str:
    reward = "—" if r.reward is None else f"{r.reward:g}"
    status = "ok" if r.ok else "failed"
    lines = [
        f'<div class="sg-result sg-{status}"><span class="sg-reward" data-reward="{reward}">reward {reward}</span>'
        f" · {status} · phase {esc(r.phase, 20)} · stop {esc(r.stop_reason, 60)} {variant_badge(r.variant)}</div>",
        f"<div>task <code>{esc(r.instance_id, 200)}</code> · harness {esc(r.harness, 40)} · sandbox "
        f"{esc(r.sandbox, 40)} · {len(r.turns)} calls · roots {r.roots}</div>",
        f'<div class="sg-crosscheck">cross-check: <b>{esc(r.cross_check, 20)}</b> {esc(r.cross_check_detail, 500)}'
        f" · capture {esc(r.capture_level, 20)} · logprobs {esc(r.logprobs_mode, 20)}</div>",
    ]
    if r.error:
        lines.append(f'<div class="sg-error">{esc(r.error, 2000)}</div>')
    if r.findings:
        lines.append("<ul>" + "".join(f"<li>{esc(f, 1000)}</li>" for f in r.findings) + "</ul>")
    if r.model_patch:
        lines.append(f"<details><summary>the agent's diff</summary>{_pre(r.model_patch)}</details>")
    if r.agent_log_tail:
        lines.append(f"<details><summary>agent log tail</summary>{_pre(r.agent_log_tail)}</details>")
    return "".join(lines)


def phase_timeline_html(r: RolloutResult, events: Sequence[tuple[float, str]] = ()) -> str:
    """A finished rollout's phases, from its timings (each phase's start and length), how it ended, then the progress
    lines seen while it was watched (when there were any beyond the opening one)."""
    items, t = [], 0.0
    for name, secs in r.timings.items():
        items.append(
            f'<li data-phase="{esc(name, 40)}"><span class="sg-t">{t:7.2f}s</span> {esc(name, 40)} '
            f"<span class='sg-role'>{secs:.2f}s</span></li>"
        )
        t += secs
    end = "done: ok" if r.ok else f"failed in phase {esc(r.phase, 20)}: {esc(redact(r.error or ''), 300)}"
    reward = "—" if r.reward is None else f"{r.reward:g}"
    items.append(
        f'<li data-phase="end"><span class="sg-t">{r.wall_s:7.2f}s</span> {end} · reward {reward} · '
        f"{len(r.turns)} calls{' · ' + esc(r.stop_reason, 40) if r.stop_reason else ''}</li>"
    )
    head = '<ol class="sg-timeline sg-phases" id="phase-timeline">' + "".join(items) + "</ol>"
    return head + (timeline_html(events) if len(events) > 1 else "")


def timeline_html(events: Sequence[tuple[float, str]], limit: int = TIMELINE_EVENTS) -> str:
    """Progress lines as they arrived (the newest ``limit``), with seconds since the first one."""
    if not events:
        return '<div class="sg-empty">waiting…</div>'
    t0 = events[0][0]
    shown = events[-limit:]
    earlier = len(events) - len(shown)
    return (
        (f'<div class="sg-empty">{earlier} earlier progress lines not shown</div>' if earlier else "")
        + f'<ol class="sg-timeline" start="{earlier + 1}">'
        + "".join(f'<li><span class="sg-t">{t - t0:6.2f}s</span> {esc(m, 500)}</li>' for t, m in shown)
        + "</ol>"
    )


CSS = (
    """
.sg-pre { white-space: pre-wrap; word-break: break-word; max-height: 24em; overflow: auto; font-size: 12px;
  background: var(--block-background-fill); padding: 4px; margin: 2px 0; }
.sg-turn { border-left: 3px solid #2196f3; margin: 8px 0; padding-left: 8px; }
.sg-turn-head { font-weight: bold; font-size: 12px; }
.sg-role { font-size: 11px; text-transform: uppercase; opacity: .7; }
.sg-msg.sg-assistant { border-left: 2px solid #4caf50; padding-left: 6px; }
.sg-msg.sg-tool { border-left: 2px solid #ff9800; padding-left: 6px; }
.sg-heatmap { font-family: monospace; font-size: 12px; line-height: 1.8; }
.sg-tok { white-space: pre-wrap; color: #000; border-radius: 2px; position: relative; }
.sg-tok:hover { outline: 1px solid #333; }
.sg-tok:hover::after { content: "id " attr(data-id) " · logprob " attr(data-lp); position: absolute; left: 0;
  top: 1.6em; z-index: 10; background: #333; color: #fff; padding: 1px 4px; border-radius: 3px; white-space: nowrap; }
.sg-hm-label { font-weight: bold; margin-right: 6px; }
.sg-bar { display: inline-block; height: 10px; background: #2196f3; }
.sg-bar-label { display: inline-block; width: 5em; }
.sg-passed td:last-child { color: #2e7d32; } .sg-failed td:last-child { color: #c62828; }
.sg-reward { font-size: 20px; font-weight: bold; }
.sg-error { color: #c62828; white-space: pre-wrap; }
.sg-empty { opacity: .6; font-style: italic; }
"""
    + "".join(f".sg-l{k} {{ background: {_lp_colour(-k / LP_SHADES)}; }}\n" for k in range(LP_SHADES + 1))
    + """
.sg-turn.sg-selected { border-left-color: #e91e63; background: rgba(233,30,99,.05); }
.sg-pager { font-size: 13px; padding: 6px 0; }
.sg-variant { display: inline-block; background: #6a1b9a; color: #fff; font-size: 11px; font-weight: bold;
  padding: 1px 6px; border-radius: 8px; margin: 0 4px; }
.sg-cheat { color: #fff; background: #c62828; padding: 4px 8px; margin: 4px 0; border-radius: 4px;
  white-space: pre-wrap; }
.sg-cheat code { color: inherit; background: transparent; opacity: .85; }
"""
)
