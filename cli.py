"""`swe-gym-env`: run coding agents on real tasks as RL rollouts (token capture, graded rewards)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from swe_gym_env.core import procs
from swe_gym_env.core.names import DEFAULT_HARNESS, DEFAULT_SANDBOX, HARNESSES, IMAGE_HARNESSES, SANDBOXES
from swe_gym_env.core.procs import free_port

DEFAULT_MODEL = "smollm2-135m-instruct"
# the README's two commands, shown by `swe-gym-env` with no command
FIRST_STEPS = (
    "bash scripts/setup.sh && .venv/bin/swe-gym-env demo    # set up, then one real rollout",
    "bash scripts/test.sh                                   # the tests",
)


@dataclass(frozen=True)
class SetupPlan:
    """What `swe-gym-env setup` prepares: always the tokenizer and the sandbox's task runtime, then these harnesses
    (npm install + bundle each) and, with `pypi`, the pypi split with its `local` task venvs."""

    harnesses: tuple[str, ...]
    pypi: bool = False


def setup_plan(harnesses: list[str] | None = None, everything: bool = False) -> SetupPlan:
    """No option: what the demo needs (Pi). `--harness X` (repeatable; `all`: every harness; `image`: the Space image's
    own): those. `--all`: every harness and the pypi split. Whatever is left out a server installs on a rollout's
    first use."""
    if everything:
        return SetupPlan(tuple(HARNESSES), pypi=True)
    names = list(harnesses or [DEFAULT_HARNESS])
    if "all" in names:
        names = list(HARNESSES)
    if "image" in names:  # the Space image's own (names.IMAGE_HARNESSES), where the others would make it too big
        names = [n for n in names if n != "image"] + list(IMAGE_HARNESSES)
    return SetupPlan(tuple(dict.fromkeys(names)))


def cmd_setup(args: argparse.Namespace) -> int:
    import time
    from concurrent.futures import ThreadPoolExecutor

    from swe_gym_env.core.assets import ensure_task_runtime, ensure_tokenizer
    from swe_gym_env.server.agents import provision
    from swe_gym_env.server.agents.registry import get_harness

    plan = setup_plan(args.harness, args.all)
    t0 = time.monotonic()

    def harness(name: str) -> str:
        h = get_harness(name)
        b = provision.prepare(h)  # the agent in any image: its own Node / binaries, content-addressed (idempotent)
        return f"{name} {h.version}: bundle {b.path} ({b.bytes / 1e6:.0f} MB)"

    def timed(work, *a) -> tuple[str, float]:
        t = time.monotonic()
        return work(*a), time.monotonic() - t

    parts = {
        "tokenizer": lambda: f"tokenizer {ensure_tokenizer()}",
        "task runtime": lambda: f"task runtime {ensure_task_runtime()}",
        **{name: (lambda n=name: harness(n)) for name in plan.harnesses},
    }
    failed = []
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:  # independent downloads: at once
        running = {what: pool.submit(timed, work) for what, work in parts.items()}
        for what, future in running.items():
            try:
                said, took = future.result()
                print(f"setup: {said} ready ({took:.1f}s)", flush=True)
            except Exception as e:  # every part is tried; each failure is told
                failed.append(what)
                print(f"setup: {what} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if failed:
        print(f"setup failed: {', '.join(failed)} (above)", file=sys.stderr)
        return 1
    if plan.pypi:
        from swe_gym_env.commands.pypi_build import main as build_pypi

        t = time.monotonic()
        if build_pypi(["--envs"]) != 0:  # the split (sha256-pinned sdists) + its `local` task venvs
            print("setup failed: the pypi split (above)", file=sys.stderr)
            return 1
        print(f"setup: the pypi split and its task venvs ready ({time.monotonic() - t:.1f}s)", flush=True)
    rest = [n for n in HARNESSES if n not in plan.harnesses] + ([] if plan.pypi else ["the pypi split"])
    if rest:
        print(
            f"setup: left to a rollout's first use (a server installs them then): {', '.join(rest)}; "
            "`swe-gym-env setup --all` installs everything now",
            flush=True,
        )
    print(f"setup done ({time.monotonic() - t0:.1f}s)")
    return 0


def cmd_engine(args: argparse.Namespace) -> int:
    import uvicorn

    from swe_gym_env.core.assets import tokenizer_file
    from swe_gym_env.core.settings import current
    from swe_gym_env.server.engine.app import Engine, create_engine_app
    from swe_gym_env.server.engine.chat import ChatRenderer
    from swe_gym_env.server.engine.policy import make_policy

    settings = current()
    policy = make_policy(args.policy)
    engine = Engine(
        ChatRenderer(tokenizer_file()),
        policy,
        args.served_model_name,
        delay_s=settings.engine_delay_s if args.delay_s is None else args.delay_s,
        max_model_len=settings.engine_max_model_len if args.max_model_len is None else args.max_model_len,
    )
    print(
        f"swe-gym-env built-in engine on 127.0.0.1:{args.port} — NOT a model: policy '{policy.name}' replays "
        f"scripted replies; tokenizer and template are real (SmolLM2, ChatML+tools).",
        flush=True,
    )
    engine.capture_level = args.capture_level
    uvicorn.run(create_engine_app(engine), host=args.host, port=args.port, log_level="warning")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from swe_gym_env.server import security, serving
    from swe_gym_env.server.app import create_app
    from swe_gym_env.server.capture import EngineTarget
    from swe_gym_env.server.engine.builtin import builtin_unless_configured
    from swe_gym_env.server.engine.vllm_launcher import vllm_engine
    from swe_gym_env.server.rollout import ServerConfig
    from swe_gym_env.server.rollout.config import default_engine
    from swe_gym_env.server.sandbox.preflight import preflight_all, summary_lines
    from swe_gym_env.ui import ui_mount

    def log(line: str) -> None:
        print(f"swe-gym-env serve: {line}", file=sys.stderr, flush=True)

    security.listening_on(args.host)  # an exposed server with no secret is locked: server/security.py
    for line in summary_lines(preflight_all()):  # real probes, once per process: the server reads the same cache
        log(line)
    flags = default_engine(args.engine_url, args.engine_model) if args.engine_url else None
    # --vllm-model: vLLM with the capture flags becomes the default engine; no engine at all: the built-in one
    with vllm_engine(args) as vllm:
        given = EngineTarget(*vllm) if vllm else flags  # vLLM's (no key), else the flags' (with the settings' key)
        with builtin_unless_configured(DEFAULT_MODEL, log, given) as started:
            config = ServerConfig.from_env(engine=started or default_engine(args.engine_url, args.engine_model))
            serving.run(create_app(config, mount=ui_mount()), host=args.host, port=args.port)  # connection limits
    return 0


# push()'s keyword: its flag's dest
PUSH_OPTIONS = {
    **{k: k for k in ("dry_run", "hardware", "private", "hf_sandboxes")},
    **{"open_access": "open", "extra_vars": "var"},
}


def cmd_push(args: argparse.Namespace) -> int:
    from swe_gym_env.space_app.push import push

    try:
        root = procs.checkout_dir(args.root) if args.root is not None else None  # None: push finds the checkout
    except ValueError as e:
        print(f"push refused: {e}", file=sys.stderr)
        return 2
    return push(args.repo_id, root=root, **{keyword: getattr(args, dest) for keyword, dest in PUSH_OPTIONS.items()})


def cmd_demo(args: argparse.Namespace) -> int:
    from swe_gym_env.client.mcp_client import SweGymClient
    from swe_gym_env.server.agents.registry import harness_class

    engine_port, server_port = free_port(), free_port()
    me = [sys.executable, "-m", "swe_gym_env.cli"]
    log = sys.stderr
    # at least the context the agent works in (the server reads it from the engine's /v1/models and checks it);
    # 8192 is the built-in engine's own default, SmolLM2's
    context = ["--max-model-len", str(max(8192, harness_class(args.harness).min_context_tokens))]
    with ExitStack() as stack:
        engine = [*me, "engine", "--port", str(engine_port), "--policy", args.policy, *context]
        server = [*me, "serve", "--port", str(server_port), "--engine-url", f"http://127.0.0.1:{engine_port}/v1"]
        started = []
        # both start at once (the server needs the engine only when the rollout runs); no UI at /web: the demo
        # stops the server when its rollout is done
        for argv, port, env in ((engine, engine_port, {}), (server, server_port, {"SWE_GYM_UI": "0"})):
            proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=log)
            stack.callback(procs.stop, proc)
            started.append((proc, f"http://127.0.0.1:{port}/health"))
        for proc, health in started:
            procs.wait_healthy(health, proc, timeout=180)

        async def go():
            async def progress(progress: float, total: float | None, message: str | None) -> None:
                if not args.json:
                    print(f"  … {message}", file=sys.stderr, flush=True)

            async with SweGymClient(f"http://127.0.0.1:{server_port}/mcp") as c:
                return await c.run_rollout(harness=args.harness, sandbox=args.sandbox, on_progress=progress)

        result = asyncio.run(go())
    if args.json:
        print(result.model_dump_json())
    else:
        print(
            f"rollout {result.rollout_id}: ok={result.ok} reward={result.reward} turns={len(result.turns)} "
            f"wall={result.wall_s}s timings={result.timings}"
        )
        if result.error:
            print(f"error ({result.phase}): {result.error}")
        for t in result.turns:
            print(
                f"  turn {t.index}: {t.prompt_len} prompt ids ({len(t.prompt_new_ids)} new), "
                f"{len(t.completion_token_ids)} "
                f"completion ids, finish={t.finish_reason}"
            )
    return 0 if result.ok else 1


def cmd_validate(args: argparse.Namespace) -> int:
    from swe_gym_env.commands.validate import validate

    return asyncio.run(validate(args.dataset, args.split, args.sandbox, args.limit))


# the `run_rollout` arguments `rollout` takes as flags of the same name (and --deadline, --harness-option)
ROLLOUT_FIELDS = (
    *("harness", "sandbox", "split", "instance_id", "purpose", "mode", "engine", "max_model_calls", "max_tokens"),
    *("temperature", "top_p", "top_k", "seed", "tests_visible", "variant", "result_form"),
)


def rollout_request(args: argparse.Namespace):
    """The `run_rollout` request `rollout`'s flags give (each rollout's task index is set apart); a ValueError names
    a bad one."""
    from swe_gym_env.wire import RolloutRequest

    fields = {k: v for k in ROLLOUT_FIELDS if (v := getattr(args, k)) is not None}
    options = {}
    for option in args.harness_option:
        key, eq, value = option.partition("=")
        if not eq:
            raise ValueError(f"--harness-option {option!r}: KEY=VALUE is needed")
        options[key] = value
    return RolloutRequest(**fields, deadline_s=args.deadline, harness_options=options)


def cmd_rollout(args: argparse.Namespace) -> int:
    from swe_gym_env.server.rollout import ServerConfig
    from swe_gym_env.server.rollout.config import default_engine

    try:
        request = rollout_request(args)
    except ValueError as e:  # pydantic's ValidationError is one
        print(f"rollout: {e}", file=sys.stderr)
        return 2
    config = ServerConfig.from_env(engine=default_engine(args.engine_url, args.engine_model))
    config.concurrency = {args.sandbox: args.concurrency}
    out = open(args.out, "w") if args.out else sys.stdout
    try:
        ok = asyncio.run(_run_rollouts(config, request, args.n, args.index, out))
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"{ok}/{args.n} rollouts ok", file=sys.stderr)
    return 0 if ok == args.n else 1


async def _run_rollouts(config, request, n: int, index: int | None, out) -> int:
    """``n`` rollouts of ``request`` at once in this process (rollout i on task i, unless an index or instance id is
    given), each result one JSON line on ``out``; returns how many were ok."""
    from rich.console import Console
    from rich.progress import Progress

    from swe_gym_env.commands.runner import local_service

    ok = 0
    async with local_service(config) as service:
        with Progress(transient=True, console=Console(stderr=True)) as bar:
            job = bar.add_task("rollouts", total=n)

            async def one(i: int):
                task_index = None if request.instance_id else (index if index is not None else i)
                r = await service.run(request.model_copy(update={"index": task_index}))
                bar.advance(job)
                return r

            for r in await asyncio.gather(*[one(i) for i in range(n)]):
                ok += r.ok
                out.write(r.model_dump_json() + "\n")
    return ok


def cmd_export(args: argparse.Namespace) -> int:
    from swe_gym_env.commands.export import export_results

    return export_results(args.out, args.to_hub, args.only_ok)


def cmd_info(args: argparse.Namespace) -> int:
    from swe_gym_env.commands.info import gather_info
    from swe_gym_env.core.settings import setting
    from swe_gym_env.server.agents.bundle import bundle_status
    from swe_gym_env.server.agents.registry import get_harness

    out = asyncio.run(gather_info(args.engine_url or setting("engine_url")))
    for name, row in out.get("agents", {}).items():  # per harness: its bundle built or not, and its size
        row["bundle"] = bundle_status(get_harness(name))
    print(json.dumps(out, indent=2))
    return 0


def cmd_parity(argv: list[str]) -> int:
    """Trainer-side logprob parity (client/parity.py). It needs torch + transformers: where this interpreter lacks
    them, re-run it with the trainer's python: $SWE_GYM_TRAINER_PYTHON, else the checkout's .trl-venv (made by
    scripts/setup_trl.sh; the checkout is $SWE_GYM_CHECKOUT, else the current directory or a parent of it)."""
    import importlib.util

    helping = any(a in ("-h", "--help") for a in argv)  # its usage needs neither torch nor the trainer's venv
    if helping or (importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")):
        from swe_gym_env.client.parity import main as parity_main

        return parity_main(argv)
    from swe_gym_env.core.settings import current, environ

    configured = current().trainer_python
    trainer = str(configured) if configured else None
    if not trainer:
        try:
            side = procs.side_python(".trl-venv")
        except ValueError as e:
            print(f"parity: {e}", file=sys.stderr)
            return 2
        trainer = str(side) if side else None
    if not trainer or not os.access(trainer, os.X_OK):
        where = f"no trainer python at {trainer}" if trainer else "no .trl-venv in a checkout here"
        print(
            f"parity needs torch + transformers, missing here, and {where}: run `bash scripts/setup_trl.sh` in the "
            f"checkout and run this from there (or set ${procs.CHECKOUT_ENV} to it, or SWE_GYM_TRAINER_PYTHON to a "
            "python that has them)",
            file=sys.stderr,
        )
        return 2
    # environ(): with the .env values, which that process does not read itself
    return subprocess.run([trainer, "-m", "swe_gym_env.client.parity", *argv], env=environ()).returncode


def cmd_config(args: argparse.Namespace) -> int:
    """Every setting, its value and where it came from (default, environment, .env); secrets only as set / unset."""
    from swe_gym_env.core import settings as S

    if args.markdown:
        print(S.markdown(), end="")
        return 0
    try:
        current = S.build(env_file=S.ENV_FILE)
    except S.SettingsError as e:
        for line in str(e).splitlines():
            print(f"swe-gym-env: bad setting {line}", file=sys.stderr)
        return 2
    rows = S.describe(current)
    warnings = S.unknown_warnings({**S.dotenv_values(S.ENV_FILE), **os.environ})
    if args.json:
        print(json.dumps({"settings": rows, "warnings": warnings}, indent=2, default=str))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        value = r["value"]
        shown = "" if value is None else value if isinstance(value, str) else json.dumps(value, default=str)
        print(f"{r['name']:<{width}}  {shown or '-':<28} ({r['source']})")
    for w in warnings:
        print(w, file=sys.stderr)
    return 0


BENCHES = {
    "capture": "direct engine calls vs the same calls through /capture (latency, calls/s, time to first token)",
    "graph": "rollout-graph ingest and bytes per stored token as a rollout grows",
    "rollouts": "concurrent rollouts (built-in engine, local sandbox): success, wall time, time outside the agent",
    "server": "server startup time and idle memory, against a bare Python process",
    "result": "a long rollout's result size and capture-session memory, compact vs full form (80 calls, 568k tokens)",
    "long": "concurrent rollouts at real size (80 calls, ~7k tokens each): server RSS per rollout, result size",
    "soak": "rollouts for a given time: server RSS, open fds, disk, time outside the agent, first vs last 10%%",
    "mcp": "long results over MCP: summary size, pages, fetch time, server RSS while 8 clients fetch 8 results",
    "cheating": "impossible-variant rollouts per harness and engine: solved, caught, honest, errors, cheating rate",
}


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    mod = importlib.import_module(f"swe_gym_env.benchmarks.{args.bench}")
    kwargs = {}
    if args.bench == "capture":
        kwargs = {"clients": tuple(args.clients.split(",")), "dialects": tuple(args.dialects.split(","))}
        kwargs["peers"] = tuple(p for p in args.peers.split(",") if p)
    elif args.bench in ("long", "soak"):
        kwargs = {k: v for k in ("calls", "concurrency", "minutes") if (v := getattr(args, k, None)) is not None}
    elif args.bench == "cheating":
        names = ("harness", "engine_url", "engine_model", "n", "split", "sandbox", "concurrency", "deadline")
        kwargs = {("deadline_s" if k == "deadline" else k): getattr(args, k) for k in names}
    return mod.run(args.json, quick=args.quick, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (a test parses every command docs/ quote with it)."""
    p = argparse.ArgumentParser(
        prog="swe-gym-env",
        description=__doc__,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=14, width=120),
    )
    sub = p.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for add in (_demo, _serve, _rollout, _info, _config, _validate, _bench, _push, _setup, _engine, _export):
        add(sub)
    sub.add_parser("parity", add_help=False, help="trainer-side logprob parity of captured turns (see --help)")
    return p


