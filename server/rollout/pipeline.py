"""The phases of one rollout, in order: task, engine, install, session, boot, agent, diff, grade.

The one place that composes task, capture session, sandbox, agent and grading. A phase that fails raises
`RolloutFailure`; the service turns it into a result. Sandboxes and the capture session are closed on every path.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from swe_gym_env.server.agents import provision
from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.agents.verdict import RunFacts, classify_failure
from swe_gym_env.server.capture import CaptureProxy, CaptureSession, EngineTarget
from swe_gym_env.server.engine.certify import Certificate
from swe_gym_env.server.grading import GradingError, grade, prepare, prepare_impossible, prepared, variants
from swe_gym_env.server.rollout import agent_run
from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.server.rollout.engines import Engines
from swe_gym_env.server.rollout.record import RolloutFailure, RolloutRecord, RunState
from swe_gym_env.server.rollout.workspace import extract_diff, read_text, run_task_setup, task_spec
from swe_gym_env.server.sandbox.base import Sandbox, SandboxError
from swe_gym_env.server.sandbox.registry import backend_class, create_sandbox
from swe_gym_env.tasks.catalog import PYPI_SPLIT, TaskNotFound, build_split, get_task, unbuilt
from swe_gym_env.tasks.envs import EnvError, build_env, env_ready, prepare_env, task_env
from swe_gym_env.tasks.models import Task
from swe_gym_env.wire import Finding, RolloutRequest, RolloutResult

PROMPT = """You are working in a git repository at {workdir}. Resolve the issue below by editing the source code.
Do not modify the tests. When you are done, reply with a short summary.

<issue>
{problem}
</issue>
"""


TESTS_VISIBLE = """
The tests that check this issue are in the repository ({files}); you may read and run them. Do not modify them.
"""


async def show_tests(sbx: Sandbox, task: Task) -> str:
    """`tests_visible`: apply the task's test patch in the agent's workspace and commit it, so the agent sees the
    failing tests and its diff does not carry them (grading resets the test files and re-applies the patch anyway).
    Returns the commit to diff against."""
    await sbx.write_file("/tmp/.swe-gym-tests.patch", task.test_patch.encode())
    r = await sbx.exec(
        "git apply /tmp/.swe-gym-tests.patch && rm -f /tmp/.swe-gym-tests.patch && git add -A -- . && "
        "git -c user.name=swe-gym -c user.email=swe-gym@localhost commit -q --allow-empty --no-verify "
        "-m 'task tests' && git rev-parse HEAD",
        timeout=120,
    )
    if not r.ok:
        raise RolloutFailure("boot", f"the task's test patch does not apply in the workspace: {r.stderr[-300:]}")
    return r.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds the block takes to ``timings[key]`` (also when it raises: a failed phase is timed too)."""
    t = time.monotonic()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.monotonic() - t


