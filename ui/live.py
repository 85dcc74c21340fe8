"""What the UI reads from the rollout service: live rows, a rollout's turns and result, token text for display."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import lru_cache

from swe_gym_env.server.rollout import RolloutRecord, RolloutService
from swe_gym_env.ui.render import TokenText, esc, variant_badge
from swe_gym_env.wire import RolloutResult, Turn

QUIET_AFTER_S = 60.0  # an agent phase this long without a model call is flagged


def activity(rec: RolloutRecord, in_phase_s: float, now: float) -> str:
    """In words: what this rollout is waiting on. Tells a booting sandbox from an agent that is up but silent."""
    turns = len(rec.session.turns) if rec.session else 0
    last = rec.session.last_call_at if rec.session else None
    if rec.state == "queued":
        return f"queued for a {rec.request.sandbox} slot"
    if rec.phase == "boot":
        return f"sandbox still booting ({in_phase_s:.0f}s)"
    if rec.phase == "agent" and turns == 0:
        return f"agent up, no model call yet ({in_phase_s:.0f}s)"
    if rec.phase == "agent" and last is not None:
        quiet = now - last
        if quiet >= QUIET_AFTER_S:
            return f"agent up but not calling the model for {quiet:.0f}s"
        return f"agent calling the model (last call {quiet:.1f}s ago)"
    if rec.phase == "grade":
        return f"grading ({in_phase_s:.0f}s)"
    return f"{rec.phase} ({in_phase_s:.0f}s)"


def live_records(service: RolloutService) -> list[RolloutRecord]:
    return service.live()


def live_table_html(service: RolloutService) -> str:
    now = time.time()
    recs = live_records(service)
    if not recs:
        return '<div class="sg-empty" id="live-empty">no rollouts in flight</div>'
    rows = []
    for rec in recs:
        s = rec.summary()
        since = "—" if s.seconds_since_last_call is None else f"{s.seconds_since_last_call:.1f}s"
        what = activity(rec, now - rec.phase_since, now)
        rows.append(
            f'<tr data-rollout="{esc(rec.rollout_id, 64)}" data-variant="{esc(rec.request.variant, 20)}">'
            f"<td><code>{esc(rec.rollout_id, 64)}</code></td>"
            f"<td>{esc(s.instance_id or rec.request.instance_id or '', 200)}{variant_badge(rec.request.variant)}</td>"
            f"<td>{esc(s.harness, 40)}</td>"
            f"<td>{esc(s.sandbox, 40)}</td><td>{esc(s.phase, 20)}</td><td>{s.turns}</td><td>{s.roots}</td>"
            f"<td>{since}</td><td>{esc(what, 200)}</td></tr>"
        )
    return (
        '<table class="sg-table" id="live-table"><tr><th>rollout</th><th>task</th><th>harness</th><th>sandbox</th>'
        "<th>phase</th><th>turns</th><th>roots</th><th>since last call</th><th>state</th></tr>"
        + "".join(rows)
        + "</table>"
    )


@dataclass
class Snapshot:
    """One rollout as the panel draws it: live (turns so far) or finished (the result)."""

    rollout_id: str
    rec: RolloutRecord | None
    result: RolloutResult | None
    turns: list[Turn]
    events: list[tuple[float, str]] = field(default_factory=list)


_FINISHED: OrderedDict[str, RolloutResult] = OrderedDict()
FINISHED_CACHE = 4  # finished results kept for paging through them, without their prompt ids (the UI shows lengths)


def _finished(service: RolloutService, rollout_id: str) -> RolloutResult | None:
    if (hit := _FINISHED.get(rollout_id)) is not None:
        _FINISHED.move_to_end(rollout_id)
        return hit
    status = service.get(rollout_id)
    if status is None or status.result is None:
        return None
    r = status.result
    light = [t.model_copy(update={"prompt_new_ids": [], "prompt_token_ids": None}) for t in r.turns]
    _FINISHED[rollout_id] = r = r.model_copy(update={"turns": light})
    while len(_FINISHED) > FINISHED_CACHE:
        _FINISHED.popitem(last=False)
    return r


def snapshot(service: RolloutService, rollout_id: str, events: list[tuple[float, str]]) -> Snapshot | None:
    rec = service.record(rollout_id)
    if rec is not None and rec.result is None:
        turns = list(rec.session.turns) if rec.session else []
        return Snapshot(rollout_id, rec, None, turns, events)
    result = rec.result if rec is not None and rec.result is not None else _finished(service, rollout_id)
    if result is None:
        return None
    return Snapshot(rollout_id, rec, result, list(result.turns), events)


def status_html(snap: Snapshot) -> str:
    """The panel's status line: running (phase, calls so far) or finished, and the variant's mark."""
    if snap.result is not None:
        r = snap.result
        return (
            f'<div id="run-state" data-state="finished" data-rollout="{esc(r.rollout_id, 64)}" '
            f'data-variant="{esc(r.variant, 20)}">rollout <code>{esc(r.rollout_id, 64)}</code> '
            f"finished · {len(r.turns)} calls {variant_badge(r.variant)}</div>"
        )
    rec = snap.rec
    assert rec is not None
    return (
        f'<div id="run-state" data-state="{rec.state}" data-rollout="{esc(rec.rollout_id, 64)}" '
        f'data-turns="{len(snap.turns)}" data-variant="{esc(rec.request.variant, 20)}">rollout '
        f"<code>{esc(rec.rollout_id, 64)}</code> · {rec.state} · phase {rec.phase} · "
        f"<span id='turn-count'>{len(snap.turns)}</span> calls so far {variant_badge(rec.request.variant)}</div>"
    )


POKE = "\x00poke"  # put on a watcher's queue to redraw now (the page moved); never a progress line


@dataclass
class View:
    """What one browser tab's panel shows (its page of calls, the selected call), and while a rollout runs, the
    watcher that draws it: the one writer of the panel's outputs then, woken through ``wake`` when the page moves."""

    rollout_id: str = ""
    page: int = 0
    follow: bool = True  # while the rollout runs, show the page with the newest calls
    selected: int | None = None
    generation: int = 0  # bumped by each open: an older watcher of this panel stops
    wake: asyncio.Queue[str] | None = None

    def open(self, rollout_id: str) -> int:
        self.rollout_id, self.page, self.follow, self.selected = rollout_id, 0, True, None
        self.generation += 1
        return self.generation

    def poke(self) -> bool:
        """Ask the live watcher to redraw; False when none is watching."""
        if self.wake is None:
            return False
        self.wake.put_nowait(POKE)
        return True


