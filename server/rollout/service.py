"""The rollout service: the front door (submit / run / cancel / get / list), a registry of rollouts in flight and
finished, per-backend concurrency with a bounded queue, and progress subscriptions (MCP progress and the UI use the
same `subscribe`).

`run` never raises into its caller: every failure is a result with `ok=False`, the phase it happened in and a
specific error.

Memory: with a results store, a finished rollout leaves the registry at once; its summary is in the store's index and
its result on disk (read back through the store's small cache). Only a result that could not be stored (a full disk:
``ok=False``, an error starting "disk full") stays in memory, at most ``KEEP_UNSTORED`` of them. Without a store (an
in-process pipeline) finished rollouts stay in the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import sqlite3
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

from swe_gym_env.server.capture import CaptureProxy
from swe_gym_env.server.results.pages import Manifest, Manifests, with_pages
from swe_gym_env.server.results.retention import Retention
from swe_gym_env.server.results.store import ResultsStore, disk_full
from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.server.rollout.engines import Engines
from swe_gym_env.server.rollout.pipeline import Pipeline
from swe_gym_env.server.rollout.record import RolloutFailure, RolloutRecord, RunState
from swe_gym_env.server.rollout.runtime import Sockets
from swe_gym_env.server.sandbox.errors import SandboxUnavailable
from swe_gym_env.server.sandbox.preflight import default_sandbox
from swe_gym_env.server.sandbox.registry import reap_orphans
from swe_gym_env.trace.forms import summary_of
from swe_gym_env.wire import (
    AUTO_SANDBOX,
    Phase,
    ResultSummary,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    RolloutSummary,
    failed_result,
)

Notify = Callable[[str], Awaitable[None]]
KEEP_UNSTORED = 256  # finished rollouts whose result could not be stored (disk full), kept in memory
# what the short failure that stands for a result that could not be stored keeps of it (no turns, no grading)
STORE_FAILURE_FIELDS = {"instance_id", "capture_session_id", "stop_reason", "timings", "wall_s"}


TRIM_AFTER_S = 2.0  # after a rollout finishes (its result sent by then), the heap it used goes back to the system


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; absent on musl and elsewhere
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Give freed heap back to the system: a long rollout's ids and messages are many small objects, and without
    this glibc keeps their pages, so the server's RSS would stay at its peak after rollouts finish. A rollout also
    leaves reference cycles (tasks, frames, exceptions holding its buffers) that only a full collection frees: with
    the startup heap frozen (`freeze_startup_heap`) that collection walks only what was made since, milliseconds."""
    gc.collect()
    if (trim := _malloc_trim()) is not None:
        trim(0)


def freeze_startup_heap() -> None:
    """Once the server is warm: collect, then move every object alive now (modules, classes, schemas: ~330k) to
    the permanent generation, so the full collections after each rollout skip them (0.26 s each otherwise, on
    the event loop)."""
    gc.collect()
    gc.freeze()


