"""`serve --vllm-model M`: one process tree, whole stack. Starts vLLM's OpenAI server on loopback with the capture
flags, waits until it answers, and hands it (`vllm_engine` yields its URL and model) to `serve`, which makes it the
default engine of the server it starts next. vLLM runs in its own process group and is stopped with the server.

vLLM itself is found as ``$SWE_GYM_VLLM_PYTHON``, else this interpreter when it has vllm, else the ``.vllm-venv`` of
the checkout (scripts/setup_vllm.sh: the CPU build, which is how this is tested here; the checkout is
``$SWE_GYM_CHECKOUT``, else the current directory or a parent of it: see `swe_gym_env.core.procs.checkout_dir`).
``vllm serve`` is broken in the CPU build, so the module entry point is used.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from swe_gym_env.core import procs
from swe_gym_env.core.settings import setting
from swe_gym_env.core.tempdirs import socket_base
from swe_gym_env.server.engine.certify import probe_body

CAPTURE_FLAGS = ["--return-tokens-as-token-ids", "--logprobs-mode", "processed_logprobs", "--enable-auto-tool-choice"]
VLLM_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


class VllmLaunchError(RuntimeError):
    pass


@dataclass
class VllmOptions:
    model: str
    served_name: str | None = None
    tool_parser: str = "hermes"
    chat_template: str | None = None
    extra_args: list[str] = field(default_factory=list)
    python: str | None = None
    startup_timeout_s: float = 1800.0

    @property
    def name(self) -> str:
        return self.served_name or self.model


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The --vllm-* options of `serve`; each unset one is taken from its setting (SWE_GYM_VLLM_*) when used."""
    p.add_argument("--vllm-model", help="start vLLM with this model (default $SWE_GYM_VLLM_MODEL)")
    p.add_argument("--vllm-served-name", help="default $SWE_GYM_VLLM_SERVED_NAME, else the model")
    p.add_argument("--vllm-tool-parser", help="default $SWE_GYM_VLLM_TOOL_PARSER, else hermes")
    p.add_argument("--vllm-chat-template", help="default $SWE_GYM_VLLM_CHAT_TEMPLATE")
    p.add_argument("--vllm-args", help="more vLLM flags, one shell-quoted string (default $SWE_GYM_VLLM_ARGS)")
    p.add_argument("--vllm-startup-timeout", type=float, help="default $SWE_GYM_VLLM_STARTUP_TIMEOUT_S, else 1800")


def _model(args: argparse.Namespace) -> str | None:
    return getattr(args, "vllm_model", None) or setting("vllm_model")


def options_from_args(args: argparse.Namespace) -> VllmOptions:
    timeout = getattr(args, "vllm_startup_timeout", None)
    return VllmOptions(
        model=_model(args) or "",
        served_name=getattr(args, "vllm_served_name", None) or setting("vllm_served_name"),
        tool_parser=getattr(args, "vllm_tool_parser", None) or setting("vllm_tool_parser"),
        chat_template=getattr(args, "vllm_chat_template", None) or setting("vllm_chat_template"),
        extra_args=shlex.split(getattr(args, "vllm_args", None) or setting("vllm_args")),
        startup_timeout_s=timeout if timeout is not None else setting("vllm_startup_timeout_s"),
    )


def vllm_python(explicit: str | None = None) -> str:
    configured = setting("vllm_python")
    if explicit or (explicit := str(configured) if configured else None):
        if not os.access(explicit, os.X_OK):
            raise VllmLaunchError(
                f"SWE_GYM_VLLM_PYTHON={explicit} is not an executable (on a Space: set the variable "
                "SWE_GYM_VLLM_MODEL before the build, so the image bakes vLLM in)"
            )
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    try:
        side = procs.side_python(".vllm-venv")
    except ValueError as e:
        raise VllmLaunchError(f"no vLLM found: {e}") from e
    if side is not None:
        return str(side)
    raise VllmLaunchError(
        "no vLLM found: set SWE_GYM_VLLM_PYTHON to a python that has vllm, or run `bash scripts/setup_vllm.sh` in "
        f"the checkout and start the server from there (or set ${procs.CHECKOUT_ENV} to it)"
    )


def vllm_argv(opts: VllmOptions, port: int, python: str) -> list[str]:
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", opts.model]
    argv += ["--served-model-name", opts.name, "--host", "127.0.0.1", "--port", str(port)]
    argv += [*CAPTURE_FLAGS, "--tool-call-parser", opts.tool_parser]
    if opts.chat_template:
        argv += ["--chat-template", opts.chat_template]
    return argv + list(opts.extra_args)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the server process dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@contextlib.contextmanager
