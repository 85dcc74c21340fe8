"""The rollout pipeline: the one place that composes task, capture session, sandbox, agent and grading.

`RolloutService.run` never raises into its caller: every failure is a result with `ok=False`, the phase it
happened in and a specific error; sandboxes and capture sessions are closed on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from swe_gym_env.server import capture_chat as chat
from swe_gym_env.server.agents.base import AgentConfig, AgentError, AgentOutcome, Harness, reconcile
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.agents.verdict import RunFacts, classify_failure
from swe_gym_env.server.capture import CaptureProxy, CaptureSession, EngineTarget
from swe_gym_env.server.certify import Certificate, certify
from swe_gym_env.server.grading import GradingError, grade
from swe_gym_env.server.results import ResultsStore
from swe_gym_env.server.sandbox.base import ExecResult, Sandbox, SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox, reap_orphans
from swe_gym_env.server.security import engine_allowlist, engine_url_allowed
from swe_gym_env.tasks.catalog import TaskNotFound, get_task
from swe_gym_env.wire import (
    Finding,
    Phase,
    RolloutRequest,
    RolloutResult,
    RolloutStatus,
    RolloutSummary,
    SequenceRef,
    count_roots,
    failed_result,
)

Notify = Callable[[str], Awaitable[None]]
DIFF_LIMIT = 4 * 1024 * 1024
SETUP_TIMEOUT_S = 600.0
POLL_S = 0.1  # how often the agent phase looks at the session (the events file: every POLL_EVENTS_S)
POLL_EVENTS_S = 1.0
BUDGET_GRACE_S = 15.0  # an agent still calling this long after its budget ran out is stopped
KEEP_FINISHED = 256  # finished rollouts kept in memory; all of them are in the results store
DIFF_EXCLUDES = "':(exclude)**/__pycache__/**' ':(exclude)*.pyc' ':(exclude).pytest_cache/**'"
PROMPT = """You are working in a git repository at {workdir}. Resolve the issue below by editing the source code.
Do not modify the tests. When you are done, reply with a short summary.