class RolloutService:
    def __init__(self, config: ServerConfig, capture: CaptureProxy) -> None:
        self.config = config
        self.capture = capture
        self.store = (
            ResultsStore(config.results_dir, config.result_cache_items, config.result_cache_bytes)
            if config.results_dir
            else None
        )
        self.pages = Manifests()  # stored results read in pieces: size, sha256 and page bounds per file
        self.rollouts: dict[str, RolloutRecord] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self.engines = Engines(config)
        self.sockets = Sockets()  # set by the app's lifespan
        self.pipeline = Pipeline(config, capture, self.engines, self.sockets)
        busy = lambda: {r.rollout_id for r in self.live()}  # noqa: E731
        self.retention = Retention(config.retention, self.store, capture.store, busy=busy)

    # -- front door -------------------------------------------------------------------------------------------
    def submit(self, req: RolloutRequest) -> RolloutRecord:
        """Start a rollout (or find the one with this id) without waiting for it."""
        rid = req.rollout_id or uuid.uuid4().hex[:16]
        if (rec := self.rollouts.get(rid)) is not None:
            return rec
        rec = RolloutRecord(rollout_id=rid, request=req)
        if self.store is not None and (done := self.store.get(rid)) is not None:
            rec.result, rec.state, rec.phase = done, "finished", done.phase
            return rec
        self.rollouts[rid] = rec
        if req.sandbox == AUTO_SANDBOX:  # the first backend usable here (probed once per process, at startup)
            try:
                rec.request = req = req.model_copy(update={"sandbox": default_sandbox()})
            except SandboxUnavailable as e:
                self._finish(rec, failed_result(req, str(e), rollout_id=rid))
                return rec
        limit = self.config.concurrency.get(req.sandbox, 8)
        active = sum(1 for r in self.rollouts.values() if r.state != "finished" and r.request.sandbox == req.sandbox)
        if active > limit + self.config.max_queue:
            self._finish(
                rec,
                failed_result(
                    req,
                    f"capacity: {active - 1} rollouts already running or queued on {req.sandbox!r} "
                    f"(limit {limit} running + {self.config.max_queue} queued); retry later",
                    rollout_id=rid,
                ),
            )
            return rec
        if self.store is not None:
            store = self.store
            try:
                store.mark_running(rid, req)
            except OSError as e:
                why = "disk full" if disk_full(e) else "results store error"
                self._finish(rec, failed_result(req, f"{why}: cannot start this rollout: {e}", rollout_id=rid))
                return rec
            rec.on_phase = lambda phase: self._mark(rid, req, phase)
        rec.task = asyncio.create_task(self._execute(rec), name=f"rollout-{rid}")
        return rec

    async def run(self, req: RolloutRequest, notify: Notify | None = None) -> RolloutResult:
        """Start (or attach to) a rollout and wait for its result; progress goes to ``notify``.

        The rollout runs in its own task: a caller that goes away does not stop it, and its result stays
        retrievable by id.
        """
        rec = self.submit(req)
        if rec.task is None:
            assert rec.result is not None
            return rec.result
        with self.subscribe(rec) as queue:
            pump = asyncio.create_task(self._pump(queue, notify)) if notify is not None else None
            try:
                return await asyncio.shield(rec.task)
            finally:
                if pump is not None:
                    pump.cancel()
                    while notify is not None and not queue.empty():
                        with contextlib.suppress(Exception):
                            await notify(queue.get_nowait())

    @contextlib.contextmanager
    def subscribe(self, rec: RolloutRecord) -> Iterator[asyncio.Queue[str]]:
        """Progress messages of a rollout (phases, model calls, agent steps) while the block runs."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        rec.listeners.append(queue)
        try:
            yield queue
        finally:
            with contextlib.suppress(ValueError):
                rec.listeners.remove(queue)

    @staticmethod
    async def _pump(queue: asyncio.Queue[str], notify: Notify) -> None:
        while True:
            message = await queue.get()
            with contextlib.suppress(Exception):  # a client that went away must not fail the rollout
                await notify(message)

    def _mark(self, rid: str, req: RolloutRequest, phase: Phase) -> None:
        """Where a rollout is, for a restart to tell (best effort: a full disk fails the rollout where it stores)."""
        assert self.store is not None
        try:
            self.store.mark_running(rid, req, phase)
        except OSError as e:
            print(f"swe-gym-env: rollout {rid}: could not note phase {phase!r}: {e}", file=sys.stderr)

    def recover(self) -> None:
        """At startup: fail the rollouts a dead server left running and remove their sandboxes."""
        if self.store is not None:
            self.store.recover()
        reap_orphans()

    def cancel(self, rollout_id: str) -> bool:
        rec = self.rollouts.get(rollout_id)
        if rec is None or rec.task is None or rec.task.done():
            return False
        rec.task.cancel()
        return True

    # -- reading ----------------------------------------------------------------------------------------------
    def record(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout in flight (or finished, without a results store or with a result it could not store)."""
        return self.rollouts.get(rollout_id)

    def live(self) -> list[RolloutRecord]:
        """Rollouts queued or running."""
        return [r for r in list(self.rollouts.values()) if r.state != "finished"]

    def get(self, rollout_id: str) -> RolloutStatus | None:
        rec = self.rollouts.get(rollout_id)
        result = rec.result if rec is not None else self.store.get(rollout_id) if self.store is not None else None
        if result is not None:
            return RolloutStatus(rollout_id=rollout_id, state="finished", summary=summary_of(result), result=result)
        if rec is None:
            return None
        return RolloutStatus(rollout_id=rollout_id, state=rec.state, summary=rec.summary())

    def manifest(self, rollout_id: str) -> Manifest | None:
        """The stored result file of a finished rollout, as pages (blocking: one pass over a file not seen before);
        None when it is not stored (no store, not finished, or a result that could not be stored)."""
        path = self.store.path_of(rollout_id) if self.store is not None else None
        if path is None:
            return None
        try:
            return self.pages.get(path, rollout_id)
        except OSError:  # deleted meanwhile (retention)
            return None

    def result_summary(self, rollout_id: str) -> ResultSummary | None:
        """A stored, finished rollout's summary form with its pages, without parsing its result (blocking: reads the
        index, and scans the file once for its manifest); None when not stored, or stored by an older server."""
        if self.store is None or rollout_id in self.rollouts:
            return None
        summary = self.store.result_summary(rollout_id)
        m = self.manifest(rollout_id) if summary is not None else None
        return with_pages(summary, m) if summary is not None and m is not None else None

    def list(self, limit: int = 100) -> list[RolloutSummary]:
        live = [r.summary() for r in self.live()]
        held = [r.summary() for r in self.rollouts.values() if r.state == "finished"]  # not in a store
        done = held[::-1] + self.store.summaries(limit) if self.store is not None else held
        return (live + done)[:limit]

    def in_flight(self) -> int:
        return len(self.live())

    # -- running ----------------------------------------------------------------------------------------------
    def _slot(self, backend: str) -> asyncio.Semaphore:
        if backend not in self._slots:  # created on first use, inside the running loop
            self._slots[backend] = asyncio.Semaphore(self.config.concurrency.get(backend, 8))
        return self._slots[backend]

    def _finish(self, rec: RolloutRecord, result: RolloutResult) -> RolloutResult:
        """Store the result (then the registry forgets the rollout: the store has it); a result that cannot be
        stored becomes a failed one saying why ("disk full: ..."), kept in memory. Returns the result as told."""
        stored = self.store is None
        if self.store is not None:
            try:
                self.store.put(result)
                stored = True
            except (OSError, sqlite3.Error) as e:
                why = "disk full" if disk_full(e) else "results store error"
                result = failed_result(
                    rec.request,
                    f"{why}: the result of this rollout could not be stored ({type(e).__name__}: {e}); "
                    "free space on the server's data disk (retention: SWE_GYM_RETENTION_*)"
                    + (f"; the rollout itself: {result.error}" if result.error else ""),
                    result.phase,
                    rollout_id=rec.rollout_id,
                    **result.model_dump(include=STORE_FAILURE_FIELDS),
                )
                with contextlib.suppress(OSError, sqlite3.Error):  # the short failure may still fit
                    self.store.put(result)
                    stored = True
        rec.result, rec.state, rec.phase = result, "finished", result.phase
        if self.store is not None:
            if stored:
                self.rollouts.pop(rec.rollout_id, None)
            unstored = [r for r in self.rollouts.values() if r.state == "finished"]
            for old in unstored[: max(0, len(unstored) - KEEP_UNSTORED)]:
                self.rollouts.pop(old.rollout_id, None)
        self.retention.poke()
        with contextlib.suppress(RuntimeError):  # no loop (a sync caller): nothing to give back later
            asyncio.get_running_loop().call_later(TRIM_AFTER_S, release_memory)
        return result

    async def _execute(self, rec: RolloutRecord) -> RolloutResult:
        req = rec.request
        state = RunState()
        t0 = time.monotonic()
        try:
            async with self._slot(req.sandbox):
                rec.state = "running"
                t0 = time.monotonic()
                state.deadline = time.monotonic() + req.deadline_s
                async with asyncio.timeout(req.deadline_s) as state.timeout:
                    result = await self.pipeline.run(rec, req, state)
        except RolloutFailure as e:
            result = self._failed(rec, req, e.phase, e.message, state, e.stop_reason)
        except TimeoutError:
            msg = f"rollout deadline of {req.deadline_s:.0f}s exceeded during {rec.phase}"
            result = self._failed(rec, req, rec.phase, msg, state, "deadline")
        except asyncio.CancelledError:
            result = self._failed(rec, req, rec.phase, f"cancelled during {rec.phase}", state, "cancelled")
        except Exception as e:  # a failure is a result, never an exception into the caller
            why = "disk full" if disk_full(e) else "internal error"
            result = self._failed(rec, req, rec.phase, f"{why}: {type(e).__name__}: {e}", state)
        result.timings = {k: round(v, 3) for k, v in state.timings.items()}
        result.wall_s = round(time.monotonic() - t0, 3)
        return self._finish(rec, result)

    @staticmethod
    def _failed(
        rec: RolloutRecord,
        req: RolloutRequest,
        phase: Phase,
        error: str,
        state: RunState,
        stop_reason: str | None = None,
    ) -> RolloutResult:
        cert = state.cert
        return failed_result(
            req,
            error,
            phase,
            rollout_id=rec.rollout_id,
            stop_reason=stop_reason,
            findings=state.findings(),
            capture_level=cert.level if cert else None,
            logprobs_mode=cert.logprobs_mode if cert else None,
            instance_id=state.instance_id or req.instance_id,
            **state.trace(),
        )
