"""The harnesses of issue 42 (Kilo Code, Qwen Code, Cline, Kimi CLI, Mistral Vibe) end to end, each as one
`swe-gym-env demo --harness X` in a subprocess: the real CLI from its agent bundle against the built-in engine's
oracle through /capture, the local bubblewrap sandbox, real grading, the agent's own log cross-checked against the
capture — and, the whole run traced with strace (connect / sendto / sendmsg and the process tree), proof that nothing
in the agent's process tree opened a connection or looked up a name other than through the capture relay.

Which processes are the agent's: those started (directly or below) by a command that names the agent's bundle (at
/opt/swe-gym-agent in `local` / `docker`, the bundle's host directory under `landlock`). What counts as an outbound
attempt from them: a connection or datagram to anything but the relay (127.0.0.1, its port), so anything to
port 53 too, and any unix socket but the capture's (systemd-resolved, D-Bus, ...). Netlink (the interface list Node and
Bun read at start) is not a network peer, nor nscd's socket (glibc asks it for user names too; a host name it cannot
answer goes on to port 53). The watcher is itself tested on a process that does look up a name."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.harnesses.kimi_cli import LAUNCHER as KimiLauncher
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.sandbox.base import RELAY_PORT

FIVE = ["kilocode", "qwen-code", "cline", "kimi-cli", "mistral-vibe"]  # the harnesses of issue 42 landed so far
TRACED = "connect,sendto,sendmsg,process"
_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
# a clone's return: the child's pid, as strace's own namespace numbers it where the caller is in another
# (`--decode-pids=pidns`: "= 7 /* 7830 in strace's PID NS */")
_RET = re.compile(r"\)\s*=\s*(-?\d+)(?: /\* (\d+) in strace's PID NS \*/)?$")
_INET = re.compile(r'sa_family=AF_INET6?, sin6?_port=htons\((\d+)\),.*?(?:inet_addr|inet_pton\(AF_INET6?)\(?"([^"]+)"')
_UNIX = re.compile(r'sa_family=AF_UNIX, sun_path=@?"([^"]*)"')
AGENT_MARK = re.compile(r'execve\("[^"]*", \[.*(?:/opt/swe-gym-agent/|/bundles/[^/"]+-[0-9a-f]{16}/)')
CAPTURE_SOCKET = "capture.sock"
# glibc asks nscd first for user and group names too (`ps`, `git`); a host name it cannot answer there (no nscd in a
# sandbox) goes on to the resolver: port 53, which counts
NSCD = "/var/run/nscd/socket"


def strace_argv(out: Path) -> list[str]:
    # -s: whole strings (a truncated argv would hide the bundle's path)
    argv = ["strace", "-f", "--seccomp-bpf", "--decode-pids=pidns", "-qq", "-s", "4096", "-e", f"trace={TRACED}"]
    return [*argv, "-e", "signal=none", "-o", str(out)]


def agent_network(
    trace: str, mark: re.Pattern[str] = AGENT_MARK, ports: frozenset[int] = frozenset({RELAY_PORT})
) -> tuple[list[str], list[str]]:
    """(every network syscall with a destination made by the agent's process tree, those that are outbound
    attempts: to anything but 127.0.0.1 on ``ports``, the relay's). The tree: processes whose execve matches ``mark``,
    and every process or thread they started."""
    parent: dict[int, int] = {}
    roots: set[int] = set()
    calls: list[tuple[int, str]] = []
    for line in trace.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        pid, name, rest = int(m.group(1)), m.group(2) or m.group(3), m.group(4)
        if name in ("clone", "clone3", "fork", "vfork"):
            ret = _RET.search(rest)
            if ret and int(ret.group(1)) > 0:
                parent[int(ret.group(2) or ret.group(1))] = pid
        elif name == "execve" and mark.search(line):
            roots.add(pid)
        elif name in ("connect", "sendto", "sendmsg") and "sa_family=" in rest:
            calls.append((pid, line))

    def in_tree(pid: int) -> bool:
        seen = set()
        while pid not in roots:
            if pid in seen or pid not in parent:
                return False
            seen.add(pid)
            pid = parent[pid]
        return True

    mine = [line for pid, line in calls if in_tree(pid)]
    bad = []
    for line in mine:
        if "AF_NETLINK" in line:
            continue
        inet, unix = _INET.search(line), _UNIX.search(line)
        if inet:
            if inet.group(2) != "127.0.0.1" or int(inet.group(1)) not in ports:
                bad.append(line)
        elif not (unix and (unix.group(1).endswith(CAPTURE_SOCKET) or unix.group(1) == NSCD)):
            bad.append(line)
    return mine, bad


def test_the_watcher_sees_a_name_lookup_and_a_connection(tmp_path):
    """The check cannot pass vacuously: a process marked as the agent that looks up a name and connects out is caught,
    and an unmarked one (the server's side) is not."""
    require(shutil.which("strace") is not None, "strace missing: apt-get install strace")
    code = (
        "import socket\n"
        "try: socket.getaddrinfo('swe-gym-watcher-test.invalid', 443)\nexcept OSError: pass\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)\n"
        "try: s.sendto(b'x', ('192.0.2.1', 9))\nexcept OSError: pass\n"
    )
    script = tmp_path / "swe-gym-agent-stand-in.py"
    script.write_text(code)
    out = tmp_path / "trace"
    subprocess.run([*strace_argv(out), sys.executable, str(script)], check=True, timeout=120)
    _, bad = agent_network(out.read_text(), re.compile(r'execve\("[^"]*", \[.*swe-gym-agent-stand-in'))
    assert any("192.0.2.1" in line for line in bad), bad
    assert any("htons(53)" in line for line in bad), bad  # the resolver, asked for the name
    assert agent_network(out.read_text())[0] == []  # nothing of it names a bundle: not the agent's


def traced_demo(harness: str, sandbox: str, tmp_path: Path) -> tuple[dict, list[str], list[str]]:
    """`swe-gym-env demo` of ``harness`` under the strace watcher: its result, the agent's own network calls and those
    that went anywhere but the relay."""
    require(shutil.which("strace") is not None, "strace missing: apt-get install strace")
    trace = tmp_path / "trace"
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--harness", harness, "--sandbox", sandbox, "--json"]
    run = subprocess.run([*strace_argv(trace), *argv], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    text = trace.read_text()
    trace.unlink()  # it holds the requests the agent sent, the capture key among them
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"], (result.get("error"), run.stderr[-2000:])
    return result, *agent_network(text)


def installed_harness(name: str):
    """The harness, its bundle built (else the test is skipped or, under CI, fails: `require`)."""
    h = get_harness(name)
    try:
        h.mounts()
    except AgentError as e:
        require(False, f"{name}: {e}")
    return h


def assert_solved_hermetically(h, result: dict, mine: list[str], outbound: list[str], min_turns: int = 2) -> None:
    """A traced demo's verdict: solved, its own log matching the capture, one dialect, a first prompt inside its
    minimum context, its calls to the relay seen and nothing else attempted."""
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    assert len(result["turns"]) >= min_turns and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {h.dialect}
    assert result["turns"][0]["prompt_len"] < h.min_context_tokens
    assert any("127.0.0.1" in line for line in mine), f"the agent's calls to the relay were not traced: {mine}"
    assert outbound == [], "\n".join(outbound)


def demo_solved_hermetically(harness: str, tmp_path: Path, min_turns: int = 2) -> None:
    """The traced local demo of an installed ``harness``, judged by `assert_solved_hermetically`."""
    h = installed_harness(harness)
    result, mine, outbound = traced_demo(harness, "local", tmp_path)
    assert_solved_hermetically(h, result, mine, outbound, min_turns)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", FIVE)
def test_demo_solves_the_task_matches_its_own_log_and_reaches_only_the_capture(
    harness, need_sandbox, need_tokenizer, tmp_path
):
    demo_solved_hermetically(harness, tmp_path)


# -- units: each one's configuration ---------------------------------------------------------------------------------
CFG = AgentConfig(base_url="http://127.0.0.1:9/capture", model="Qwen/Qwen3-8B", context_window=32768, max_tokens=512)


def secret_only_in_the_env_file(files: dict[str, tuple[bytes, int]], command: str) -> None:
    assert [p for p, (data, _) in files.items() if b"sgk-secret" in data] == ["/home/agent/.capture.env"]
    assert all(mode in (0o600, 0o700) for _, mode in files.values())  # private; 0700: a script it runs
    assert "sgk-secret" not in command and "fix it" not in command


def test_kilocode_names_only_our_provider_with_every_switch_and_telemetry_off():
    h = get_harness("kilocode")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    conf = json.loads(files["/home/agent/.kilo-run/config/kilo/kilo.json"][0])
    assert conf["enabled_providers"] == ["capture"] and conf["model"] == "capture/Qwen/Qwen3-8B"
    assert conf["provider"]["capture"]["options"]["baseURL"] == "http://127.0.0.1:9/capture/v1"
    assert not any("package.json" in p for p in files)  # no plugin install to pre-seed
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    for switch in ("MODELS_FETCH", "PROJECT_CONFIG", "AUTOUPDATE", "SHARE", "CODEBASE_INDEXING", "CLAUDE_CODE"):
        assert f"KILO_DISABLE_{switch}=1" in cmd
    assert "KILO_TELEMETRY_LEVEL=off" in cmd and "unset KILO_CONFIG KILO_CONFIG_CONTENT KILO_CONFIG_DIR" in cmd
    assert cmd.splitlines()[-1].startswith("/opt/swe-gym-agent/bin/kilo run --format json --auto ")
    assert "OPENCODE" not in cmd


def test_qwen_code_settings_switch_off_every_helper_call_and_outside_traffic():
    from swe_gym_env.server.agents.harnesses.qwen_code import told_window

    h = get_harness("qwen-code")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    system = json.loads(files["/home/agent/.qwen-system-settings.json"][0])
    assert system == json.loads(files["/home/agent/.qwen-home/settings.json"][0])
    assert system["privacy"]["usageStatisticsEnabled"] is False and system["telemetry"]["enabled"] is False
    assert system["general"] == {"enableAutoUpdate": False, "preventSystemSleep": False, "showSessionRecap": False}
    assert not any(system["memory"].values())  # no auto-memory / dream / skill sub-agent calls
    assert system["model"]["skipNextSpeakerCheck"] and system["model"]["skipLoopDetection"]
    assert {"web_fetch", "web_search", "agent"} <= set(system["tools"]["exclude"])
    assert system["mcp"]["allowed"] == ["swe-gym-no-mcp-server"] and system["disableAllHooks"] is True
    env = files["/home/agent/.capture.env"][0].decode()
    assert "OPENAI_BASE_URL=http://127.0.0.1:9/capture/v1" in env and "QWEN_HOME" not in env
    # the paths are exported by the command (a landlock sandbox maps them there, never in a file's content)
    assert "export QWEN_HOME=/home/agent/.qwen-home QWEN_CODE_SYSTEM_SETTINGS_PATH=" in cmd
    assert "--auth-type openai" in cmd and "/opt/swe-gym-agent/node/bin/node " in cmd
    # the window it is told: never more than the engine's, never one that compacts sooner than a smaller one would
    assert [told_window(n) for n in (20480, 32768, 40960, 60000, 65536, 131072)] == [
        20480,
        32768,
        32768,
        32768,
        65536,
        131072,
    ]


def test_mistral_vibe_config_turns_off_every_call_of_its_own_and_never_trusts_the_repo():
    import tomllib

    h = get_harness("mistral-vibe")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    conf = tomllib.loads(files["/home/agent/.vibe-home/config.toml"][0].decode())
    for key in ("enable_telemetry", "enable_otel", "enable_update_checks", "enable_auto_update", "enable_mcp"):
        assert conf[key] is False, key
    assert conf["experiments"] == {"enable": False} and conf["session_logging"] == {"generate_titles": False}
    assert conf["providers"] == [
        {
            "name": "capture",
            "api_base": "http://127.0.0.1:9/capture/v1",
            "api_style": "openai",
            "api_key_env_var": "SWE_GYM_CAPTURE_KEY",
            "backend": "generic",
        }
    ]
    assert conf["models"][0]["max_context_length"] == 32768 and conf["active_model"] == "capture"
    server, mode = files["/home/agent/vibe-app-server"]
    assert mode == 0o700 and b"/opt/swe-gym-agent/python/lib/ld-linux-x86-64.so.2 " in server
    # vibe-rs on the bundle's own loader; the repo never trusted (its .vibe/config.toml unread); the image's VIBE_*
    # variables unset before ours are exported
    run = next(line for line in cmd.splitlines() if "vibe-rs" in line)
    assert run.startswith("/opt/swe-gym-agent/python/lib/ld-linux-x86-64.so.2 --library-path ")
    assert "--trust" not in run and "--auto-approve" in run and "--prompt-file /home/agent/prompt.txt" in run
    assert cmd.index('unset "$v"') < cmd.index("export VIBE_HOME=")
    assert "PYTHON_KEYRING_BACKEND=keyring.backends.null.Keyring" in cmd


@pytest.mark.parametrize(("api", "base"), [("openai_legacy", "/v1"), ("openai_responses", "/v1")])
def test_kimi_cli_config_holds_no_key_and_its_agent_stays_off_the_web(api, base):
    import tomllib

    from swe_gym_env.wire import HARNESS_OPTIONS

    assert HARNESS_OPTIONS["kimi-cli"]["api"] == ("openai_legacy", "openai_responses")
    h = get_harness("kimi-cli")
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    files = h.config_files(cfg, "sgk-secret", "fix it")
    cmd = h.command(cfg)
    secret_only_in_the_env_file(files, cmd)
    conf = tomllib.loads(files["/home/agent/kimi-config.toml"][0].decode())
    assert conf["telemetry"] is False and conf["default_model"] == "capture"
    # the launcher puts the key in, in its own memory (the file holds a placeholder)
    assert conf["providers"]["capture"] == {
        "type": api,
        "base_url": f"http://127.0.0.1:9/capture{base}",
        "api_key": "@SWE_GYM_CAPTURE_KEY@",
    }
    assert '"@SWE_GYM_CAPTURE_KEY@"' in KimiLauncher and 'os.environ.pop("SWE_GYM_CAPTURE_KEY"' in KimiLauncher
    assert conf["models"]["capture"]["max_context_size"] == 32768
    assert conf["loop_control"]["reserved_context_size"] == 1000  # not its 50,000: that compacts at once under ~59k
    assert files["/home/agent/.capture.env"][0] == b"SWE_GYM_CAPTURE_KEY=sgk-secret\n"
    agent = files["/home/agent/kimi-agent.yaml"][0].decode()
    for tool in ("web:SearchWeb", "web:FetchURL", "agent:Agent", "background:TaskList"):
        assert f"kimi_cli.tools.{tool}" in agent
    assert "unset OPENAI_API_KEY OPENAI_BASE_URL" in cmd  # they would override the config's endpoint and key
    assert "KIMI_DISABLE_TELEMETRY=1" in cmd and "export KIMI_SHARE_DIR=/home/agent/.kimi-share" in cmd
    assert cmd.index("(KIMI_[A-Za-z0-9_]*") < cmd.index("KIMI_DISABLE_TELEMETRY=1")  # the image's unset, then ours


def test_kimi_cli_wire_log_gives_one_step_per_call_and_drops_a_retried_attempts_calls():
    def line(kind: str, **payload) -> str:
        return json.dumps({"timestamp": 1.0, "message": {"type": kind, "payload": payload}})

    usage = {"input_other": 10, "output": 7, "input_cache_read": 0, "input_cache_creation": 0}
    wire = [
        json.dumps({"type": "metadata", "protocol_version": "1.10"}),
        line("TurnBegin", user_input="fix it"),
        line("StepBegin", n=1),
        line("ToolCall", type="function", id="call_lost"),
        line("StepRetry"),
        line("ToolCall", type="function", id="call_1"),
        line("StatusUpdate", token_usage=usage, message_id="m1"),
        line("StepBegin", n=2),
        line("StatusUpdate", token_usage={**usage, "output": 2}, message_id="m2"),
        line("TurnEnd"),
    ]
    out = get_harness("kimi-cli").parse_events("\n".join(wire) + "\n")
    assert [(s.completion_tokens, s.tool_call_ids) for s in out.steps] == [(7, ("call_1",)), (2, ())]
    assert out.error_kind is None
    failed = get_harness("kimi-cli").parse_events(line("StepBegin", n=1) + "\n" + line("StepInterrupted") + "\n")
    assert failed.error_kind == "agent_crashed" and failed.model_calls == 0


def test_cline_settings_opt_out_of_telemetry_and_flags_and_keep_the_key_in_the_env():
    h = get_harness("cline")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    providers = json.loads(files["/home/agent/.cline-run/data/settings/providers.json"][0])
    entry = providers["providers"]["openai-compatible"]
    assert entry["settings"] == {
        "provider": "openai-compatible",
        "model": "Qwen/Qwen3-8B",
        "baseUrl": "http://127.0.0.1:9/capture/v1",
        "contextWindow": 32768,
        "maxTokens": 512,
    }
    assert entry["updatedAt"]  # without it Cline rewrites the entry from its defaults, dropping baseUrl
    settings = json.loads(files["/home/agent/.cline-run/global-settings.json"][0])
    assert settings["telemetryOptOut"] is True and settings["autoUpdateEnabled"] is False
    assert {"fetch_web_content", "spawn_agent", "team_spawn_teammate", "team_run_task"} <= set(
        settings["disabledTools"]
    )
    assert "CLINE_GLOBAL_SETTINGS_PATH=/home/agent/.cline-run/global-settings.json IS_TEST=true" in cmd
    assert files["/home/agent/.capture.env"][0] == b"OPENAI_API_KEY=sgk-secret\n"
    run = next(line for line in cmd.splitlines() if "bin/cline " in line)
    assert run.startswith("/opt/swe-gym-agent/bin/cline --json -P openai-compatible ") and "--config " in run


def test_cline_record_is_its_message_file_then_its_json_output():
    messages = {
        "version": 1,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1"}], "metrics": {"outputTokens": 7}},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}], "metrics": {"outputTokens": 2}},
        ],
    }
    stream = json.dumps({"type": "run_result", "finishReason": "completed"})
    out = get_harness("cline").parse_events(json.dumps(messages, indent=2) + "\n" + stream + "\n")
    assert [(s.completion_tokens, s.tool_call_ids) for s in out.steps] == [(7, ("call_1",)), (2, ())]
    assert out.error_kind is None
    failed = json.dumps({"type": "error", "message": "Cannot connect to API: Unable to connect (ConnectionRefused)"})
    dead = get_harness("cline").parse_events(json.dumps({"messages": []}) + "\n" + failed + "\n")
    assert dead.error_kind == "endpoint_unreachable" and dead.model_calls == 0


@pytest.mark.parametrize(
    ("api", "variables"),
    [
        ("openai", {"OPENAI_API_KEY": "sgk-secret", "OPENAI_BASE_URL": "http://127.0.0.1:9/capture/v1"}),
        ("openai-responses", {"OPENAI_API_KEY": "sgk-secret", "OPENAI_BASE_URL": "http://127.0.0.1:9/capture/v1"}),
        ("anthropic", {"ANTHROPIC_API_KEY": "sgk-secret", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/capture"}),
        ("gemini", {"GEMINI_API_KEY": "sgk-secret", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9/capture"}),
    ],
)
def test_qwen_code_speaks_each_of_its_auth_types_to_the_capture(api, variables):
    from swe_gym_env.wire import HARNESS_OPTIONS, RolloutRequest

    assert RolloutRequest(harness="qwen-code", harness_options={"api": api}).harness_options == {"api": api}
    assert api in HARNESS_OPTIONS["qwen-code"]["api"]
    h = get_harness("qwen-code")
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    files = h.config_files(cfg, "sgk-secret", "fix it")
    env = dict(line.split("=", 1) for line in files["/home/agent/.capture.env"][0].decode().splitlines())
    assert {k: env[k] for k in variables} == variables and env[next(k for k in env if k.endswith("_MODEL"))]
    assert json.loads(files["/home/agent/.qwen-system-settings.json"][0])["security"]["auth"]["selectedType"] == api
    assert f"--auth-type {api} " in h.command(cfg)


def test_a_task_qwen_code_rewrote_is_still_found_and_still_seen():
    """Qwen Code's @-reference parser puts a space before an `@token` it cannot resolve (`@retry(...)` -> ` @retry`):
    the oracle still finds the task, and the pipeline still sees that the agent carried it."""
    from swe_gym_env.server.capture import CaptureSession, EngineTarget
    from swe_gym_env.server.engine.policy import find_task
    from swe_gym_env.server.rollout.agent_run import saw_task
    from swe_gym_env.tasks.catalog import tasks_in
    from swe_gym_env.wire import Turn

    task = next(t for t in tasks_in("bundled") if "`@retry(" in t.problem_statement)
    rewritten = "Fix this: " + task.problem_statement.replace("`@retry(", "` @retry(")
    assert find_task(rewritten) == task
    turn = Turn(
        index=0,
        prompt_len=1,
        prompt_new_ids=[1],
        completion_token_ids=[2],
        logprobs=[0.0],
        finish_reason="stop",
        streamed=False,
        wall_s=0.0,
        response_message={"role": "assistant", "content": "done"},
        new_messages=[{"role": "user", "content": rewritten}],
        params={"model": "m"},
    )
    s = CaptureSession(id="s", engine=EngineTarget("http://e/v1", "m"), max_calls=5, max_tokens=5, call_timeout_s=5)
    s.turns = [turn]
    assert saw_task(s, task.problem_statement)
    s.turns = [turn.model_copy(update={"new_messages": [{"role": "user", "content": rewritten[:200]}]})]
    assert not saw_task(s, task.problem_statement)


@pytest.mark.parametrize(("api", "base"), [("openai", "/v1"), ("openai-responses", "/v1"), ("anthropic", "")])
def test_mistral_vibe_speaks_each_api_style_to_the_capture(api, base):
    import tomllib

    from swe_gym_env.wire import RolloutRequest

    assert RolloutRequest(harness="mistral-vibe", harness_options={"api": api}).harness_options == {"api": api}
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    files = get_harness("mistral-vibe").config_files(cfg, "sgk-secret", "fix it")
    provider = tomllib.loads(files["/home/agent/.vibe-home/config.toml"][0].decode())["providers"][0]
    assert provider["api_style"] == api and provider["api_base"] == f"http://127.0.0.1:9/capture{base}"


@pytest.mark.parametrize(
    ("api", "base", "key_env"),
    [
        ("openai-compatible", "/v1", "OPENAI_API_KEY"),
        ("openai-native", "/v1", "OPENAI_API_KEY"),
        ("anthropic", "/v1", "ANTHROPIC_API_KEY"),
    ],
)
def test_cline_speaks_each_of_its_providers_to_the_capture(api, base, key_env):
    from swe_gym_env.wire import RolloutRequest

    assert RolloutRequest(harness="cline", harness_options={"api": api}).harness_options == {"api": api}
    h = get_harness("cline")
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    files = h.config_files(cfg, "sgk-secret", "fix it")
    providers = json.loads(files["/home/agent/.cline-run/data/settings/providers.json"][0])
    assert providers["lastUsedProvider"] == api
    assert providers["providers"][api]["settings"]["baseUrl"] == f"http://127.0.0.1:9/capture{base}"
    assert files["/home/agent/.capture.env"][0] == f"{key_env}=sgk-secret\n".encode()
    assert f"--json -P {api} " in h.command(cfg)


@pytest.mark.parametrize(
    ("api", "base"), [("@ai-sdk/openai-compatible", "/v1"), ("@ai-sdk/openai", "/v1"), ("@ai-sdk/anthropic", "/v1")]
)
def test_kilocode_speaks_each_built_in_provider_to_the_capture(api, base):
    from swe_gym_env.wire import RolloutRequest

    assert RolloutRequest(harness="kilocode", harness_options={"api": api}).harness_options == {"api": api}
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    files = get_harness("kilocode").config_files(cfg, "sgk-secret", "fix it")
    provider = json.loads(files["/home/agent/.kilo-run/config/kilo/kilo.json"][0])["provider"]["capture"]
    assert provider["npm"] == api and provider["options"]["baseURL"] == f"http://127.0.0.1:9/capture{base}"
    with pytest.raises(ValueError):
        RolloutRequest(harness="opencode", harness_options={"api": api})  # OpenCode offers none (not measured)