<issue>
{problem}
</issue>
"""


class RolloutFailure(Exception):
    def __init__(self, phase: Phase, message: str, stop_reason: str | None = None) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.stop_reason = stop_reason


@dataclass
class ServerConfig:
    engines: dict[str, EngineTarget]
    capture_socket: Path | None = None
    results_dir: Path | None = None
    capture_db: Path | None = None  # durable capture store (SQLite); None: in memory only
    context_window: int = 8192
    grading_timeout_s: float = 300.0
    stall_timeout_s: float = 60.0  # an engine stream silent this long ends its call (well under any deadline)
    max_failed_calls: int = 5  # model calls failing in a row that end the rollout at once
    concurrency: dict[str, int] = field(default_factory=lambda: {"local": 8})  # rollouts running per backend
    max_queue: int = 256  # rollouts waiting per backend before `capacity` errors
    allow_engine_urls: tuple[str, ...] = ()  # URL prefixes callers may name as engine_url ("*": any); security.py

    @classmethod
    def from_env(cls) -> ServerConfig:
        """SWE_GYM_ENGINE_URL / SWE_GYM_ENGINE_MODEL / SWE_GYM_ENGINE_API_KEY name the default engine."""
        from swe_gym_env.server.assets import cache_dir

        engine = EngineTarget(
            base_url=os.environ.get("SWE_GYM_ENGINE_URL", "http://127.0.0.1:8001/v1").rstrip("/"),
            served_model=os.environ.get("SWE_GYM_ENGINE_MODEL", "smollm2-135m-instruct"),
            api_key=os.environ.get("SWE_GYM_ENGINE_API_KEY") or None,
        )
        data = os.environ.get("SWE_GYM_DATA_DIR")
        return cls(
            engines={"default": engine},
            results_dir=Path(data) / "results" if data else cache_dir() / "results",
            context_window=int(os.environ.get("SWE_GYM_CONTEXT_WINDOW", "8192")),  # what agents are told
            grading_timeout_s=float(os.environ.get("SWE_GYM_GRADING_TIMEOUT_S", "300")),
            stall_timeout_s=float(os.environ.get("SWE_GYM_STALL_TIMEOUT_S", "60")),
            max_failed_calls=int(os.environ.get("SWE_GYM_MAX_FAILED_CALLS", "5")),
            capture_db=(Path(data) if data else cache_dir()) / "capture.sqlite",
            concurrency={"local": int(os.environ.get("SWE_GYM_MAX_ROLLOUTS", "8"))},
            allow_engine_urls=engine_allowlist(),
        )


@dataclass
class RolloutRecord:
    """A rollout in flight or finished, as the server tracks it."""

    rollout_id: str
    request: RolloutRequest
    phase: Phase = "validate"
    state: Literal["queued", "running", "finished"] = "queued"
    result: RolloutResult | None = None
    task: asyncio.Task | None = None
    session: CaptureSession | None = None
    instance_id: str | None = None
    listeners: list[asyncio.Queue[str]] = field(default_factory=list)
    phase_since: float = field(default_factory=time.time)

    def emit(self, message: str) -> None:
        for q in self.listeners:
            q.put_nowait(message)

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.phase_since = time.time()
        self.emit(f"phase: {phase}")

    def summary(self) -> RolloutSummary:
        if self.result is not None:
            return RolloutSummary.of_result(self.result)
        last = self.session.last_call_at if self.session else None
        return RolloutSummary(
            rollout_id=self.rollout_id,
            instance_id=self.instance_id,
            harness=self.request.harness,
            sandbox=self.request.sandbox,
            phase=self.phase,
            state=self.state,
            turns=len(self.session.turns) if self.session else 0,
            roots=count_roots(self.session.turns) if self.session else 0,
            seconds_since_last_call=round(time.time() - last, 3) if last else None,
            seconds_in_phase=round(time.time() - self.phase_since, 3),
            capture_session_id=self.session.id if self.session else None,
        )


class RolloutService:
    def __init__(self, config: ServerConfig, capture: CaptureProxy) -> None:
        self.config = config
        self.capture = capture
        self.store = ResultsStore(config.results_dir) if config.results_dir else None
        self.rollouts: dict[str, RolloutRecord] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._certs: dict[str, Certificate] = {}

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
            self.store.mark_running(rid, req)
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
        queue: asyncio.Queue[str] = asyncio.Queue()
        rec.listeners.append(queue)
        pump = asyncio.create_task(self._pump(queue, notify)) if notify is not None else None
        try:
            return await asyncio.shield(rec.task)
        finally:
            rec.listeners.remove(queue)
            if pump is not None:
                pump.cancel()
                while notify is not None and not queue.empty():
                    with contextlib.suppress(Exception):
                        await notify(queue.get_nowait())

    @staticmethod
    async def _pump(queue: asyncio.Queue[str], notify: Notify) -> None:
        while True:
            message = await queue.get()
            with contextlib.suppress(Exception):  # a client that went away must not fail the rollout
                await notify(message)

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

    def get(self, rollout_id: str) -> RolloutStatus | None:
        rec = self.rollouts.get(rollout_id)
        result = rec.result if rec is not None else self.store.get(rollout_id) if self.store is not None else None
        if result is not None:
            return RolloutStatus(
                rollout_id=rollout_id, state="finished", summary=RolloutSummary.of_result(result), result=result
            )
        if rec is None:
            return None
        return RolloutStatus(rollout_id=rollout_id, state=rec.state, summary=rec.summary())

    def list(self, limit: int = 100) -> list[RolloutSummary]:
        live = [r.summary() for r in self.rollouts.values() if r.state != "finished"]
        done = (
            self.store.summaries(limit)
            if self.store is not None
            else [r.summary() for r in self.rollouts.values() if r.state == "finished"]
        )
        return (live + done)[:limit]

    def in_flight(self) -> int:
        return sum(1 for r in self.rollouts.values() if r.state != "finished")

    def _slot(self, backend: str) -> asyncio.Semaphore:
        if backend not in self._slots:  # created on first use, inside the running loop
            self._slots[backend] = asyncio.Semaphore(self.config.concurrency.get(backend, 8))
        return self._slots[backend]

    def _finish(self, rec: RolloutRecord, result: RolloutResult) -> None:
        rec.result, rec.state, rec.phase = result, "finished", result.phase
        if self.store is not None:
            self.store.put(result)
        finished = [r for r in self.rollouts.values() if r.state == "finished"]
        for old in finished[: max(0, len(finished) - KEEP_FINISHED)]:  # the rest is on disk
            if self.store is not None:
                self.rollouts.pop(old.rollout_id, None)

    async def _execute(self, rec: RolloutRecord) -> RolloutResult:
        req = rec.request
        state: dict = {"turns": [], "findings": []}
        timings: dict[str, float] = {}
        t0 = time.monotonic()
        try:
            async with self._slot(req.sandbox):
                rec.state = "running"
                t0 = time.monotonic()
                state["deadline"] = time.monotonic() + req.deadline_s
                async with asyncio.timeout(req.deadline_s):
                    result = await self._run(rec, req, timings, state)
        except RolloutFailure as e:
            result = self._failed(rec, req, e.phase, e.message, state, e.stop_reason)
        except TimeoutError:
            msg = f"rollout deadline of {req.deadline_s:.0f}s exceeded during {rec.phase}"
            result = self._failed(rec, req, rec.phase, msg, state, "deadline")
        except asyncio.CancelledError:
            result = self._failed(rec, req, rec.phase, f"cancelled during {rec.phase}", state, "cancelled")
        except Exception as e:  # a failure is a result, never an exception into the caller
            result = self._failed(rec, req, rec.phase, f"internal error: {type(e).__name__}: {e}", state)
        result.timings = {k: round(v, 3) for k, v in timings.items()}
        result.wall_s = round(time.monotonic() - t0, 3)
        self._finish(rec, result)
        return result

    def _failed(
        self,
        rec: RolloutRecord,
        req: RolloutRequest,
        phase: Phase,
        error: str,
        state: dict,
        stop_reason: str | None = None,
    ) -> RolloutResult:
        return failed_result(
            req,
            error,
            phase,
            rollout_id=rec.rollout_id,
            stop_reason=stop_reason,
            turns=state["turns"],
            findings=state["findings"],
            model_patch=state.get("patch"),
            agent_exit_code=state.get("exit_code"),
            capture_level=state["cert"].level if state.get("cert") else None,
            logprobs_mode=state["cert"].logprobs_mode if state.get("cert") else None,
            instance_id=state.get("instance_id") or req.instance_id,
            **self._trace_fields(state),
        )

    async def _run(
        self, rec: RolloutRecord, req: RolloutRequest, timings: dict[str, float], state: dict
    ) -> RolloutResult:
        rec.set_phase("task")
        try:
            task = get_task(req.split, req.index, req.instance_id)
        except TaskNotFound as e:
            raise RolloutFailure("task", str(e)) from e
        state["instance_id"] = rec.instance_id = task.instance_id
        engine, engine_name = self._engine_for(req)
        if req.sandbox == "local" and not task.repo_source:
            raise RolloutFailure("task", f"task {task.instance_id} has no local repository source")
        cert = await self._certificate(engine_name, engine)
        if engine.served_model == "" and cert.served_model:
            engine = EngineTarget(engine.base_url, cert.served_model, engine.api_key)
        state["cert"] = cert
        if not cert.reachable:
            raise RolloutFailure("validate", f"engine unreachable: {cert.detail}")
        if req.mode == "black_box" and req.purpose == "train":
            raise RolloutFailure("validate", "mode=black_box is for eval only (no token data): use purpose=eval")
        if req.purpose == "train" and (cert.level != "tokens" or cert.logprobs_mode != "processed"):
            why = f"capture level {cert.level}, {cert.logprobs_mode} logprobs"
            why += f": {cert.detail}" if cert.detail else ""
            raise RolloutFailure(
                "validate",
                f"purpose=train needs an engine that returns token ids with processed "
                f"logprobs; {req.engine!r} does not ({why}); use purpose=eval",
            )
        if req.mode == "capture" and cert.level != "tokens":  # nothing trainable to capture: evaluate black-box
            req = req.model_copy(update={"mode": "black_box"})
            state["mode_findings"] = [
                Finding(
                    severity="info",
                    code="black_box",
                    message=f"the engine returns no token ids (capture level {cert.level}): ran black-box, eval only",
                )
            ]

        rec.set_phase("install")
        try:
            harness = get_harness(req.harness)
            mounts = harness.mounts()
        except AgentError as e:
            raise RolloutFailure("install", str(e)) from e
        context = cert.max_model_len or self.config.context_window
        if req.mode == "capture" and context < harness.min_context_tokens:
            raise RolloutFailure(
                "validate",
                f"the engine's context is {context} tokens, below the {harness.min_context_tokens} that "
                f"{req.harness} needs (its own prompt + room to act): serve a longer context or use another harness",
            )

        rec.set_phase("session")
        session, key = self.capture.open_session(
            engine,
            max_calls=req.max_model_calls,
            max_tokens=req.max_tokens,
            sampling={k: v for k in ("temperature", "top_p", "top_k", "seed") if (v := getattr(req, k)) is not None},
            session_id=rec.rollout_id,
            labels={"rollout": rec.rollout_id},
            passthrough=req.mode == "black_box",
            stall_timeout_s=self.config.stall_timeout_s,
            max_consecutive_failures=self.config.max_failed_calls,
        )
        rec.session = session
        state["session"] = session
        state["session_id"] = session.id
        state["turns"], state["findings"] = session.turns, session.findings  # kept on every failure path
        session.on_turn = lambda turn: rec.emit(
            f"model call {turn.index + 1}: {len(turn.prompt_token_ids)} prompt + "
            f"{len(turn.completion_token_ids)} completion tokens"
        )
        sbx: Sandbox | None = None
        try:
            rec.set_phase("boot")
            t = time.monotonic()
            spec = SandboxSpec(
                repo_source=task.repo_source or "",
                base_commit=task.base_commit,
                workdir=task.workdir,
                image=task.image,
                capture_socket=self.config.capture_socket,
                ro_mounts=mounts,
                labels={"rollout": rec.rollout_id, "role": "agent"},
                deadline_s=req.deadline_s + 60,  # expires by itself even if this server dies
            )
            try:
                sbx = await create_sandbox(req.sandbox, spec)
                cfg = AgentConfig(
                    base_url=sbx.capture_base_url or "",
                    model=engine.served_model,
                    context_window=context,
                    max_tokens=req.max_tokens,
                )
                prompt = PROMPT.format(workdir=task.workdir, problem=task.problem_statement)
                for path, (data, mode) in harness.config_files(cfg, key, prompt).items():
                    await sbx.write_file(path, data, mode)
                if task.setup_commands:  # the task's own setup, before the agent starts
                    await sbx.write_file("/tmp/.swe-gym-setup.sh", task.setup_script().encode(), 0o700)
                    r = await sbx.exec("bash /tmp/.swe-gym-setup.sh", timeout=SETUP_TIMEOUT_S)
                    if not r.ok:
                        why = "timed out" if r.timed_out else f"exit {r.exit_code}"
                        raise RolloutFailure("boot", f"task setup commands failed ({why}): {r.stderr[-500:]}")
                    # what setup changed is the agent's starting point, not part of its diff (grading re-runs setup)
                    r = await sbx.exec(
                        "git add -A -- . && git -c user.name=swe-gym -c user.email=swe-gym@localhost commit -q "
                        "--allow-empty --no-verify -m 'task setup' && git rev-parse HEAD",
                        timeout=120,
                    )
                    if not r.ok:
                        raise RolloutFailure("boot", f"could not record the state after task setup: {r.stderr[-300:]}")
                    state["diff_base"] = r.stdout.strip().splitlines()[-1]
            except SandboxError as e:
                raise RolloutFailure("boot", str(e)) from e
            timings["boot"] = time.monotonic() - t

            rec.set_phase("agent")
            t = time.monotonic()
            agent_timeout = max(5.0, state["deadline"] - t - min(120.0, 0.2 * req.deadline_s))  # leave time to grade
            res, stopped = await self._run_agent(rec, sbx, harness, cfg, session, agent_timeout, timings)
            timings["agent"] = time.monotonic() - t
            state["exit_code"] = res.exit_code
            state["log_tail"] = await self._read_text(sbx, harness.log_path, tail=4000)
            outcome = harness.parse_events(await self._read_text(sbx, harness.events_path))
            self._cross_check(req, outcome, session, state)
            facts = RunFacts(
                exit_code=res.exit_code,
                timed_out=res.timed_out,
                timeout_s=agent_timeout,
                calls=self._answered(req, session),
                proxy_errors=tuple(session.errors),
                budget_exhausted=session.stop_reason == "budget_exhausted",
                stopped_after_budget=stopped,
                stderr_tail=res.stderr[-500:] or state["log_tail"][-500:],
            )
            if session.stop_reason == "engine_failures" or session.consecutive_failures:
                raise RolloutFailure("agent", self._engine_failure(session), "engine_failures")
            if (failure := classify_failure(outcome, facts)) is not None:
                kind, message = failure
                raise RolloutFailure("agent", f"{kind}: {message}", "timeout" if kind == "timeout" else None)
            if state.get("missing_steps"):  # the agent used model calls the capture never saw: not its trace
                raise RolloutFailure("agent", f"cross-check mismatch: {state['cross_check'][1]}")

            rec.set_phase("diff")
            state["patch"] = patch = await self._extract_diff(sbx, state.get("diff_base") or task.base_commit)
        finally:
            if sbx is not None:
                await sbx.close()
            self.capture.close_session(session)

        fatal = [f for f in session.findings if f.severity == "fatal"]
        if fatal:  # the capture is not usable training data, whatever the reward: do not even grade it
            raise RolloutFailure("agent", f"capture validation: {fatal[0]}")
        if req.mode == "capture" and not self._saw_task(session, task.problem_statement):
            raise RolloutFailure(
                "agent",
                "no agent call carried the task's problem statement: the agent never saw the task (compacted or "
                "replaced its prompt before its first call?)",
            )

        rec.set_phase("grade")
        t = time.monotonic()
        grading_spec = SandboxSpec(
            repo_source=task.repo_source or "",
            base_commit=task.base_commit,
            workdir=task.workdir,
            image=task.image,
            labels={"rollout": rec.rollout_id, "role": "grading"},
            deadline_s=self.config.grading_timeout_s + 120,
        )
        try:
            g = await grade(
                task, patch, lambda: create_sandbox(req.sandbox, grading_spec), self.config.grading_timeout_s
            )
        except (GradingError, SandboxError) as e:
            raise RolloutFailure("grade", str(e)) from e
        timings["grade"] = time.monotonic() - t
        findings = [*state.get("mode_findings", []), *session.findings, *state.get("agent_findings", []), *g.findings]
        if g.dropped_files:
            findings.append(f"grading ignored the agent's edits to protected files: {g.dropped_files}")
        rec.set_phase("done")
        return RolloutResult(
            rollout_id=rec.rollout_id,
            ok=True,
            reward=g.reward,
            instance_id=task.instance_id,
            harness=req.harness,
            sandbox=req.sandbox,
            stop_reason=session.stop_reason or "agent_done",
            turns=session.turns,
            model_patch=patch,
            grading=g.report,
            agent_exit_code=res.exit_code,
            **self._trace_fields(state),
            capture_level="text" if req.mode == "black_box" else state["cert"].level,
            logprobs_mode=None if req.mode == "black_box" else state["cert"].logprobs_mode,
            findings=findings,
        )

    async def _run_agent(
        self,
        rec: RolloutRecord,
        sbx: Sandbox,
        harness: Harness,
        cfg: AgentConfig,
        session: CaptureSession,
        timeout: float,
        timings: dict[str, float],
    ) -> tuple[ExecResult, bool]:
        """Run the agent in the background and watch it: first model call, steps from its events file, and an
        agent that keeps calling after its budget ran out is stopped. Returns (result, stopped_after_budget)."""
        t0 = time.monotonic()
        run = asyncio.create_task(sbx.exec(harness.command(cfg), timeout=timeout, relay=True))
        steps, next_read, budget_at = 0, t0 + POLL_EVENTS_S, None
        try:
            while not run.done():
                await asyncio.wait({run}, timeout=POLL_S)
                now = time.monotonic()
                if session.calls and "first_call" not in timings:
                    timings["first_call"] = now - t0
                if now >= next_read and not run.done():
                    next_read = now + POLL_EVENTS_S
                    n = harness.parse_events(await self._read_text(sbx, harness.events_path)).model_calls
                    if n > steps:
                        steps = n
                        rec.emit(f"agent: {n} step(s) in its own events")
                if session.stop_reason == "engine_failures" and not run.done():  # the engine is gone: stop now
                    rec.emit(f"agent: {session.consecutive_failures} model calls in a row failed; stopping it")
                    run.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await run
                    return ExecResult(137, "", "stopped after repeated engine failures"), True
                if session.stop_reason == "budget_exhausted" and not run.done():
                    budget_at = budget_at or now
                    if now - budget_at > BUDGET_GRACE_S:
                        rec.emit("agent: still running after its model-call budget ran out; stopping it")
                        run.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await run
                        return ExecResult(137, "", "stopped after the model-call budget ran out"), True
            return run.result(), False
        finally:
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await run

    @staticmethod
    def _engine_failure(session: CaptureSession) -> str:
        last = session.failures[-1][1] if session.failures else "unknown error"
        if session.stop_reason == "engine_failures":
            what = f"{session.consecutive_failures} model calls in a row failed (the limit), so the rollout stopped"
        else:
            what = f"the agent did not recover from {session.consecutive_failures} failed model call(s) at the end"
        return f"engine_failures: {what}; {session.failed} failed in all; last: {last}"

    @staticmethod
    def _saw_task(session: CaptureSession, problem: str) -> bool:
        """Whether some agent-role call's request carried the problem statement (whitespace normalised)."""
        needle = " ".join(problem.split())
        if not needle:
            return True
        return any(needle in " ".join(chat.request_text(t.request).split()) for t in session.turns if t.role == "agent")

    @staticmethod
    def _answered(req: RolloutRequest, session: CaptureSession) -> int:
        """Model calls the engine answered (failed ones excluded; budget replies are not calls)."""
        if req.mode == "black_box":
            return max(0, session.calls - len({e.split(":", 1)[0] for e in session.errors}))
        return len(session.turns)

    @staticmethod
    def _cross_check(req: RolloutRequest, outcome: AgentOutcome, session: CaptureSession, state: dict) -> None:
        """The agent's own events against the capture: a verdict in every result; captured calls the agent never
        used are demoted (discarded), agent calls the capture lacks make the rollout unusable."""
        if req.mode == "black_box":  # nothing recorded: compare call counts only
            agent_calls = outcome.model_calls - session.budget_replies
            if outcome.model_calls == 0 and outcome.error_kind is None:
                state["cross_check"] = ("none", "the agent left no trace of model calls")
            elif agent_calls == RolloutService._answered(req, session):
                state["cross_check"] = ("match", f"{agent_calls} calls (black box: counts only)")
            else:
                state["cross_check"] = (
                    "mismatch",
                    f"the agent reports {outcome.model_calls} model calls ({session.budget_replies} budget "
                    f"replies), the proxy answered {RolloutService._answered(req, session)}",
                )
            return
        r = reconcile(outcome, session.turns, session.budget_replies)
        state["cross_check"] = (r.verdict, r.detail)
        state["missing_steps"] = r.missing
        session.demoted.update(r.unused)  # the graph discards them (and what hangs below them) when it closes
        for turn in session.turns:
            if turn.index in r.unused:
                turn.discarded = True
        if r.verdict == "mismatch":
            state["agent_findings"] = [
                Finding(
                    severity="fatal" if r.missing else "warning",
                    code="cross_check_mismatch",
                    message=f"{r.detail}; demoted turns the agent never used: {list(r.unused)}",
                )
            ]

    def _engine_for(self, req: RolloutRequest) -> tuple[EngineTarget, str]:
        if req.engine_url is None:
            engine = self.config.engines.get(req.engine)
            if engine is None:
                raise RolloutFailure("validate", f"unknown engine {req.engine!r}; known: {sorted(self.config.engines)}")
            return engine, req.engine
        if not engine_url_allowed(req.engine_url, self.config.allow_engine_urls):
            raise RolloutFailure(
                "validate",
                "engine_url is not on this server's allow-list (the operator sets URL prefixes in "
                "SWE_GYM_ENGINE_URL_ALLOWLIST; SWE_GYM_ALLOW_ENGINE_URLS=1 allows any)",
            )
        url = req.engine_url.rstrip("/")
        return EngineTarget(url, req.engine_model or ""), f"url:{url}"

    @staticmethod
    def _trace_fields(state: dict) -> dict:
        verdict, detail = state.get("cross_check", (None, ""))
        return {
            "capture_session_id": state.get("session_id"),
            "agent_log_tail": state.get("log_tail", ""),
            "sequences": [
                SequenceRef(turns=s.turns, role=s.role, discarded=s.discarded)
                for s in (state["session"].sequences if state.get("session") else [])
            ],
            "cross_check": verdict,
            "cross_check_detail": detail,
        }

    async def _certificate(self, name: str, engine: EngineTarget) -> Certificate:
        """Certify each engine once (cached while it stays reachable)."""
        cert = self._certs.get(name)
        if cert is None:
            cert = await certify(engine.base_url, engine.api_key, timeout_s=30.0)
            if cert.reachable:
                self._certs[name] = cert
        return cert

    @staticmethod
    async def _read_text(sbx: Sandbox, path: str, tail: int | None = None) -> str:
        """A file the agent wrote (it may be missing if the agent died early: then empty)."""
        try:
            text = (await sbx.read_file(path)).decode("utf-8", "replace")
        except (OSError, SandboxError):
            return ""
        return text[-tail:] if tail else text

    async def _extract_diff(self, sbx: Sandbox, base: str) -> str:
        r = await sbx.exec(
            f"git add -A -- . {DIFF_EXCLUDES} && git diff --cached --binary --no-color "
            f"--no-ext-diff {shlex.quote(base)} > /tmp/.model.patch",
            timeout=120,
        )
        if not r.ok:
            raise RolloutFailure("diff", f"could not extract the agent's diff: {r.stderr[-500:]}")
        data = await sbx.read_file("/tmp/.model.patch", DIFF_LIMIT + 1)
        if len(data) > DIFF_LIMIT:
            raise RolloutFailure("diff", f"the agent's diff is over {DIFF_LIMIT} bytes")
        return data.decode("utf-8", "replace")