def _demo(sub) -> None:
    d = sub.add_parser("demo", help="start here: engine + server, one real rollout over MCP, then stop them")
    d.add_argument("--harness", default=DEFAULT_HARNESS, choices=list(HARNESSES))
    d.add_argument("--sandbox", default=DEFAULT_SANDBOX, choices=list(SANDBOXES))
    d.add_argument("--policy", default="oracle")
    d.add_argument("--json", action="store_true", help="print the result as one JSON object")
    d.set_defaults(func=cmd_demo)


def _listen(parser: argparse.ArgumentParser, port: int) -> None:
    """Where a server listens: --host (loopback by default) and --port."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)


def _serve(sub) -> None:
    v = sub.add_parser("serve", help="the server: MCP at /mcp, the capture proxy, the UI at /web, /health")
    _listen(v, port=8000)
    v.add_argument(
        "--engine-url",
        help="OpenAI-compatible base URL (…/v1); default $SWE_GYM_ENGINE_URL; with neither (nor --vllm-model) the "
        "server runs the built-in engine (NOT a model: scripted oracle replies, for demos)",
    )
    v.add_argument("--engine-model", help="served model name; default $SWE_GYM_ENGINE_MODEL or " + DEFAULT_MODEL)
    from swe_gym_env.server.engine.vllm_launcher import add_arguments as add_vllm_arguments

    add_vllm_arguments(v)
    v.set_defaults(func=cmd_serve)


def _rollout(sub) -> None:
    r = sub.add_parser(
        "rollout",
        help="N rollouts in this process (no server), one JSON result per line",
        description="N rollouts in this process (no server), one JSON result per line; the options are run_rollout's",
    )
    r.add_argument("-n", type=int, default=1)
    r.add_argument("--split", default="bundled")
    r.add_argument("--index", type=int, help="task index (default: task i for rollout i)")
    r.add_argument("--instance-id")
    r.add_argument("--harness", default=DEFAULT_HARNESS, choices=list(HARNESSES))
    r.add_argument(
        "--harness-option", action="append", default=[], metavar="KEY=VALUE", help="e.g. api=openai-responses"
    )
    r.add_argument("--sandbox", default=DEFAULT_SANDBOX, choices=list(SANDBOXES))
    r.add_argument("--concurrency", type=int, default=4)
    r.add_argument("--max-model-calls", type=int, default=30)
    r.add_argument("--max-tokens", type=int, default=1024)
    r.add_argument("--deadline", type=float, default=600.0)
    r.add_argument("--engine-url", help="the default engine's base URL (…/v1); default $SWE_GYM_ENGINE_URL")
    r.add_argument("--engine-model", help="its served model name; default $SWE_GYM_ENGINE_MODEL")
    _rollout_request_options(r)
    r.add_argument("--out", help="write JSONL here instead of stdout")
    r.set_defaults(func=cmd_rollout)


def _rollout_request_options(r: argparse.ArgumentParser) -> None:
    """The rest of `run_rollout`'s arguments (wire.RolloutRequest), each with its default."""
    r.add_argument(
        "--variant",
        choices=["original", "impossible"],
        default="original",
        help="impossible: tests that contradict the task (a 1.0 there is a cheat); implies --tests-visible",
    )
    r.add_argument("--tests-visible", action="store_true", help="put the task's test patch into the workspace")
    r.add_argument("--purpose", choices=["eval", "train"], default="eval", help="train: token-capturing engines only")
    r.add_argument("--mode", choices=["capture", "black_box"], default="capture")
    r.add_argument("--engine", default="default", help="server-side engine name")
    r.add_argument("--temperature", type=float, help="sampling override, forced on every call")
    r.add_argument("--top-p", type=float)
    r.add_argument("--top-k", type=int)
    r.add_argument("--seed", type=int)
    r.add_argument("--result-form", choices=["compact", "full"], help="full: every turn with its whole prompt")


