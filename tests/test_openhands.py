"""OpenHands (its SDK's agent) end to end, on its bundle's own Python 3.13 (Debian trixie's, with trixie's loader and
C library: server/agents/pyruntime.py): the runtime in an image with no C library at all, `demo --harness openhands`
on `local` and `landlock`, a rollout on `docker` in a pypi stand-in image, and — from inside the sandbox — that the
agent's Python opened no socket but the capture proxy's and resolved no name (litellm's cost map, Laminar: all off).
The engine faults every harness must come out of the same way (tests/test_faults.py's bed, with an engine long enough
for its prompt), and its context floor.

On `landlock`: its terminal tool runs `bash -i` on a pty (its `subprocess` backend), and no pty can be made inside
that sandbox nor any grant made safely (`LandlockSandbox.has_ptys`; the evidence is
`test_the_landlock_sandbox_can_make_no_pty_and_reach_no_host_terminal`). So its agent command is handed pty pairs the
launcher opened before applying Landlock (`gives_ptys`, `agent_run.PTYS`), which its launcher's `os.openpty` /
`pty.openpty` hand out in turn (before them, it ended at its first command: `agent_crashed: OSError: out of pty
devices`); what the sandbox can and cannot do with them: tests/test_landlock_ptys.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import docker_has, docker_ready, require

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.harnesses.openhands import NET, PY, OpenHandsHarness
from swe_gym_env.server.sandbox.registry import backend_class

from helpers import Stack, audit_lines, full_turns, rows_match_export

TASK = "uiri__toml-0.10.2"  # as tests/test_mini_swe_agent.py: one file, one hunk
PROBE = f"oracle+probe:cat $HOME/{NET.rsplit('/', 1)[1]}; echo net-log-end"
# its first prompt is ~7.8k SmolLM2 tokens and the SDK refuses a window under 16,384: the built-in engine serves more
LONG = {"SWE_GYM_ENGINE_MAX_MODEL_LEN": "32768", "SWE_GYM_CONTEXT_WINDOW": "32768"}


@pytest.fixture(scope="module")
def bundle():
    h = OpenHandsHarness()
    try:
        (path,) = h.mounts()
    except AgentError as e:
        require(False, f"openhands: {e}")
    return path


@pytest.mark.integration
@pytest.mark.slow
def test_the_runtime_runs_isolated_in_an_image_with_no_c_library(bundle, tmp_path):
    """Nothing of the image is used: an image with no /lib, no /usr, no shell runs Python 3.13 and the SDK."""
    require(docker_ready(), "no docker daemon: run `bash scripts/setup_docker.sh`")
    (tmp_path / "root" / "tmp").mkdir(parents=True)
    tar = tmp_path / "empty.tar"
    subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tar), "."], check=True)
    image = "swe-gym-env-test/no-libc:openhands"
    subprocess.run(["docker", "import", str(tar), image], check=True, capture_output=True, timeout=120)
    try:
        code = (
            "import os, sys, ssl, sqlite3, ctypes, pydantic_core, tokenizers, litellm, openhands.sdk, "
            "openhands.tools.terminal; print(os.path.exists('/lib'), os.path.exists('/usr'), sys.flags.isolated, "
            "sys.version_info[:2] == (3, 13), sys.path[:3])"
        )
        argv = ["docker", "run", "--rm", "--network", "none", "-v", f"{bundle}:/opt/swe-gym-agent:ro"]
        argv += ["-e", "PYTHONPATH=/task/evil", "-e", "OPENHANDS_SUPPRESS_BANNER=1", image]
        argv += [*pyruntime.python_command("/opt/swe-gym-agent", PY).split(), "-c", code]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        lib, usr, isolated, v313, path = r.stdout.strip().splitlines()[-1].split(" ", 4)
        assert (lib, usr, isolated, v313) == ("False", "False", "1", "True")
        assert ast.literal_eval(path) == [
            "/opt/swe-gym-agent/python/lib/python3.13",
            "/opt/swe-gym-agent/python/lib/python3.13/lib-dynload",
            "/opt/swe-gym-agent/site",
        ]
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True, timeout=120)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["local", "landlock"])
def test_demo_solves_the_task_and_matches_its_event_stream(bundle, sandbox, need_sandbox, need_tokenizer):
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--sandbox", sandbox, "--harness", "openhands"]
    run = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"], (result.get("error"), run.stderr[-2000:])
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    assert len(result["turns"]) == 2 and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {"openai-chat"}
    assert result["turns"][0]["prompt_len"] < OpenHandsHarness.min_context_tokens


@pytest.fixture(scope="module")
def probe_stack():
    s = Stack(PROBE, env=LONG)
    yield s
    s.stop()


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content or "")


def net_log(result) -> list[list[str]]:
    """The agent's own record of its sockets, as the probe's output (its terminal tool's) reached the next prompt."""
    seen = [t for t in full_turns(result)[1:] if "net-log-end" in str(t.request.get("messages"))]
    assert seen, "the probe's output never reached the model"
    text = next(_text(m.get("content")) for m in reversed(seen[0].request["messages"]) if m.get("role") == "tool")
    return audit_lines(text)


def assert_only_the_capture(events: list[list[str]]) -> None:
    """One endpoint, the capture proxy's, as a numeric loopback address (so no name was looked up)."""
    assert events and any(e[0] == "socket.connect" for e in events), f"no connection logged: {events}"
    where = {ast.literal_eval(e[1])[:2] for e in events}
    assert len(where) == 1 and next(iter(where))[0] == "127.0.0.1", events


def say_times(sandbox: str, result) -> None:
    t = result.timings
    print(f"openhands on {sandbox}: boot {t['boot']:.2f}s, first call {t['first_call']:.2f}s after its start")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("sandbox", ["local"])
async def test_it_calls_nothing_but_the_capture_from_inside_the_sandbox(bundle, probe_stack, sandbox):
    async with SweGymClient(probe_stack.mcp_url) as c:
        result = await c.run_rollout(harness="openhands", sandbox=sandbox, deadline_s=240)
    assert result.ok and result.reward == 1.0 and result.cross_check == "match", (result.error, result.agent_log_tail)
    assert_only_the_capture(net_log(result))
    say_times(sandbox, result)
    await rows_match_export(probe_stack, result)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_rollout_on_docker_in_a_pypi_standin_image(bundle, probe_stack):
    from swe_gym_env.tasks.catalog import split_names, tasks_in

    require(docker_ready(), "no docker daemon: run `bash scripts/setup_docker.sh`")
    require("pypi" in split_names(), "the pypi split is not built: run `swe-gym-env setup --all`")
    task = next(t for t in tasks_in("pypi") if t.instance_id == TASK)
    assert task.image is not None
    require(docker_has(task.image), f"{task.image} is not built: run `bash scripts/build_standin_images.sh`")
    async with SweGymClient(probe_stack.mcp_url, timeout_s=600) as c:
        result = await c.run_rollout(
            harness="openhands", sandbox="docker", split="pypi", instance_id=TASK, deadline_s=500
        )
    assert result.ok, (result.phase, result.error, result.agent_log_tail[-2000:])
    assert result.reward == 1.0 and result.grading is not None and result.cross_check == "match"
    assert_only_the_capture(net_log(result))
    say_times("docker", result)
    await rows_match_export(probe_stack, result)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_a_looping_agent_is_stopped_by_the_call_budget_and_graded(bundle, need_sandbox, tmp_path):
    """Its iteration limit is the budget plus the call the proxy answers with its budget reply (text, no tool
    call, which ends its run): the rollout stops on the budget, graded, and its events match the capture."""
    script = tmp_path / "loop-openhands.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}}]}] * 40))
    s = Stack(f"script:{script}", env=LONG)
    try:
        async with SweGymClient(s.mcp_url) as c:
            result = await c.run_rollout(harness="openhands", sandbox="local", deadline_s=240, max_model_calls=3)
    finally:
        s.stop()
    assert result.ok, (result.error, result.agent_log_tail[-2000:])
    assert result.stop_reason == "budget_exhausted" and len(result.turns) == 3
    assert result.reward == 0.0 and result.grading is not None
    assert result.cross_check == "match", result.cross_check_detail


# -- units: its config, its event stream ------------------------------------------------------------------------------
CFG = AgentConfig(base_url="http://127.0.0.1:9/capture", model="Qwen/Qwen3-8B", context_window=32768, max_tokens=512)


def test_config_points_at_the_capture_with_the_budget_as_its_iteration_limit_and_no_key_in_it():
    h = OpenHandsHarness()
    cfg = AgentConfig(**{**CFG.__dict__, "max_calls": 7})
    files = h.config_files(cfg, "sgk-secret", "fix it")
    conf = json.loads(files["/home/agent/openhands-config.json"][0])
    assert conf["llm"]["model"] == "openai/Qwen/Qwen3-8B"
    assert conf["llm"]["base_url"] == "http://127.0.0.1:9/capture/v1"
    assert conf["llm"]["max_input_tokens"] == 32768 and conf["llm"]["max_output_tokens"] == 512
    assert conf["llm"]["stream"] is False and conf["llm"]["native_tool_calling"] is True
    assert conf["max_iterations"] == 8 and conf["task"] == "fix it"  # the budget + its budget reply
    assert all(mode == 0o600 for _, mode in files.values())
    assert [p for p, (data, _) in files.items() if b"sgk-secret" in data] == ["/home/agent/.capture.env"]
    cmd = h.command(cfg)
    assert "sgk-secret" not in cmd and "fix it" not in cmd
    run = cmd.splitlines()[-1]
    assert run.startswith("/opt/swe-gym-agent/python/lib/ld-linux-x86-64.so.2 --library-path ")
    assert "/opt/swe-gym-agent/python/bin/python3.13 -I -X utf8 " in run
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in cmd and "unset LMNR_PROJECT_API_KEY" in cmd


def test_its_recipe_keeps_the_311_runtime_as_it_was():
    """The second source changes nothing of the first: mini-swe-agent's recipe and command line are as before."""
    assert pyruntime.recipe()[1].endswith(" 3.11") and pyruntime.BIN == "bin/python3.11"
    assert pyruntime.python_command("/b") == (
        "/b/python/lib/ld-linux-x86-64.so.2 --library-path /b/python/lib /b/python/bin/python3.11 -I -X utf8"
    )
    assert "debian trixie python 3.13" in OpenHandsHarness.bundle_inputs


def events(*evs: dict) -> str:
    head = [{"kind": "SystemPromptEvent", "source": "agent"}, {"kind": "MessageEvent", "source": "user"}]
    return "\n".join(json.dumps(e) for e in (*head, *evs)) + "\n"


def action(rid: str, call: str) -> dict:
    return {"kind": "ActionEvent", "source": "agent", "llm_response_id": rid, "tool_call_id": call}


def usage(rid: str, n: int) -> dict:
    return {"kind": "swe_gym_usage", "response_id": rid, "completion_tokens": n}


def test_the_event_stream_gives_one_step_per_model_call():
    h = OpenHandsHarness()
    text = events(
        action("r1", "call_1"),
        usage("r1", 12),
        {"kind": "ObservationEvent", "source": "environment", "tool_call_id": "call_1"},
        action("r2", "call_2"),  # two tool calls in one reply: one step, both ids in order
        usage("r2", 30),
        action("r2", "call_3"),
        usage("r2", 30),
        {"kind": "MessageEvent", "source": "agent", "llm_response_id": "r3"},
        usage("r3", 5),
        {"kind": "swe_gym_exit", "status": "finished"},
    )
    out = h.parse_events(text)
    assert out.model_calls == 3 and out.error_kind is None
    steps = [(s.completion_tokens, s.tool_call_ids) for s in out.steps]
    assert steps == [(12, ("call_1",)), (30, ("call_2", "call_3")), (5, ())]
    assert h.parse_events(text[: text.index("r2")]).model_calls == 1  # caught mid-write: the whole lines only


def test_its_iteration_limit_is_an_ending_and_an_exception_before_any_call_is_unreachable():
    h = OpenHandsHarness()
    limit = {"kind": "ConversationErrorEvent", "code": "MaxIterationsReached", "detail": "limit (2)"}
    out = h.parse_events(events(action("r1", "c1"), usage("r1", 3), limit, {"kind": "swe_gym_exit", "status": "error"}))
    assert out.model_calls == 1 and out.error_kind is None
    down = {"kind": "swe_gym_exit", "status": "exception", "error": "ConversationRunError: Connection error."}
    out = h.parse_events(events(down))
    assert out.error_kind == "endpoint_unreachable" and "Connection error" in (out.error or "")
    out = h.parse_events(events(action("r1", "c1"), usage("r1", 3), down))
    assert out.error_kind == "agent_crashed" and out.model_calls == 1


# -- landlock: no pty made inside, none grantable safely; pairs opened before its confinement instead ---------------
def test_it_needs_a_pty_which_landlock_gives_and_the_others_have():
    assert OpenHandsHarness.needs_pty and backend_class("landlock").gives_ptys
    assert not backend_class("landlock").has_ptys  # none made inside: pairs opened before its confinement instead
    assert backend_class("local").has_ptys and backend_class("docker").has_ptys
    from swe_gym_env.server.agents.registry import harness_class

    assert not any(harness_class(n).needs_pty for n in ("pi", "mini-swe-agent", "codex", "opencode"))


PTY_PROBE = """import errno, json, os, sys
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps({
    "openpty": attempt(os.openpty),
    "open /dev/ptmx": attempt(lambda: os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))),
    "host pty": attempt(lambda: os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY)),
    "/dev/tty": attempt(lambda: os.open("/dev/tty", os.O_RDWR)),
    "list /dev/pts": attempt(lambda: os.listdir("/dev/pts")),
    "tty fds": [fd for fd in map(int, os.listdir("/proc/self/fd")) if attempt(lambda: os.ttyname(fd)) == "ok"],
}))
"""


@pytest.mark.integration
def test_the_landlock_sandbox_can_make_no_pty_and_reach_no_host_terminal(tmp_path):
    """Its ruleset as it is (`landlock.DEVICES`): no pty, and none of the host's. Then why none can be granted, and
    pairs are opened for the agent before its confinement instead (tests/test_landlock_ptys.py): /dev/ptmx alone
    gives a master whose peer (TIOCGPTPEER, what glibc's openpty uses) Landlock still refuses (the peer is
    /dev/pts/N); /dev/ptmx with /dev/pts makes openpty work but opens the host's own terminals too."""
    from swe_gym_env.server.sandbox import confine, landlock

    require(confine.landlock_abi() >= confine.FULL_ABI, "the kernel's Landlock ABI is below 6")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "probe.py").write_text(PTY_PROBE)
    master, slave = os.openpty()  # a terminal of the host's, as an operator's shell would hold one
    try:
        host = os.ttyname(slave)

        def run(dev: list[str]) -> dict:
            cfg = {"ro": [*landlock.system_ro(), str(tmp_path / "probe.py")], "rw": [str(work)], "dev": dev}
            argv = landlock._confine_argv(cfg, [sys.executable, "-I", "-S", str(tmp_path / "probe.py"), host])
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=work)
            assert r.returncode == 0, r.stderr[-2000:]
            return json.loads(r.stdout.strip().splitlines()[-1])

        assert run(landlock.DEVICES) == {
            "openpty": "EACCES",
            "open /dev/ptmx": "EACCES",
            "host pty": "EACCES",
            "/dev/tty": "EACCES",
            "list /dev/pts": "EACCES",
            "tty fds": [],
        }
        ptmx = run([*landlock.DEVICES, "/dev/ptmx"])
        assert (ptmx["open /dev/ptmx"], ptmx["openpty"], ptmx["host pty"]) == ("ok", "EACCES", "EACCES")
        both = run([*landlock.DEVICES, "/dev/ptmx", "/dev/pts"])
        assert (both["openpty"], both["host pty"]) == ("ok", "ok"), "granting /dev/pts reaches the host's terminals"
    finally:
        os.close(master)
        os.close(slave)