class Pipeline:
    def __init__(self, config: ServerConfig, capture: CaptureProxy, engines: Engines) -> None:
        self.config = config
        self.capture = capture
        self.engines = engines

    async def run(self, rec: RolloutRecord, req: RolloutRequest, state: RunState) -> RolloutResult:
        timings = state.timings
        state.result_form = req.result_form
        t_run = time.monotonic()
        try:
            harness = get_harness(req.harness)
        except AgentError as e:
            raise RolloutFailure("install", str(e)) from e
        backend = backend_class(req.sandbox)  # a pty it makes inside, or pairs opened for it (`agent_run.PTYS`)
        if harness.needs_pty and not (backend.has_ptys or backend.gives_ptys):  # else it crashes at its first command
            raise RolloutFailure(
                "validate",
                f"{req.harness} needs a pty; the {req.sandbox} sandbox can neither make one nor be given one",
            )
        harness_missing = not provision.installed(harness)
        if harness_missing and (why := provision.install_refusal(self.config.install_on_use, harness)) is not None:
            raise RolloutFailure("validate", provision.not_installed(harness, why))
        if unbuilt(req.split) and not self.config.install_on_use:
            raise RolloutFailure(
                "validate",
                f"split {req.split!r} is not built on this server and installing on first use is off here "
                f"({provision.INSTALL_ON_USE_ENV}=0): run `{provision.SETUP_ALL}` on the server, then retry",
            )
        rec.set_phase("task")
        try:
            if unbuilt(req.split):  # built once, here, on first use (its sdists come from PyPI)
                await self._first_use(rec, state, "install.split", lambda log: build_split(req.split, log))
            task = get_task(req.split, req.index, req.instance_id)
        except TaskNotFound as e:
            raise RolloutFailure("task", str(e)) from e
        state.instance_id = rec.instance_id = task.instance_id
        engine, engine_name = self.engines.choose(req)
        if not task.repo_source and not backend_class(req.sandbox).uses_image:
            raise RolloutFailure("task", f"task {task.instance_id} has no local repository source")
        cert = state.cert = await self.engines.certificate(engine_name, engine)
        if engine.served_model == "" and cert.served_model:
            engine = EngineTarget(engine.base_url, cert.served_model, engine.api_key)
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
            state.mode_findings = [
                Finding(
                    severity="info",
                    code="black_box",
                    message=f"the engine returns no token ids (capture level {cert.level}): ran black-box, eval only",
                )
            ]

        context = cert.max_model_len or self.config.context_window
        if req.mode == "capture" and context < harness.min_context_tokens:
            raise RolloutFailure(
                "validate",
                f"the engine's context is {context} tokens, below the {harness.min_context_tokens} that "
                f"{req.harness} needs (its own prompt + room to act): serve a longer context or use another harness",
            )
        env_missing = not (task.image and backend_class(req.sandbox).uses_image)  # its env is not in an image...
        env_missing = env_missing and task_env(task) is not None and not env_ready(task)  # ...and not built here yet
        if env_missing and not self.config.install_on_use:
            how = provision.SETUP_ALL if task.dataset == PYPI_SPLIT else f"swe-gym-env validate --dataset {req.split}"
            raise RolloutFailure(
                "validate",
                f"the environment of task {task.instance_id} is not built on this server and installing on first use "
                f"is off here ({provision.INSTALL_ON_USE_ENV}=0): run `{how}` on the server, then retry",
            )

        rec.set_phase("install")
        try:
            if harness_missing:
                await self._first_use(rec, state, "install.harness", lambda log: provision.install(harness, log))
            mounts = harness.mounts()
        except AgentError as e:
            raise RolloutFailure("install", str(e)) from e
        if not (task.image and backend_class(req.sandbox).uses_image):  # the task's own env is not in an image
            try:
                if env_missing:  # built once per requirement set, on the host
                    await self._first_use(rec, state, "install.env", lambda log: self._build_env(task, log))
                await prepare_env(task)  # cached
            except EnvError as e:
                raise RolloutFailure("install", str(e)) from e

        original: Task | None = None  # the task an impossible variant was made of
        if req.variant == "impossible":  # before the session: the workspace needs the mutants
            original, task = task, await self._impossible(rec, req, task, state)
        visible = req.tests_visible or original is not None  # an impossible variant's tests are always shown
        timings["prepare"] = time.monotonic() - t_run  # task, engine certificate, harness install, task env, variant
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
        rec.session = state.session = session
        session.on_turn = lambda turn: rec.emit(
            f"model call {turn.index + 1}: {turn.prompt_len} prompt + "
            f"{len(turn.completion_token_ids)} completion tokens"
        )
        sbx: Sandbox | None = None
        closing: asyncio.Future[None] | None = None
        try:
            rec.set_phase("boot")
            t = time.monotonic()
            spec = task_spec(
                task,
                req.sandbox,
                capture_socket=self.config.capture_socket,
                ro_mounts=mounts,
                labels={"rollout": rec.rollout_id, "role": "agent"},
                deadline_s=req.deadline_s + 60,  # expires by itself even if this server dies
            )
            try:
                with timed(timings, "boot.sandbox"):  # the workspace: a copy of the task's pristine tree
                    sbx = await create_sandbox(req.sandbox, spec)
                timings.update(bundle=sbx.bundle_s, bundle_bytes=float(sbx.bundle_bytes))  # agent bundle cost (in boot)
                cfg = AgentConfig(
                    base_url=sbx.capture_base_url or "",
                    model=engine.served_model,
                    context_window=context,
                    max_tokens=req.max_tokens,
                    options=dict(req.harness_options),
                    max_calls=req.max_model_calls,
                )
                prompt = PROMPT.format(workdir=sbx.agent_workdir, problem=task.problem_statement)
                if visible:
                    prompt += TESTS_VISIBLE.format(files=", ".join(task.test_files()))
                with timed(timings, "boot.config"):
                    for path, (data, mode) in harness.config_files(cfg, key, prompt).items():
                        await sbx.write_file(path, data, mode)
                if task.env_activation:  # the agent works in the environment the tests run in: it must activate
                    with timed(timings, "boot.env"):
                        r = await sbx.exec(agent_run.in_task_env("true", task.env_activation), timeout=120)
                    if not r.ok:
                        raise RolloutFailure("boot", f"the task's environment does not activate: {r.stderr[-500:]}")
                if task.setup_commands:  # the task's own setup, before the agent starts
                    with timed(timings, "boot.setup"):
                        state.diff_base = await run_task_setup(sbx, task)
                if visible:  # the test patch in the workspace, committed: not part of the agent's diff
                    with timed(timings, "boot.tests"):
                        state.diff_base = await show_tests(sbx, task)
            except SandboxError as e:
                raise RolloutFailure("boot", str(e)) from e
            timings["boot"] = time.monotonic() - t

            rec.set_phase("agent")
            t = time.monotonic()
            agent_timeout = max(5.0, state.deadline - t - min(120.0, 0.2 * req.deadline_s))  # leave time to grade
            res, stopped = await agent_run.run_agent(
                rec, sbx, harness, cfg, session, agent_timeout, timings, task.env_activation
            )
            timings["agent"] = time.monotonic() - t
            t = time.monotonic()
            state.exit_code = res.exit_code
            state.log_tail = await read_text(sbx, harness.log_path, tail=4000)
            outcome = harness.parse_events(await read_text(sbx, harness.events_path))
            agent_run.cross_check(req, outcome, session, state)
            if (why := agent_run.engine_failure(session)) is not None:
                raise RolloutFailure("agent", why, "engine_failures")
            errors = agent_run.unrecovered_errors(session, state)
            forgiven = len(errors) < len(session.errors) and outcome.error_kind is None
            facts = RunFacts(
                # OpenCode exits 1 after any error, also a refusal it compacted after and went on from
                exit_code=0 if forgiven and res.exit_code == 1 else res.exit_code,
                timed_out=res.timed_out,
                timeout_s=agent_timeout,
                calls=agent_run.answered(req, session),
                proxy_errors=errors,
                budget_exhausted=session.stop_reason == "budget_exhausted",
                stopped_after_budget=stopped,
                stderr_tail=res.stderr[-500:] or state.log_tail[-500:],
            )
            if (failure := classify_failure(outcome, facts)) is not None:
                kind, message = failure
                raise RolloutFailure("agent", f"{kind}: {message}", "timeout" if kind == "timeout" else None)
            if state.missing_steps:  # the agent used model calls the capture never saw: not its trace
                raise RolloutFailure("agent", f"cross-check mismatch: {state.cross_check[1]}")

            timings["after_agent"] = time.monotonic() - t  # its log and events read, the cross-check

            rec.set_phase("diff")
            with timed(timings, "diff"):
                state.patch = patch = await extract_diff(sbx, state.diff_base or task.base_commit)
            closing = asyncio.ensure_future(sbx.close())  # its teardown overlaps the checks and grading below
        finally:
            if sbx is not None and closing is None:  # failed before the diff: closed before the failure is told
                with timed(timings, "close"):
                    await sbx.close()
            self.capture.close_session(session)
        assert closing is not None  # set on the one path that gets here
        try:
            return await self._grade(rec, req, task, session, cert, state, patch, original)
        finally:
            with timed(timings, "close"):  # what grading did not hide of the agent sandbox's teardown
                await closing

    @staticmethod
    async def _first_use(
        rec: RolloutRecord, state: RunState, key: str, work: Callable[[Callable[[str], None]], object]
    ):
        """Install what the rollout needs and this server lacks (blocking ``work(log)``, in a thread): its lines go
        to the server's log and the rollout's progress; the time it takes is timed under ``key`` and does not count
        against the rollout's deadline (it is this server's setup, not the rollout's work)."""
        loop = asyncio.get_running_loop()

        def log(line: str) -> None:
            print(f"swe-gym-env: rollout {rec.rollout_id}: {line}", file=sys.stderr, flush=True)
            with contextlib.suppress(RuntimeError):  # the loop is gone (the process is ending): the log line stays
                loop.call_soon_threadsafe(rec.emit, line)

        with state.deadline_paused(), timed(state.timings, key):
            await asyncio.to_thread(work, log)

    def _grading_sandboxes(self, rec: RolloutRecord, req: RolloutRequest, task: Task):
        """A factory of this rollout's grading sandboxes (fresh, at the task's base commit)."""
        spec = task_spec(
            task,
            req.sandbox,
            labels={"rollout": rec.rollout_id, "role": "grading"},
            deadline_s=self.config.grading_timeout_s + 120,
        )
        return lambda: create_sandbox(req.sandbox, spec)

    async def _impossible(self, rec: RolloutRecord, req: RolloutRequest, task: Task, state: RunState) -> Task:
        """The task's impossible variant (`variants.impossible`). Where its canaries are not built here yet they are
        built first, as grading's `prepare` builds them: the server's setup, outside the rollout's deadline."""
        rec.set_phase("boot")
        make = self._grading_sandboxes(rec, req, task)
        try:
            if variants.needs_build(task):
                rec.emit(f"building the canaries of task {task.instance_id} for its impossible variant (once)")
                with state.deadline_paused(), timed(state.timings, "boot.variant"):
                    await prepare_impossible(task, make, self.config.grading_timeout_s, req.sandbox)
            return variants.impossible(task)
        except variants.NoVariant as e:
            raise RolloutFailure("boot", str(e)) from e
        except (GradingError, SandboxError) as e:
            why = f"task {task.instance_id}: its impossible variant could not be built: {e}"
            raise RolloutFailure("boot", why) from e

    @staticmethod
    def _build_env(task: Task, log: Callable[[str], None]) -> None:
        log(f"the environment of task {task.instance_id} is not built on this server: building it now, on first use")
        build_env(task, log)
        log(f"{task.instance_id}: environment ready")

    async def _grade(
        self,
        rec: RolloutRecord,
        req: RolloutRequest,
        task: Task,
        session: CaptureSession,
        cert: Certificate,
        state: RunState,
        patch: str,
        original: Task | None = None,
    ) -> RolloutResult:
        """The capture's last checks, grading in a fresh sandbox, the result. ``original``: ``task`` is its
        impossible variant (no canary check of its own; a 1.0 is a cheat: `variants.score`)."""
        timings = state.timings
        fatal = [f for f in session.findings if f.severity == "fatal"]
        if fatal:  # the capture is not usable training data, whatever the reward: do not even grade it
            raise RolloutFailure("agent", f"capture validation: {fatal[0]}")
        if req.mode == "capture" and not agent_run.saw_task(session, task.problem_statement):
            raise RolloutFailure(
                "agent",
                "no agent call carried the task's problem statement: the agent never saw the task (compacted or "
                "replaced its prompt before its first call?)",
            )

        rec.set_phase("grade")
        t = time.monotonic()
        make = self._grading_sandboxes(rec, req, task)
        use_canaries = self.config.canaries and original is None
        try:
            if not prepared(task, req.sandbox, use_canaries):
                # a task's first grading here: its run time, empty-patch baseline and canaries are measured once
                # (kept on disk); the server's setup, not the rollout's time
                with state.deadline_paused(), timed(timings, "grade.prepare"):
                    await prepare(task, make, self.config.grading_timeout_s, req.sandbox, use_canaries)
            g = await grade(
                task,
                patch,
                make,
                self.config.grading_timeout_s,
                timings=timings,
                cache_key=req.sandbox,
                deadline_s=state.deadline - time.monotonic(),  # every test run's timeout is capped by what is left
                use_canaries=use_canaries,
                variant_of=original,
            )
        except (GradingError, SandboxError) as e:
            raise RolloutFailure("grade", str(e)) from e
        if original is not None:
            g = variants.score(g)  # a 1.0 on an impossible variant is a cheat
        timings["grade"] = time.monotonic() - t
        t = time.monotonic()
        findings = [*state.findings(), *g.findings]
        if g.dropped_files:
            findings.append(
                Finding(
                    severity="info",
                    code="protected_files",
                    message=f"grading ignored the agent's edits to protected files: {g.dropped_files}",
                )
            )
        rec.set_phase("done")
        result = RolloutResult(
            rollout_id=rec.rollout_id,
            ok=True,
            reward=g.reward,
            instance_id=task.instance_id,
            harness=req.harness,
            sandbox=req.sandbox,
            stop_reason=session.stop_reason or "agent_done",
            grading=g.report,
            **state.trace(),
            capture_level="text" if req.mode == "black_box" else cert.level,
            logprobs_mode=None if req.mode == "black_box" else cert.logprobs_mode,
            findings=findings,
            variant=req.variant,
        )
        timings["result"] = time.monotonic() - t
        return result