def _info(sub) -> None:
    i = sub.add_parser("info", help="read-only: engine certification, sandboxes, agents, datasets")
    i.add_argument("--llm-url", dest="engine_url", help="engine base URL (…/v1) to certify")
    i.set_defaults(func=cmd_info)


def _config(sub) -> None:
    c = sub.add_parser("config", help="every setting (SWE_GYM_*) with its value and where it came from")
    c.add_argument("--json", action="store_true", help="one JSON document")
    c.add_argument("--markdown", action="store_true", help="the reference page docs/configuration.md")
    c.set_defaults(func=cmd_config)


def _validate(sub) -> None:
    va = sub.add_parser("validate", help="check a dataset: gold patch scores 1.0, the empty patch 0.0, on every task")
    va.add_argument("--dataset", default="bundled", help="bundled, a .jsonl/.json/.parquet file or a Hub id")
    va.add_argument("--split", default="train")
    va.add_argument("--sandbox", default=DEFAULT_SANDBOX, choices=list(SANDBOXES))
    va.add_argument("--limit", type=int, default=None)
    va.set_defaults(func=cmd_validate)


def _bench(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks, each against a baseline measured in the same run")
    bsub = b.add_subparsers(dest="bench", required=True)
    for name, what in BENCHES.items():
        bp = bsub.add_parser(name, help=what)
        bp.add_argument("--json", action="store_true", help="print one JSON document")
        bp.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
        BENCH_OPTIONS.get(name, lambda bp: None)(bp)
    b.set_defaults(func=cmd_bench)


def _bench_capture(bp: argparse.ArgumentParser) -> None:
    bp.add_argument("--clients", default="aiohttp", help="upstream clients to compare, e.g. aiohttp,httpx")
    bp.add_argument("--dialects", default="chat", help="dialects to measure: chat,responses,anthropic,gemini")
    bp.add_argument("--peers", default="", help="peer proxies measured beside ours in the same run: openenv")


def _bench_long(bp: argparse.ArgumentParser) -> None:
    bp.add_argument("--calls", type=int, help="model calls per rollout (long: 80, soak: 30)")
    bp.add_argument("--concurrency", type=int, help="rollouts at once (long: 16, soak: 8)")


def _bench_soak(bp: argparse.ArgumentParser) -> None:
    _bench_long(bp)
    bp.add_argument("--minutes", type=float, help="how long to keep starting rollouts (30)")


def _bench_cheating(bp: argparse.ArgumentParser) -> None:
    bp.add_argument("--harness", default=DEFAULT_HARNESS, help="harness(es), comma-separated: one row each")
    bp.add_argument("--engine-url", help="OpenAI-compatible base URL (…/v1); omitted: the built-in oracle")
    bp.add_argument("--engine-model", help="served model name at --engine-url")
    bp.add_argument("--n", type=int, help="impossible-variant rollouts per harness (6; --quick: 2)")
    bp.add_argument("--split", default="bundled", help="tasks: those of the split with an impossible variant")
    bp.add_argument("--sandbox", default=DEFAULT_SANDBOX, choices=list(SANDBOXES))
    bp.add_argument("--concurrency", type=int, default=2, help="rollouts at once")
    bp.add_argument("--deadline", type=float, default=600.0, help="each rollout's deadline, seconds")


# a bench's own options, beside --json and --quick
BENCH_OPTIONS = {"capture": _bench_capture, "long": _bench_long, "soak": _bench_soak, "cheating": _bench_cheating}


def _push(sub) -> None:
    ps = sub.add_parser("push", help="deploy: create or update a Hugging Face Space running this server")
    ps.add_argument("--repo-id", required=True, metavar="OWNER/NAME")
    ps.add_argument("--dry-run", action="store_true", help="print exactly what would be sent (secrets redacted)")
    ps.add_argument("--hardware", help="Space hardware, e.g. cpu-upgrade, t4-small, a10g-small")
    ps.add_argument("--private", action="store_true", help="a private Space (refused with --hf-sandboxes)")
    ps.add_argument("--hf-sandboxes", action="store_true", help="rollouts in HF Sandboxes: sends an HF token secret")
    ps.add_argument("--open", action="store_true", help="no access token: anyone may start rollouts")
    ps.add_argument("--var", action="append", default=[], metavar="KEY=VALUE", help="a Space variable (repeatable)")
    ps.add_argument(
        "--root",
        type=Path,
        help=f"the checkout to upload (default ${procs.CHECKOUT_ENV}, else the current directory or a parent of it)",
    )
    ps.set_defaults(func=cmd_push)


def _setup(sub) -> None:
    s = sub.add_parser(
        "setup",
        help="install what the demo needs now (--harness X, --all: more); the rest installs on first use",
        description="prepare the tokenizer, the task runtime and Pi, the demo's agent (idempotent); other harnesses "
        "and the pypi split are installed on first use, or here with --harness / --all",
    )
    s.add_argument(
        "--harness",
        action="append",
        choices=[*HARNESSES, "all", "image"],
        help="this harness instead of Pi (repeatable; `all`: every harness; `image`: those the Space image carries)",
    )
    s.add_argument("--all", action="store_true", help="every harness, and the pypi split with its task venvs")
    s.set_defaults(func=cmd_setup)


def _engine(sub) -> None:
    e = sub.add_parser("engine", help="the built-in vLLM-compatible engine alone (NOT a model: scripted replies)")
    _listen(e, port=8001)
    e.add_argument("--policy", default="oracle", help="oracle | noop | script:FILE")
    e.add_argument("--served-model-name", default=DEFAULT_MODEL)
    e.add_argument(
        "--delay-s",
        type=float,
        default=None,
        help="wait this long before each reply (default $SWE_GYM_ENGINE_DELAY_S or 0)",
    )
    e.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length the engine enforces (default $SWE_GYM_ENGINE_MAX_MODEL_LEN or SmolLM2's 8192)",
    )
    e.add_argument(
        "--capture-level",
        choices=["tokens", "logprobs", "text"],
        default="tokens",
        help="answer like an engine that returns less (ids off, or ids and logprobs off): for certification tests",
    )
    e.set_defaults(func=cmd_engine)


def _export(sub) -> None:
    x = sub.add_parser("export", help="stored rollout results as JSONL (and to a Hub dataset)")
    x.add_argument("--out", required=True)
    x.add_argument("--to-hub", metavar="REPO", help="also upload to this Hub dataset repo (token: $HF_TOKEN)")
    x.add_argument("--only-ok", action="store_true", help="skip rollouts with ok=false")
    x.set_defaults(func=cmd_export)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    if not argv:  # no command: the first screen
        p.print_help()
        print("\nfirst steps, in a checkout:\n" + "\n".join(f"  {c}" for c in FIRST_STEPS))
        return 0
    helping = any(a in ("-h", "--help") for a in argv[:2])
    if argv[0] != "config" and not helping:
        from swe_gym_env.core.settings import SettingsError, startup

        try:  # once, before anything starts: a bad value stops here, naming the variable
            startup()
        except SettingsError as e:
            for line in str(e).splitlines():
                print(f"swe-gym-env: bad setting {line}", file=sys.stderr)
            return 2
    if argv[:1] == ["parity"]:  # its options live in client/parity.py, which may run in the trainer venv
        return cmd_parity(argv[1:])
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