# -- faults: as tests/test_faults.py's, for OpenHands -----------------------------------------------------------------
LONG_ENGINE = (  # tests/hostile_engine.py with a 32k context: its prompt is ~7.8k tokens, its floor 16,384
    "import sys; sys.path.insert(0, sys.argv.pop(1)); import hostile_engine\n"
    "from swe_gym_env.server.engine.app import Engine\n"
    "class Long(Engine):\n"
    "    def __init__(self, *a, **k):\n"
    "        super().__init__(*a, **{'max_model_len': 32768, **k})\n"
    "hostile_engine.Engine = Long\n"
    "hostile_engine.main()\n"
)


def hostile_engine(long: bool):
    """tests/test_faults.py's HostileEngine, its process started here: with a 32k context, or as it is (8192)."""
    from test_faults import HOSTILE, HostileEngine

    from swe_gym_env.core.procs import free_port, wait_healthy

    engine = object.__new__(HostileEngine)
    engine.port = free_port()
    argv = [sys.executable, "-c", LONG_ENGINE, str(Path(__file__).parent)] if long else [sys.executable, str(HOSTILE)]
    engine.proc = subprocess.Popen([*argv, "--port", str(engine.port)])
    wait_healthy(engine.url("/health"), engine.proc)
    return engine


def fault_bed(tmp_path_factory, long: bool):
    from test_faults import STALL_TIMEOUT_S, Bed, stop

    data = tmp_path_factory.mktemp("openhands-faults")
    engine = hostile_engine(long)
    env = {"SWE_GYM_DATA_DIR": str(data), "SWE_GYM_STALL_TIMEOUT_S": str(STALL_TIMEOUT_S), "SWE_GYM_UI": "0"}
    stack = Stack("oracle", engine_up=False, server_engine_url=engine.url("/v1"), env=env)
    # no short engine: OpenHands' floor (16,384) is above the hostile engine's own 8192, which serves that test
    return Bed(engine, stack, None, ""), lambda: (engine.stop(), stop(stack))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def bed(bundle, tmp_path_factory):
    b, done = fault_bed(tmp_path_factory, long=True)
    yield b
    done()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_fault_control_and_on_landlock(bed):
    """The control rollout, on `local` and on `landlock` (its terminal on a pty pair opened before the confinement)."""
    from swe_gym_env.server.sandbox.landlock import preflight

    result = await bed.rollout("ok", harness="openhands")
    assert result.ok and result.reward == 1.0 and result.cross_check == "match", (result.error, result.agent_log_tail)
    ok, why = preflight()
    require(ok, f"landlock backend unavailable here: {why}")
    result = await bed.rollout("ok", harness="openhands", sandbox="landlock")
    assert result.ok, (result.phase, result.error, result.agent_log_tail[-2000:])
    assert result.sandbox == "landlock" and result.reward == 1.0 and result.grading is not None
    assert result.cross_check == "match", result.cross_check_detail
    assert result.turns and not any(t.discarded for t in result.turns)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_fault_engine_500_after_the_first_call(bed):
    from test_faults import engine_failed

    # as Pi's and mini-swe-agent's outcome (phase agent, engine_failures, not a budget_exhausted row), except who
    # stops first: its LLM gives up after 3 attempts (num_retries=2, no client retries under litellm's), before the
    # proxy's limit of 5 failures in a row
    result = await bed.rollout("http500", after=1, max_model_calls=6, harness="openhands")
    engine_failed(result, "engine answered HTTP 500", "did not recover from 3 failed model call(s)")
    assert len(result.turns) == 1 and result.sequences and not result.sequences[0].discarded


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_fault_engine_that_stops_returning_ids(bed):
    from test_faults import engine_failed

    result = await bed.rollout("no_token_ids", after=1, harness="openhands")
    engine_failed(result, "no prompt_token_ids")
    assert len(result.turns) == 1
    assert any(f.code == "engine_stopped_ids" and f.severity == "fatal" for f in result.findings)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_fault_engine_stalls_mid_reply(bed):
    # it calls without streaming; the proxy still asks the engine for a stream (`streaming.collect`), so the stall
    # clock runs: the same outcome as Pi's, well before the deadline
    from test_faults import MIDSTREAM_DEADLINE_S, STALL_TIMEOUT_S, STALLED_BY_S, engine_failed

    result = await bed.rollout("hang_midstream", after=1, deadline_s=MIDSTREAM_DEADLINE_S, harness="openhands")
    engine_failed(result, "engine stream stalled", f"nothing for {STALL_TIMEOUT_S}s")
    assert len(result.turns) == 1, "the call answered before the hang stays captured"
    assert result.wall_s < STALLED_BY_S, f"took {result.wall_s}s"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_engine_context_below_its_floor_is_refused_before_boot(bundle, tmp_path_factory):
    from test_faults import failed

    b, done = fault_bed(tmp_path_factory, long=False)  # the hostile engine as it is: SmolLM2's 8192
    try:
        result = await b.rollout("ok", harness="openhands")
        failed(result, "validate", "context is 8192 tokens, below the 16384 that openhands needs")
        assert result.turns == [] and b.engine.state()["agent_calls"] == 0
    finally:
        done()
