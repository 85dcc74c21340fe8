"""The rollout pipeline: the one place that composes task, capture session, sandbox, agent and grading.

`RolloutService.run` never raises into its caller: every failure is a result with `ok=False`, the phase it
happened in and a specific error; sandboxes and capture sessions are closed on every path.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.capture import CaptureProxy, EngineTarget
from swe_gym_env.server.grading import GradingError, grade
from swe_gym_env.server.sandbox.base import Sandbox, SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import TaskNotFound, get_task
from swe_gym_env.tasks.models import Task
from swe_gym_env.wire import Phase, RolloutRequest, RolloutResult

Notify = Callable[[str], Awaitable[None]]
DIFF_LIMIT = 4 * 1024 * 1024
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
    context_window: int = 8192
    grading_timeout_s: float = 300.0

    @classmethod
    def from_env(cls) -> ServerConfig:
        """SWE_GYM_ENGINE_URL / SWE_GYM_ENGINE_MODEL / SWE_GYM_ENGINE_API_KEY name the default engine."""
        from swe_gym_env.server.assets import cache_dir

        engine = EngineTarget(
            base_url=os.environ.get("SWE_GYM_ENGINE_URL", "http://127.0.0.1:8001/v1").rstrip("/"),
            served_model=os.environ.get("SWE_GYM_ENGINE_MODEL", "smollm2-135m-instruct"),
            api_key=os.environ.get("SWE_GYM_ENGINE_API_KEY") or None,
        )
        return cls(engines={"default": engine}, results_dir=cache_dir() / "results")


@dataclass
class RolloutRecord:
    """A rollout in flight or finished, as the server tracks it."""

    rollout_id: str
    request: RolloutRequest
    phase: Phase = "validate"
    started_at: float = field(default_factory=time.time)
    result: RolloutResult | None = None


class RolloutService:
    def __init__(self, config: ServerConfig, capture: CaptureProxy) -> None:
        self.config = config
        self.capture = capture
        self.rollouts: dict[str, RolloutRecord] = {}

    async def run(self, req: RolloutRequest, notify: Notify | None = None) -> RolloutResult:
        rec = RolloutRecord(rollout_id=uuid.uuid4().hex[:16], request=req)
        self.rollouts[rec.rollout_id] = rec
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        state: dict = {"turns": [], "findings": []}
        try:
            async with asyncio.timeout(req.deadline_s):
                result = await self._run(rec, req, timings, state, notify)
        except RolloutFailure as e:
            result = self._failed(rec, req, e.phase, e.message, state, e.stop_reason)
        except TimeoutError:
            result = self._failed(
                rec,
                req,
                rec.phase,
                f"rollout deadline of {req.deadline_s:.0f}s exceeded during {rec.phase}",
                state,
                "deadline",
            )
        except Exception as e:  # a failure is a result, never an exception into the caller
            result = self._failed(rec, req, rec.phase, f"internal error: {type(e).__name__}: {e}", state)
        result.timings = {k: round(v, 3) for k, v in timings.items()}
        result.wall_s = round(time.monotonic() - t0, 3)
        rec.result = result
        rec.phase = result.phase
        self._persist(result)
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
        return RolloutResult(
            rollout_id=rec.rollout_id,
            ok=False,
            error=error,
            phase=phase,
            reward=None,
            instance_id=state.get("instance_id"),
            harness=req.harness,
            sandbox=req.sandbox,
            stop_reason=stop_reason,
            turns=state["turns"],
            findings=state["findings"],
            model_patch=state.get("patch"),
            agent_exit_code=state.get("exit_code"),
        )

    async def _phase(self, rec: RolloutRecord, phase: Phase, notify: Notify | None) -> None:
        rec.phase = phase
        if notify is not None:
            await notify(f"phase: {phase}")

    async def _run(
        self, rec: RolloutRecord, req: RolloutRequest, timings: dict[str, float], state: dict, notify: Notify | None
    ) -> RolloutResult:
        await self._phase(rec, "task", notify)
        try:
            task = get_task(req.split, req.index, req.instance_id)
        except TaskNotFound as e:
            raise RolloutFailure("task", str(e)) from e
        state["instance_id"] = task.instance_id
        engine = self.config.engines.get(req.engine)
        if engine is None:
            raise RolloutFailure("validate", f"unknown engine {req.engine!r}; known: {sorted(self.config.engines)}")
        if req.sandbox == "local" and not task.repo_source:
            raise RolloutFailure("task", f"task {task.instance_id} has no local repository source")

        await self._phase(rec, "install", notify)
        try:
            harness = get_harness(req.harness)
            mounts = harness.mounts()
        except AgentError as e:
            raise RolloutFailure("install", str(e)) from e

        await self._phase(rec, "session", notify)
        session, key = self.capture.open_session(
            engine, max_calls=req.max_model_calls, max_tokens=req.max_tokens, temperature=req.temperature
        )
        # Turn notifications are queued by the capture proxy (another request's context) and sent from this one.
        queue: asyncio.Queue[str] = asyncio.Queue()
        pump: asyncio.Task | None = None
        if notify is not None:
            session.on_turn = lambda turn: queue.put_nowait(
                f"model call {turn.index + 1}: {len(turn.prompt_token_ids)} prompt + "
                f"{len(turn.completion_token_ids)} completion tokens"
            )

            async def drain() -> None:
                while True:
                    await notify(await queue.get())

            pump = asyncio.create_task(drain())
        sbx: Sandbox | None = None
        try:
            await self._phase(rec, "boot", notify)
            t = time.monotonic()
            spec = SandboxSpec(
                repo_source=task.repo_source or "",
                base_commit=task.base_commit,
                workdir=task.workdir,
                capture_socket=self.config.capture_socket,
                ro_mounts=mounts,
                labels={"rollout": rec.rollout_id},
            )
            try:
                sbx = await create_sandbox(req.sandbox, spec)
                cfg = AgentConfig(
                    base_url=sbx.capture_base_url or "",
                    model=engine.served_model,
                    context_window=self.config.context_window,
                    max_tokens=req.max_tokens,
                )
                prompt = PROMPT.format(workdir=task.workdir, problem=task.problem_statement)
                for path, (data, mode) in harness.config_files(cfg, key, prompt).items():
                    await sbx.write_file(path, data, mode)
            except SandboxError as e:
                raise RolloutFailure("boot", str(e)) from e
            timings["boot"] = time.monotonic() - t

            await self._phase(rec, "agent", notify)
            t = time.monotonic()
            res = await sbx.exec(harness.command(cfg), timeout=req.deadline_s, relay=True)
            timings["agent"] = time.monotonic() - t
            state["exit_code"] = res.exit_code
            state["turns"] = session.turns
            events = (await sbx.read_file(harness.events_path)).decode("utf-8", "replace")
            outcome = harness.parse_events(events)
            state["findings"] = session.findings
            budget_hit = session.stop_reason == "budget_exhausted"
            if session.errors:
                raise RolloutFailure("agent", "capture: " + "; ".join(session.errors[:3]))
            if res.timed_out:
                raise RolloutFailure("agent", "agent timed out", "timeout")
            if not session.turns:
                kind = outcome.error_kind or "no_model_calls"
                raise RolloutFailure(
                    "agent",
                    f"{kind}: the agent made no model call through the capture proxy"
                    + (f" ({outcome.error})" if outcome.error else "")
                    + (f"; exit {res.exit_code}: {res.stderr[-300:]}" if res.exit_code else ""),
                )
            if outcome.error_kind and not budget_hit:
                raise RolloutFailure("agent", f"{outcome.error_kind}: {outcome.error}")
            if res.exit_code != 0 and not budget_hit:
                raise RolloutFailure("agent", f"agent_crashed: exit code {res.exit_code}: {res.stderr[-500:]}")

            await self._phase(rec, "diff", notify)
            state["patch"] = patch = await self._extract_diff(sbx, task)
        finally:
            if sbx is not None:
                await sbx.close()
            self.capture.close_session(session)
            if pump is not None:
                while not queue.empty() and notify is not None:
                    await notify(queue.get_nowait())
                pump.cancel()

        await self._phase(rec, "grade", notify)
        t = time.monotonic()
        grading_spec = SandboxSpec(
            repo_source=task.repo_source or "", base_commit=task.base_commit, workdir=task.workdir
        )
        try:
            g = await grade(
                task, patch, lambda: create_sandbox(req.sandbox, grading_spec), self.config.grading_timeout_s
            )
        except (GradingError, SandboxError) as e:
            raise RolloutFailure("grade", str(e)) from e
        timings["grade"] = time.monotonic() - t
        findings = [*session.findings, *g.findings]
        if g.dropped_files:
            findings.append(f"grading ignored the agent's edits to protected files: {g.dropped_files}")
        await self._phase(rec, "done", notify)
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
            findings=findings,
        )

    async def _extract_diff(self, sbx: Sandbox, task: Task) -> str:
        base = task.base_commit
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

    def _persist(self, result: RolloutResult) -> None:
        if self.config.results_dir is None:
            return
        self.config.results_dir.mkdir(parents=True, exist_ok=True)
        path = self.config.results_dir / f"{result.rollout_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.model_dump(mode="json")))
        tmp.replace(path)