def running_vllm(opts: VllmOptions, log=print) -> Iterator[str]:
    """Start vLLM, wait for /health, yield its base URL (…/v1); stop it on exit."""
    python = vllm_python(opts.python)
    port = procs.free_port()
    argv = vllm_argv(opts, port, python)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({k: v for k, v in VLLM_ENV.items() if k not in os.environ})
    # vLLM's ZMQ sockets go to $VLLM_RPC_BASE_PATH (default: the temp folder) and outlive it: a folder of our own,
    # removed after; /tmp when the temp folder's path is too long for a socket's (107 bytes: <folder>/<uuid4>)
    rpc_dir = None
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        base = socket_base(len("swe-gym-vllm-rpc-12345678/") + 36)
        rpc_dir = env["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="swe-gym-vllm-rpc-", dir=base)
    try:
        with _vllm_process(opts, argv, env, port, log) as url:
            yield url
    finally:
        if rpc_dir:
            shutil.rmtree(rpc_dir, ignore_errors=True)


@contextlib.contextmanager
def _vllm_process(opts: VllmOptions, argv: list[str], env: dict[str, str], port: int, log) -> Iterator[str]:
    log_file = tempfile.NamedTemporaryFile(prefix="swe-gym-vllm-", suffix=".log", delete=False)
    log(f"starting vLLM: {shlex.join(argv)} (log: {log_file.name})")
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    log_file.close()
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            took = procs.wait_healthy(f"{base}/health", proc, opts.startup_timeout_s, interval=1.0)
        except procs.NotReady as e:
            if e.exited:
                tail = Path(log_file.name).read_text(errors="replace")[-3000:]
                raise VllmLaunchError(f"vLLM exited with {proc.returncode} before it was ready:\n{tail}") from e
            raise VllmLaunchError(
                f"vLLM not healthy after {opts.startup_timeout_s:.0f} s (log: {log_file.name})"
            ) from e
        first = _first_answer(base, opts, proc, max(60.0, opts.startup_timeout_s - took), log_file.name)
        log(f"vLLM ready in {took:.1f} s at {base}, serving {opts.name!r} (its first answer: {first:.1f} s)")
        yield f"{base}/v1"
    finally:
        # SIGTERM vLLM's process group (API server, engine core, workers), then SIGKILL what is left
        procs.stop(proc, grace=30, group=True)


def _first_answer(base: str, opts: VllmOptions, proc: subprocess.Popen, timeout_s: float, log_name: str) -> float:
    """The certification's two probes (`certify.probe_body`) before the server counts vLLM as ready: vLLM's first
    answer costs many times the next (its one-time setup, and the logprobs path's), and on a loaded 2-core machine the
    first rollout's certification timed out (`engine unreachable: ReadTimeout`). A refusal fails the start."""
    t = time.monotonic()
    for temperature in (1.0, 0.5):
        try:
            r = httpx.post(f"{base}/v1/chat/completions", json=probe_body(opts.name, temperature), timeout=timeout_s)
        except httpx.HTTPError as e:
            raise VllmLaunchError(f"vLLM is up but did not answer a first request: {e!r} (log: {log_name})") from e
        if r.status_code != 200:
            raise VllmLaunchError(
                f"vLLM refused a first request: HTTP {r.status_code}: {r.text[:500]} (log: {log_name})"
            )
    if proc.poll() is not None:
        raise VllmLaunchError(f"vLLM exited with {proc.returncode} after its first answer (log: {log_name})")
    return time.monotonic() - t


@contextlib.contextmanager
def vllm_engine(args: argparse.Namespace) -> Iterator[tuple[str, str] | None]:
    """For `serve`: when --vllm-model is set, run vLLM while the server runs and yield its base URL and served model
    (our own loopback vLLM takes no key); else yield None. Imports nothing of the server: `setup` in the Space image's
    first stage parses the command line with few of its modules there."""
    if not _model(args):
        yield None
        return
    opts = options_from_args(args)
    # uvicorn re-raises the SIGTERM it handled once it has stopped; by default that ends the process on the spot,
    # skipping the cleanup below. As SystemExit it unwinds through here and vLLM is stopped.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with running_vllm(opts, log=lambda m: print(m, file=sys.stderr, flush=True)) as url:
            yield url, opts.name
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
