"""The built-in engine inside `serve` when no engine is configured, so a fresh Space answers its first rollout.

It runs in the server's process (uvicorn in a thread, on a free loopback port) with policy `oracle`, and is NOT a
model: `builtin_engine()` is what the startup log, /health and /web say about it. An engine that is configured but
does not answer is never replaced by this one: its rollouts fail with `engine unreachable`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from swe_gym_env.core.procs import free_port
from swe_gym_env.core.settings import setting
from swe_gym_env.server.capture import EngineTarget

START_TIMEOUT_S = 60.0
# the built-in engine while it is this process's default engine: set by `builtin_unless_configured` alone (the one
# code that starts it), None otherwise; what `builtin_engine()` and `ServerConfig.from_env` read
running: EngineTarget | None = None
running_policy: str | None = None


def builtin_engine() -> dict | None:
    """When this server runs the built-in engine: what it is, in words a visitor reads; else None."""
    policy = running_policy
    if not policy:
        return None
    return {
        "builtin": True,
        "policy": policy,
        "note": f"NOT a model: no engine is configured, so this server runs the built-in engine, which replays "
        f"scripted replies (policy '{policy}': the task's reference patch). For demos and evaluation of the pipeline "
        "only; rewards mean nothing about a model. Set SWE_GYM_ENGINE_URL (or --vllm-model) to use a model.",
    }


@contextlib.contextmanager
def builtin_unless_configured(
    served_model: str, log: Callable[[str], None], configured: EngineTarget | None = None
) -> Iterator[EngineTarget | None]:
    """With no engine ``configured`` (nor $SWE_GYM_ENGINE_URL): run the built-in engine while the block runs and yield
    it, the default engine (no key: it takes none); with one: yield ``configured``, and nothing starts."""
    global running, running_policy
    if configured is not None or setting("engine_url"):
        running, running_policy = None, None  # only this function says the built-in engine runs
        yield configured
        return
    from swe_gym_env.server.engine.policy import make_policy

    policy = make_policy("oracle")
    context = _context_for_every_harness()
    with _engine_thread(policy, served_model, context) as port:
        running, running_policy = EngineTarget(f"http://127.0.0.1:{port}/v1", served_model), policy.name
        log(f"built-in engine on 127.0.0.1:{port}, context {context}. {(builtin_engine() or {})['note']}")
        try:
            yield running
        finally:
            running, running_policy = None, None


def _context_for_every_harness() -> int:
    from swe_gym_env.server.agents.registry import HARNESSES

    return max(8192, *(cls.min_context_tokens for cls in HARNESSES.values()))  # room for every harness


@contextlib.contextmanager
def _engine_thread(policy, served_model: str, context: int) -> Iterator[int]:
    """The engine app under uvicorn in a daemon thread on a free loopback port (yielded once it listens)."""
    import uvicorn

    from swe_gym_env.core.assets import tokenizer_file
    from swe_gym_env.server.engine.app import Engine, create_engine_app
    from swe_gym_env.server.engine.chat import ChatRenderer

    delay = setting("engine_delay_s")  # SWE_GYM_ENGINE_DELAY_S: to watch a rollout unfold (UI tests, demos)
    engine = Engine(ChatRenderer(tokenizer_file()), policy, served_model, max_model_len=context, delay_s=delay)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_engine_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="builtin-engine", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the built-in engine did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
