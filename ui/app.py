"""The Gradio Blocks: Live, Run, Rollout, Tasks and History views over the server's own rollout service.

The UI reads the same `RolloutService` and catalog the MCP tools use; starting a rollout goes through
`service.submit`, so a UI run shows up over MCP and an MCP run shows up here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import gradio as gr
from pydantic import ValidationError

from swe_gym_env.server.agents.registry import HARNESSES
from swe_gym_env.server.rollout import RolloutService
from swe_gym_env.server.sandbox.registry import BACKENDS
from swe_gym_env.tasks.catalog import TaskNotFound, split_names, tasks_in
from swe_gym_env.ui import render
from swe_gym_env.ui.guard import ui_read_refusal, ui_start_refusal
from swe_gym_env.ui.live import (
    Snapshot,
    View,
    follow,
    live_table_html,
    snapshot,
    status_html,
    token_text_for,
    view_for,
)
from swe_gym_env.wire import AUTO_SANDBOX, RolloutRequest

TASK_CHOICES = 500  # task ids offered in the Run view's dropdown (any id can be typed)
TOKEN_HEADERS = ["call", "position", "token id", "token", "logprob"]
HISTORY_HEADERS = ["rollout", "task", "variant", "harness", "sandbox", "ok", "reward", "turns", "phase", "error"]
VARIANT_LABEL = {"impossible": "impossible variant"}  # the History column (the original task: blank)
TASK_HEADERS = ["instance_id", "repo", "FAIL_TO_PASS", "PASS_TO_PASS", "problem"]


def _task_ids(split: str) -> list[str]:
    try:
        return [t.instance_id for t in tasks_in(split)[:TASK_CHOICES]]
    except (TaskNotFound, ValueError, OSError):
        return []


async def _banner_html() -> str:
    """What this server runs on: the engine when it is the built-in one (NOT a model), and each sandbox backend's
    probe (usable or why not) with the one `auto` picks, or what to configure when none is usable."""
    from swe_gym_env.server.engine.builtin import builtin_engine
    from swe_gym_env.server.sandbox.errors import SandboxUnavailable
    from swe_gym_env.server.sandbox.preflight import default_sandbox, probe_all
    from swe_gym_env.server.security import lock_reason

    out = []
    if (why := lock_reason()) is not None:  # an exposed server with no secret: say which one to set
        out.append(f'<div class="sg-error" id="access-banner"><b>{render.esc(why, 1000)}</b></div>')
    if (engine := builtin_engine()) is not None:
        out.append(f'<div class="sg-error" id="engine-banner"><b>Engine: {render.esc(engine["note"], 1000)}</b></div>')
    found = await probe_all()
    rows = "".join(
        f'<li data-sandbox="{render.esc(n, 40)}" data-usable="{str(r["usable"]).lower()}"><code>{render.esc(n, 40)}'
        f"</code> {'usable' if r['usable'] else 'not usable'}: {render.esc(r['reason'], 600)}</li>"
        for n, r in found.items()
    )
    try:
        default = (
            f"a rollout with sandbox <code>auto</code> runs on <code>{render.esc(default_sandbox(found), 40)}</code>"
        )
    except SandboxUnavailable as e:
        default = f'<span class="sg-error">{render.esc(e, 2000)}</span>'
    out.append(f'<div id="sandbox-banner">Sandboxes here (probed on this server): {default}<ul>{rows}</ul></div>')
    return "".join(out)


class Panel:
    """One rollout's views (used by Run and by Rollout): status, timeline, result, conversation, tokens, graph.

    The conversation, heatmap, token table and graph draw one page of calls (`render.PAGE_CALLS`); earlier / later /
    go-to-call move the page (`live.View`). While a rollout runs the panel follows its newest page and redraws only
    when something on it changed; Gradio sends each update as its difference from the last (a new call appended),
    so an update costs the same at call 80 as at call 2."""

    def __init__(self, prefix: str, service: RolloutService, tokens: list[Any]) -> None:
        """``tokens``: the two text boxes a viewer may have typed the access token in (the page's and the Run
        view's): paging shows calls only to a request carrying the token itself, whatever Gradio session it names."""
        self.prefix = prefix
        self.service = service
        self.status = gr.HTML(elem_id=f"{prefix}-status")
        with gr.Row():
            with gr.Column(scale=1):
                gr.Markdown("#### Phase timeline")
                self.timeline = gr.HTML(elem_id=f"{prefix}-timeline")
            with gr.Column(scale=2):
                self.result = gr.HTML(elem_id=f"{prefix}-result")
        with gr.Row():
            self.prev = gr.Button("◀ earlier calls", size="sm", elem_id=f"{prefix}-prev", scale=0, min_width=140)
            self.pager = gr.HTML(elem_id=f"{prefix}-pager")
            self.next = gr.Button("later calls ▶", size="sm", elem_id=f"{prefix}-next", scale=0, min_width=140)
            self.call = gr.Number(
                None,
                label="go to call (Enter)",
                precision=0,
                minimum=1,
                elem_id=f"{prefix}-call",
                scale=0,
                min_width=140,
            )
        with gr.Tabs():
            with gr.Tab("Conversation"):
                self.conversation = gr.HTML(elem_id=f"{prefix}-conversation")
            with gr.Tab("Tokens"):
                self.heatmap = gr.HTML(elem_id=f"{prefix}-heatmap")
                self.tokens = gr.Dataframe(headers=TOKEN_HEADERS, interactive=False, elem_id=f"{prefix}-tokens")
            with gr.Tab("Graph"):
                self.graph = gr.HTML(elem_id=f"{prefix}-graph")
            with gr.Tab("Grading"):
                self.grading = gr.HTML(elem_id=f"{prefix}-grading")
                self.timings = gr.HTML(elem_id=f"{prefix}-timings")

        def refused(request: gr.Request, access: str | None, run_token: str | None) -> tuple | None:
            """A paging request must carry the token itself: a Gradio session id alone (which a stranger may
            name) shows nothing."""
            if (why := ui_read_refusal(request, access, run_token, what="UI paging")) is None:
                return None
            return (f'<div class="sg-error" id="{prefix}-refused">{render.esc(why, 500)}</div>', *[gr.skip()] * 4)

        async def earlier(access: str, run_token: str, request: gr.Request) -> tuple:
            if (no := refused(request, access, run_token)) is not None:
                return no
            return self.move(view_for(request.session_hash, prefix), delta=-1)

        async def later(access: str, run_token: str, request: gr.Request) -> tuple:
            if (no := refused(request, access, run_token)) is not None:
                return no
            return self.move(view_for(request.session_hash, prefix), delta=1)

        async def go_to(call: float | None, access: str, run_token: str, request: gr.Request) -> tuple:
            if (no := refused(request, access, run_token)) is not None:
                return no
            return self.move(view_for(request.session_hash, prefix), call=int(call) if call else None)

        for button, fn in ((self.prev, earlier), (self.next, later)):
            button.click(fn, tokens, self.page_outputs, show_progress="hidden", api_visibility="private")
        self.call.submit(
            go_to, [self.call, *tokens], self.page_outputs, show_progress="hidden", api_visibility="private"
        )

    @property
    def outputs(self) -> list[Any]:
        return [self.status, self.timeline, self.result, *self.page_outputs, self.grading, self.timings]

    @property
    def page_outputs(self) -> list[Any]:
        return [self.pager, self.conversation, self.heatmap, self.tokens, self.graph]

    @staticmethod
    def message(text: str) -> tuple:
        return (f'<div class="sg-error" id="panel-message">{render.esc(text, 2000)}</div>', *[gr.skip()] * 9)

    @staticmethod
    def page_values(snap: Snapshot, view: View) -> list[object]:
        """The pager, conversation, heatmap, token rows and graph of the view's page of calls."""
        n = len(snap.turns)
        running = snap.result is None
        if running and view.follow:
            view.page = n  # clamped to the last page
        view.page, start, stop = render.page_bounds(n, view.page)
        text = token_text_for(snap.turns)
        return [
            render.pager_html(n, view.page, following=running and view.follow),
            render.conversation_html(snap.turns, start, stop, view.selected),
            render.heatmap_html(snap.turns, text, start, stop),
            render.token_rows(snap.turns, text, start=start, stop=stop),
            render.graph_svg(snap.turns, start, stop, view.selected),
        ]

    @classmethod
    def draw(cls, snap: Snapshot, view: View) -> list[object]:
        """Every output of the panel, the calls of the view's page only."""
        r = snap.result
        return [
            status_html(snap),
            render.timeline_html(snap.events) if r is None else render.phase_timeline_html(r, snap.events),
            render.result_html(r) if r is not None else '<div class="sg-empty">running…</div>',
            *cls.page_values(snap, view),
            render.grading_html(r.grading, r.findings, r.variant)
            if r is not None
            else '<div class="sg-empty">not graded yet</div>',
            render.timings_html(r.timings, r.wall_s) if r is not None else "",
        ]

    def move(self, view: View, delta: int = 0, call: int | None = None) -> tuple:
        """Another page of the rollout this panel shows: ``delta`` pages on, or the page holding call ``call``.
        While the rollout runs its watcher draws the page (it is the one writer of the panel's outputs, whose
        updates Gradio sends as differences from the last); once it is finished, this draws it."""
        snap = snapshot(self.service, view.rollout_id, []) if view.rollout_id else None
        if snap is None:
            return tuple(gr.skip() for _ in self.page_outputs)
        n = len(snap.turns)
        if call is not None:
            view.selected = max(0, min(call, n) - 1)
            view.page = view.selected // render.PAGE_CALLS
        else:
            view.page = render.page_bounds(n, view.page + delta)[0]
        view.follow = snap.result is None and view.page == render.page_bounds(n, n)[0]  # newest page: follow it
        if snap.result is None and view.poke():
            return tuple(gr.skip() for _ in self.page_outputs)
        return tuple(self.page_values(snap, view))


async def _watch(service: RolloutService, rollout_id: str, events: list[tuple[float, str]], view: View):
    """Draw a rollout now, then again each time progress lands or the page moves, until it is finished. Each
    update draws one page of calls, and is sent only when something on it changed (Gradio sends a generator's
    updates as differences from the previous one: an unchanged output costs nothing, a new call is appended)."""
    mine = view.open(rollout_id)
    snap = snapshot(service, rollout_id, events)
    if snap is None:
        yield Panel.message(f"no rollout {rollout_id!r} on this server")
        return
    view.follow = snap.result is None
    last = Panel.draw(snap, view)
    yield tuple(last)
    if snap.rec is not None and snap.result is None:
        async for _ in follow(service, snap.rec, events, view=view):
            if view.generation != mine:
                return  # this panel has moved on to another rollout
            if (snap := snapshot(service, rollout_id, events)) is not None:
                out = Panel.draw(snap, view)
                if out != last:
                    last = out
                    yield tuple(out)
        if view.generation == mine and (snap := snapshot(service, rollout_id, events)) is not None:
            yield tuple(Panel.draw(snap, view))


class _RolloutTab(NamedTuple):
    """What other tabs use of the Rollout tab: its id box, its panel, and how it shows a rollout."""

    rid: gr.Textbox
    panel: Panel
    show: Callable


def build_ui(service: RolloutService) -> gr.Blocks:
    """The Blocks: a banner and an access token, then one tab per panel (`_live_tab`, `_run_tab`, `_rollout_tab`,
    `_tasks_tab`, `_history_tab`), and a rollout opened from the page's address."""
    splits = split_names()
    # The UI takes no files (server/ui: uploads refused); Gradio's cache is emptied of anything older than an hour.
    with gr.Blocks(title="swe_gym_env", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        gr.Markdown("## swe_gym_env — rollouts")
        banner = gr.HTML(elem_id="server-banner")
        demo.load(_banner_html, outputs=banner, api_visibility="private")
        access = gr.Textbox(
            label="access token (to see rollouts, when the server has one)",
            type="password",
            elem_id="access-token",
        )
        with gr.Tabs(selected="live") as tabs:
            with gr.Tab("Live", id="live"):
                _live_tab(demo, service, access)
            with gr.Tab("Run", id="run"):
                token = _run_tab(service, splits, access)
            with gr.Tab("Rollout", id="rollout"):
                rollout = _rollout_tab(service, access, token)
            with gr.Tab("Tasks", id="tasks"):
                _tasks_tab(demo, splits)
            with gr.Tab("History", id="history"):
                _history_tab(demo, service, access, tabs, rollout)
        _open_from_address(demo, service, tabs, rollout)
    return demo


def _live_tab(demo: gr.Blocks, service: RolloutService, access: gr.Textbox) -> None:
    gr.Markdown("Every rollout in flight on this server, whoever started it (UI, MCP, WebSocket).")
    live = gr.HTML(elem_id="live")

    def live_view(token: str, request: gr.Request) -> str:
        if (why := ui_read_refusal(request, token, what=None)) is not None:  # every second: not logged
            return f'<div class="sg-error" id="live-refused">{render.esc(why, 500)}</div>'
        return live_table_html(service)

    gr.Timer(1.0).tick(live_view, inputs=access, outputs=live, show_progress="hidden", api_visibility="private")
    demo.load(live_view, inputs=access, outputs=live, api_visibility="private")


def _run_tab(service: RolloutService, splits: list[str], access: gr.Textbox) -> gr.Textbox:
    """The Run tab; returns its token box (the Rollout tab's panel reads it too)."""
    with gr.Row():
        split = gr.Dropdown(splits, value=splits[0], label="dataset split", elem_id="run-split")
        ids = _task_ids(splits[0])
        task = gr.Dropdown(
            ids, value=ids[0] if ids else None, label="task", allow_custom_value=True, elem_id="run-task"
        )
        fields = RolloutRequest.model_fields
        harness = gr.Dropdown(sorted(HARNESSES), value=fields["harness"].default, label="harness")
        sandbox = gr.Dropdown(
            [AUTO_SANDBOX, *sorted(BACKENDS)],
            value=fields["sandbox"].default,
            label="sandbox",
            elem_id="run-sandbox",
        )
        engines = sorted(service.config.engines)
        engine = gr.Dropdown(engines, value=engines[0] if engines else None, label="engine")
    with gr.Row():
        max_calls = gr.Number(30, minimum=1, maximum=500, precision=0, label="max model calls")
        token = gr.Textbox(
            label="access token (needed when the server has one)",
            type="password",
            elem_id="run-token",
        )
        go = gr.Button("Run", variant="primary", elem_id="run-button")
    run_panel = Panel("run", service, [access, token])
    split.change(
        lambda s: gr.update(choices=_task_ids(s), value=(_task_ids(s) or [None])[0]),
        split,
        task,
        api_visibility="private",
    )

    async def start_run(split, instance_id, harness, sandbox, engine, max_calls, token, request: gr.Request):
        why = ui_start_refusal(request, token)
        if why is not None:
            yield Panel.message(why)
            return
        try:
            req = RolloutRequest(
                split=split,
                instance_id=instance_id or None,
                harness=harness,
                sandbox=sandbox,
                engine=engine or "default",
                max_model_calls=int(max_calls or 30),
            )
        except (ValidationError, ValueError, TypeError) as e:
            yield Panel.message(f"invalid request: {e}")
            return
        rec = service.submit(req)
        events = [(time.time(), f"submitted rollout {rec.rollout_id}")]
        async for out in _watch(service, rec.rollout_id, events, view_for(request.session_hash, "run")):
            yield out

    go.click(
        start_run,
        [split, task, harness, sandbox, engine, max_calls, token],
        run_panel.outputs,
        api_name="start_run",
        concurrency_limit=None,
        show_progress="hidden",
    )
    return token


def _rollout_tab(service: RolloutService, access: gr.Textbox, token: gr.Textbox) -> _RolloutTab:
    with gr.Row():
        rid = gr.Textbox(label="rollout id", elem_id="rollout-id")
        show = gr.Button("Show", elem_id="rollout-show")
    panel = Panel("rollout", service, [access, token])

    async def show_rollout(rollout_id: str, token: str, request: gr.Request):
        rollout_id = (rollout_id or "").strip()
        if not rollout_id:
            yield tuple(gr.skip() for _ in panel.outputs)
            return
        if (why := ui_read_refusal(request, token)) is not None:
            yield Panel.message(why)
            return
        events = [(time.time(), f"watching {rollout_id}")]
        async for out in _watch(service, rollout_id, events, view_for(request.session_hash, "rollout")):
            yield out

    for trigger in (show.click, rid.submit):
        trigger(
            show_rollout,
            [rid, access],
            panel.outputs,
            concurrency_limit=None,
            show_progress="hidden",
            api_visibility="private",
        )
    return _RolloutTab(rid, panel, show_rollout)


def _tasks_tab(demo: gr.Blocks, splits: list[str]) -> None:
    with gr.Row():
        t_split = gr.Dropdown(splits, value=splits[0], label="split")
        query = gr.Textbox(label="search (id, repo, problem text)", elem_id="task-search")
    t_table = gr.Dataframe(headers=TASK_HEADERS, interactive=False, elem_id="task-table")
    t_detail = gr.HTML(elem_id="task-detail")

    def find_tasks(s: str, q: str) -> tuple[list[list], str]:
        try:
            tasks = tasks_in(s)
        except (TaskNotFound, ValueError, OSError) as e:
            return [], f'<div class="sg-error">{render.esc(e)}</div>'
        q = (q or "").lower().strip()
        hits = [
            t
            for t in tasks
            if not q or q in t.instance_id.lower() or q in t.repo.lower() or q in t.problem_statement.lower()
        ][:200]
        rows = [
            [t.instance_id, t.repo, len(t.FAIL_TO_PASS), len(t.PASS_TO_PASS), t.problem_statement[:120]] for t in hits
        ]
        return rows, f"<div>{len(hits)} of {len(tasks)} tasks</div>"

    def task_detail(s: str, evt: gr.SelectData) -> str:
        row = evt.row_value or []
        try:
            t = next(t for t in tasks_in(s) if row and t.instance_id == row[0]).view()
        except (StopIteration, TaskNotFound, ValueError):
            return ""
        return (
            f"<h4>{render.esc(t.instance_id, 200)}</h4><div>{render.esc(t.repo, 200)} @ "
            f"<code>{render.esc(t.base_commit, 40)}</code></div>"
            f'<pre class="sg-pre">{render.esc(t.problem_statement)}</pre>'
            f"<div>FAIL_TO_PASS: {render.esc(', '.join(t.FAIL_TO_PASS), 4000)}</div>"
            f"<div>PASS_TO_PASS: {len(t.PASS_TO_PASS)} tests</div>"
        )

    for trigger in (t_split.change, query.change):
        trigger(find_tasks, [t_split, query], [t_table, t_detail], api_visibility="private")
    t_table.select(task_detail, t_split, t_detail, api_visibility="private")
    demo.load(find_tasks, [t_split, query], [t_table, t_detail], api_visibility="private")


def _history_tab(
    demo: gr.Blocks, service: RolloutService, access: gr.Textbox, tabs: gr.Tabs, rollout: _RolloutTab
) -> None:
    refresh = gr.Button("Refresh", elem_id="history-refresh")
    h_table = gr.Dataframe(headers=HISTORY_HEADERS, interactive=False, elem_id="history-table")

    def history(token: str, request: gr.Request) -> list[list]:
        if ui_read_refusal(request, token) is not None:
            return []
        return [
            [
                s.rollout_id,
                s.instance_id,
                VARIANT_LABEL.get(s.variant, ""),
                s.harness,
                s.sandbox,
                s.ok,
                s.reward,
                s.turns,
                s.phase,
                render.redact((s.error or "")[:200]),
            ]
            for s in service.list(500)
            if s.state == "finished"
        ]

    def open_rollout(evt: gr.SelectData):
        row = evt.row_value or []
        return (row[0] if row else ""), gr.Tabs(selected="rollout")

    refresh.click(history, access, h_table, api_visibility="private")
    demo.load(history, access, h_table, api_visibility="private")
    h_table.select(open_rollout, None, [rollout.rid, tabs], api_visibility="private").then(
        rollout.show, [rollout.rid, access], rollout.panel.outputs, concurrency_limit=None, api_visibility="private"
    )


def _open_from_address(demo: gr.Blocks, service: RolloutService, tabs: gr.Tabs, rollout: _RolloutTab) -> None:
    async def from_address(request: gr.Request):
        """/web/?rollout=<id> opens that rollout's page (in the page's own load: no second round trip)."""
        wanted = (request.query_params.get("rollout") or "").strip() if request else ""
        if not wanted:
            yield tuple(gr.skip() for _ in range(2 + len(rollout.panel.outputs)))
            return
        if (why := ui_read_refusal(request, None)) is not None:  # the page's load has no token typed yet
            yield (wanted, gr.Tabs(selected="rollout"), *Panel.message(why))
            return
        events = [(time.time(), f"watching {wanted}")]
        async for out in _watch(service, wanted, events, view_for(request.session_hash, "rollout")):
            yield (wanted, gr.Tabs(selected="rollout"), *out)

    demo.load(
        from_address,
        None,
        [rollout.rid, tabs, *rollout.panel.outputs],
        concurrency_limit=None,
        show_progress="hidden",
        api_visibility="private",
    )