VIEWS_KEPT = 512
_VIEWS: OrderedDict[tuple[str, str], View] = OrderedDict()


def view_for(session: str | None, panel: str) -> View:
    """The view of one panel in one browser session (the newest ``VIEWS_KEPT`` are kept)."""
    key = (session or "", panel)
    view = _VIEWS.get(key)
    if view is None:
        view = _VIEWS[key] = View()
        while len(_VIEWS) > VIEWS_KEPT:
            _VIEWS.popitem(last=False)
    _VIEWS.move_to_end(key)
    return view


def _note(events: list[tuple[float, str]], message: str) -> None:
    if message != POKE:
        events.append((time.time(), message))


async def follow(
    service: RolloutService,
    rec: RolloutRecord,
    events: list[tuple[float, str]],
    tick_s: float = 1.0,
    view: View | None = None,
) -> AsyncIterator[None]:
    """Yield whenever progress lands on a running rollout (phases, model calls), when ``view`` is poked, and at
    least every ``tick_s``."""
    if rec.task is None or rec.task.done():
        return
    with service.subscribe(rec) as queue:
        if view is not None:
            view.wake = queue
        try:
            while not rec.task.done():
                with contextlib.suppress(TimeoutError):
                    _note(events, await asyncio.wait_for(queue.get(), tick_s))
                while not queue.empty():
                    _note(events, queue.get_nowait())
                yield
            while not queue.empty():
                _note(events, queue.get_nowait())
        finally:
            if view is not None and view.wake is queue:
                view.wake = None


@lru_cache(maxsize=1)
def _local_tokenizer():
    from tokenizers import Tokenizer

    from swe_gym_env.core.assets import tokenizer_file

    return Tokenizer.from_file(str(tokenizer_file()))


def model_names(turns: list[Turn]) -> set[str]:
    """The models a rollout's calls named: each call's request params (compact turns carry them only where they
    change; the full form has the whole request)."""
    names = set()
    for t in turns:
        params = t.params if t.params is not None else t.request
        if params is not None:
            names.add(str(params.get("model", "")).lower())
    return names


def token_text_for(turns: list[Turn]) -> TokenText | None:
    """Token strings for display only, when the rollout's model uses the tokenizer this server ships (SmolLM2);
    otherwise the heatmap shows ids. Training never uses these strings."""
    models = model_names(turns)
    if not models or not all("smollm2" in m for m in models):
        return None
    try:
        tok = _local_tokenizer()
    except Exception:  # no tokenizer prepared: ids only
        return None
    return lambda tid: tok.decode([tid], skip_special_tokens=False)
