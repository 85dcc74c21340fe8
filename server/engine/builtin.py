"""The built-in engine inside `serve` when no engine is configured, so a fresh Space answers its first rollout.

It runs in the server's process (uvicorn in a thread, on a free loopback port) with policy `oracle`, and is NOT a
model: `builtin_engine()` is what the startup log, /health and /web say about it. An engine that is configured but
does not answer is never replaced by this one: its rollouts fail with `engine unreachable`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator

from swe_gym_env.core.procs import free_port
from swe_gym_env.core.settings import setting

BUILTIN_ENGINE_ENV = "SWE_GYM_BUILTIN_ENGINE"  # set while the built-in engine is the default engine: its policy
START_TIMEOUT_S = 60.0


def builtin_engine() -> dict | None:
    """When this server runs the built-in engine: what it is, in words a visitor reads; else None."""
    policy = os.environ.get(BUILTIN_ENGINE_ENV)
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
def builtin_unless_configured(served_model: str, log: Callable[[str], None]) -> Iterator[None]:
    """With $SWE_GYM_ENGINE_URL unset: the built-in engine becomes the default engine (SWE_GYM_ENGINE_URL /
    _MODEL set to it) while the block runs; with it set, nothing changes."""
    if setting("engine_url"):
        os.environ.pop(BUILTIN_ENGINE_ENV, None)  # only this function says the built-in engine runs
        yield
        return
    import uvicorn

    from swe_gym_env.core.assets import tokenizer_file
    from swe_gym_env.server.agents.registry import HARNESSES
    from swe_gym_env.server.engine.app import Engine, create_engine_app
    from swe_gym_env.server.engine.chat import ChatRenderer
    from swe_gym_env.server.engine.policy import make_policy

    policy = make_policy("oracle")
    context = max(8192, *(cls.min_context_tokens for cls in HARNESSES.values()))  # room for every harness
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
    os.environ["SWE_GYM_ENGINE_URL"] = f"http://127.0.0.1:{port}/v1"
    os.environ["SWE_GYM_ENGINE_MODEL"] = served_model
    os.environ[BUILTIN_ENGINE_ENV] = policy.name
    os.environ.pop("SWE_GYM_ENGINE_API_KEY", None)  # it takes no key; a configured one is for another engine
    log(f"built-in engine on 127.0.0.1:{port}, context {context}. {(builtin_engine() or {})['note']}")
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
