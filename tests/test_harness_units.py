"""Harness units without running an agent: event parsing on lines recorded from the real CLIs
(tests/fixtures/agents/), the reconciliation with the capture, failure classification, config hygiene."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swe_gym_env.server.agents.base import AgentConfig, AgentError, AgentOutcome, AgentStep, reconcile
from swe_gym_env.server.agents.harnesses.claude_code import ClaudeCodeHarness
from swe_gym_env.server.agents.harnesses.codex import CodexHarness
from swe_gym_env.server.agents.harnesses.gemini_cli import GeminiCliHarness
from swe_gym_env.server.agents.harnesses.opencode import OpenCodeHarness
from swe_gym_env.server.agents.harnesses.pi import PiHarness
from swe_gym_env.server.agents.registry import HARNESSES, get_harness
from swe_gym_env.server.agents.verdict import RunFacts, classify_failure
from swe_gym_env.wire import Turn

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
CFG = AgentConfig(base_url="http://127.0.0.1:18080/capture", model="m", context_window=32768, max_tokens=512)
KEY = "sgk-secret-key-value"


def events(name: str) -> str:
    return (FIXTURES / name).read_text()


def turn(i: int, n_completion: int, call_ids: tuple[str, ...] = ()) -> Turn:
    calls = [{"id": c, "type": "function", "function": {"name": "bash", "arguments": "{}"}} for c in call_ids]
    return Turn(
        index=i,
        prompt_token_ids=[1] * (i + 1),
        completion_token_ids=list(range(n_completion)),
        logprobs=[-0.1] * n_completion,
        finish_reason="tool_calls" if calls else "stop",
        streamed=True,
        wall_s=0.0,
        request={},
        response_message={"role": "assistant", "content": None, "tool_calls": calls},
    )


# -- parsing recorded events ------------------------------------------------------------------------------------
def test_pi_oracle_events_give_steps_with_tool_call_ids_and_token_counts():
    out = PiHarness().parse_events(events("pi-oracle-batchtools.jsonl"))
    assert out.error_kind is None and out.model_calls == 2
    assert out.steps == [AgentStep(217, ("chatcmpl-tool-299e221d19fb4b6a",)), AgentStep(9, ())]


def test_pi_dead_endpoint_is_read_from_the_events_not_the_exit_code():
    out = PiHarness().parse_events(events("pi-unreachable.jsonl"))  # Pi exited 0 on this run
    assert out.model_calls == 0 and out.error_kind == "endpoint_unreachable"
    assert "Connection error" in out.error


def test_opencode_events_give_one_step_per_step_finish():
    out = OpenCodeHarness().parse_events(events("opencode-script-bash.jsonl"))
    assert out.error_kind is None and out.model_calls == 2
    assert out.steps == [AgentStep(67, ("chatcmpl-tool-49cb87d413504170",)), AgentStep(2, ())]
    rejected = OpenCodeHarness().parse_events(events("opencode-permission-rejected.jsonl"))
    assert rejected.steps == [AgentStep(215, ("chatcmpl-tool-3b1c6080a3af40b0",))]


def test_opencode_dead_endpoint_is_endpoint_unreachable():
    out = OpenCodeHarness().parse_events(events("opencode-unreachable.jsonl"))
    assert out.model_calls == 0 and out.error_kind == "endpoint_unreachable"
    assert "Unable to connect" in out.error


@pytest.mark.parametrize("harness", [PiHarness(), OpenCodeHarness()])
def test_garbage_and_empty_events_leave_no_trace(harness):
    out = harness.parse_events('not json\n[1, 2]\n{"type": "weird"}\n')
    assert out.model_calls == 0 and out.error_kind is None and out.steps == []
    assert harness.parse_events("").model_calls == 0


# -- reconciliation with the capture ----------------------------------------------------------------------------
def test_recorded_opencode_run_matches_its_capture_call_by_call():
    out = OpenCodeHarness().parse_events(events("opencode-script-bash.jsonl"))
    turns = [turn(0, 67, ("chatcmpl-tool-49cb87d413504170",)), turn(1, 2)]
    r = reconcile(out, turns, budget_replies=0)
    assert r.verdict == "match" and r.unused == () and r.missing == 0


def test_a_captured_call_the_agent_never_used_is_demoted_and_a_mismatch():
    out = PiHarness().parse_events(events("pi-oracle-batchtools.jsonl"))
    # a retry: the proxy answered a first attempt the agent dropped, then the one it used
    turns = [turn(0, 40, ("chatcmpl-tool-dropped",)), turn(1, 217, ("chatcmpl-tool-299e221d19fb4b6a",)), turn(2, 9)]
    r = reconcile(out, turns, budget_replies=0)
    assert r.verdict == "mismatch" and r.unused == (0,) and r.missing == 0
    assert r.detail.startswith("call 0: the agent ran tool calls ['chatcmpl-tool-299e221d19fb4b6a']")


def test_agent_steps_the_capture_lacks_are_missing():
    out = PiHarness().parse_events(events("pi-oracle-batchtools.jsonl"))
    r = reconcile(out, [turn(0, 217, ("chatcmpl-tool-299e221d19fb4b6a",))], budget_replies=0)
    assert r.verdict == "mismatch" and r.missing == 1 and "2 model calls" in r.detail


def test_budget_replies_are_agent_steps_without_turns():
    out = AgentOutcome()
    for n in (5, 5, 0):
        out.add_step(n)
    assert reconcile(out, [turn(0, 5), turn(1, 5)], budget_replies=1).verdict == "match"
    assert reconcile(out, [turn(0, 5), turn(1, 5)], budget_replies=0).missing == 1


def test_no_trace_is_none_not_match():
    assert reconcile(AgentOutcome(), [turn(0, 3)], 0).verdict == "none"


# -- failure classification -------------------------------------------------------------------------------------
def facts(**kw) -> RunFacts:
    base = {"exit_code": 0, "timed_out": False, "timeout_s": 60.0, "calls": 0}
    return RunFacts(**{**base, **kw})


def test_pi_exit_zero_on_a_dead_endpoint_is_still_a_failure():
    out = PiHarness().parse_events(events("pi-unreachable.jsonl"))
    assert classify_failure(out, facts())[0] == "endpoint_unreachable"


def test_proxy_side_engine_failure_is_endpoint_unreachable_whatever_the_agent_says():
    errs = ("call 1: engine unreachable: ConnectError",)
    assert classify_failure(AgentOutcome(), facts(exit_code=1, proxy_errors=errs))[0] == "endpoint_unreachable"


@pytest.mark.parametrize(
    "outcome,kw,kind",
    [
        (AgentOutcome(), {}, "no_model_calls"),
        (AgentOutcome(), {"exit_code": 2, "stderr_tail": "Segmentation fault"}, "agent_crashed"),
        (AgentOutcome(model_calls=3), {"calls": 3, "timed_out": True, "exit_code": 124}, "timeout"),
        (AgentOutcome(model_calls=3), {"calls": 3, "exit_code": 1}, "agent_crashed"),
        (AgentOutcome(model_calls=3), {"calls": 3, "proxy_errors": ("call 3: HTTP 400",)}, "agent_crashed"),
    ],
)
def test_failure_kinds(outcome, kw, kind):
    assert classify_failure(outcome, facts(**kw))[0] == kind


def test_a_budget_stopped_agent_has_not_failed():
    out = AgentOutcome(model_calls=4)
    assert classify_failure(out, facts(calls=3, budget_exhausted=True, exit_code=1)) is None
    stopped = facts(calls=3, budget_exhausted=True, stopped_after_budget=True, exit_code=137, timed_out=True)
    assert classify_failure(out, stopped) is None
    assert classify_failure(AgentOutcome(model_calls=2), facts(calls=2)) is None


# -- install, config, hygiene -----------------------------------------------------------------------------------
def test_every_table_entry_is_named_for_its_key_and_pinned():
    for name, cls in HARNESSES.items():
        h = get_harness(name)
        assert isinstance(h, cls) and h.name == name and h.version[0].isdigit()
    with pytest.raises(AgentError) as e:
        get_harness("no-such-agent")
    assert e.value.kind == "install"


@pytest.mark.parametrize("cls", [PiHarness, OpenCodeHarness])
def test_a_missing_install_is_an_install_error(cls, tmp_path, monkeypatch):
    h = cls()
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "absent"))  # no bundle built there
    with pytest.raises(AgentError) as e:
        h.mounts()
    assert e.value.kind == "install" and "swe-gym-env setup" in str(e.value) and "bundle" in str(e.value)


@pytest.mark.parametrize("cls", [PiHarness, OpenCodeHarness])
def test_the_command_runs_the_bundles_own_runtime_never_the_images(cls):
    cmd = cls().command(CFG)
    run = cmd.splitlines()[-1]
    assert run.startswith("/opt/swe-gym-agent/"), run  # the bundle's node / binary, by absolute path
    assert "node " not in run.split("/opt/swe-gym-agent/node/bin/node ", 1)[-1]  # no bare `node` from PATH
    if cls is PiHarness:
        assert run.startswith("/opt/swe-gym-agent/node/bin/node /opt/swe-gym-agent/pi/node_modules/")
        assert "PATH" not in cmd  # the agent's shell commands see the image's PATH untouched
    else:
        assert "export PATH=/opt/swe-gym-agent/bin:$PATH" in cmd  # the bundled rg


def test_opencode_config_is_offline_pinned_and_keeps_the_key_out_of_argv():
    h = OpenCodeHarness()
    files = h.config_files(CFG, KEY, "fix it")
    conf = json.loads(next(d for p, (d, _) in files.items() if p.endswith("/opencode/opencode.json")))
    provider = conf["provider"]["capture"]
    assert provider["options"] == {"baseURL": f"{CFG.base_url}/v1", "apiKey": "{env:SWE_GYM_CAPTURE_KEY}"}
    assert provider["models"]["m"]["limit"] == {"context": 32768, "output": 512}
    assert conf["model"] == conf["small_model"] == "capture/m" and conf["autoupdate"] is False
    plugin = {p.rsplit("/", 1)[-1]: json.loads(d) for p, (d, _) in files.items() if p.endswith("package.json")}
    assert plugin == {"package.json": {"dependencies": {"@opencode-ai/plugin": h.version}}}
    assert any(p.endswith("/opencode/node_modules/.keep") for p in files)
    assert all(mode == 0o600 for _, mode in files.values())
    secret = [p for p, (d, _) in files.items() if KEY.encode() in d]
    assert secret == ["/home/agent/.capture.env"]
    cmd = h.command(CFG)
    assert KEY not in cmd and "--format json --title task < /home/agent/prompt.txt" in cmd
    for var in (
        "OPENCODE_DISABLE_MODELS_FETCH=1",
        "OPENCODE_DISABLE_PROJECT_CONFIG=1",
        "OPENCODE_DISABLE_FFF=1",
        "TMPDIR=/home/agent/.opencode-run/tmp",
        "XDG_CONFIG_HOME=/home/agent/.opencode-run/config",
        "XDG_DATA_HOME=",
        "XDG_CACHE_HOME=",
        "XDG_STATE_HOME=",
    ):
        assert var in cmd, var


def test_pi_compaction_is_off_by_default_and_keeps_max_tokens_in_the_context():
    files = PiHarness().config_files(CFG, KEY, "fix it")
    settings = json.loads(files["/home/agent/.pi/agent/settings.json"][0])
    models = json.loads(files["/home/agent/.pi/agent/models.json"][0])
    assert settings["compaction"] == {"enabled": False}
    assert not any("/extensions/" in p for p in files)  # no extension: Pi runs as shipped
    (model,) = models["providers"]["capture"]["models"]
    assert model["maxTokens"] <= model["contextWindow"]
    assert KEY not in PiHarness().command(CFG)


@pytest.mark.parametrize(("context", "reserve", "keep"), [(6144, 1536, 1536), (262144, 16384, 20000)])
def test_pi_compaction_on_fits_the_context_and_records_what_print_mode_misses(context, reserve, keep):
    cfg = AgentConfig(CFG.base_url, CFG.model, context, CFG.max_tokens, {"compaction": "on"})
    files = PiHarness().config_files(cfg, KEY, "fix it")
    settings = json.loads(files["/home/agent/.pi/agent/settings.json"][0])
    # Pi's defaults (reserve 16384, keep 20000) would compact at every turn of a small context; a quarter each
    assert settings["compaction"] == {"enabled": True, "reserveTokens": reserve, "keepRecentTokens": keep}
    settle = files["/home/agent/.pi/agent/extensions/swe-gym-settle.js"][0].decode()
    assert "session_shutdown" in settle and "/home/agent/pi-trace.jsonl" in settle
    assert "mv -f /home/agent/pi-trace.jsonl /home/agent/pi-events.jsonl" in PiHarness().command(cfg)


def _pi_message(stop: str, tool_id: str | None = None, output: int = 7, error: str = "") -> str:
    content = [{"type": "toolCall", "id": tool_id, "name": "bash"}] if tool_id else []
    msg = {"role": "assistant", "stopReason": stop, "content": content, "usage": {"output": output}}
    if error:
        msg["errorMessage"] = error
    return json.dumps({"type": "message_end", "message": msg})


REFUSED = "400 engine answered HTTP 400: This model's maximum context length is 6144 tokens. However, ..."


def test_pi_trace_of_a_compaction_counts_its_summary_call_and_forgives_the_refusal_it_recovered_from():
    trace = [
        _pi_message("toolUse", "call-1"),
        _pi_message("error", output=0, error=REFUSED),  # the engine refused: the context is full
        json.dumps({"type": "compaction_start"}),
        json.dumps(
            {"type": "compaction_end", "summary": "No prior history.\n\n---\n\n**Turn Context (split turn):**\n\nx"}
        ),
        _pi_message("toolUse", "call-2"),
        _pi_message("stop"),
    ]
    out = PiHarness().parse_events("\n".join(trace))
    assert out.error_kind is None and out.model_calls == 4
    assert out.steps[1] == AgentStep(None, ())  # the summary call: Pi reports neither its tokens nor tool calls
    # two summary calls when there was history before the split turn; a refusal nothing followed stays an error
    both = json.dumps({"type": "compaction_end", "summary": "## Goal\n\n---\n\n**Turn Context (split turn):**\n"})
    assert PiHarness().parse_events("\n".join([*trace[:3], both])).model_calls == 3
    out = PiHarness().parse_events("\n".join([*trace[:3]]))
    assert out.error_kind == "agent_crashed" and "maximum context length" in (out.error or "")


def test_opencode_forgives_a_context_overflow_it_compacted_after_not_one_it_ended_on():
    def step(call: str | None = None) -> list[dict]:
        tool = [{"type": "tool_use", "part": {"callID": call}}] if call else []
        return [{"type": "step_start"}, *tool, {"type": "step_finish", "part": {"tokens": {"output": 5}}}]

    overflow = {"type": "error", "error": {"name": "ContextOverflowError", "data": {"message": "maximum context"}}}
    lines = [*step("a"), overflow, *step(), *step("b"), *step()]
    out = OpenCodeHarness().parse_events("\n".join(json.dumps(e) for e in lines))
    assert out.error_kind is None and out.model_calls == 4
    out = OpenCodeHarness().parse_events("\n".join(json.dumps(e) for e in [*step("a"), overflow]))
    assert out.error_kind == "agent_crashed" and "ContextOverflowError" in (out.error or "")


# -- codex, claude-code, gemini-cli: recorded transcripts and config hygiene ------------------------------------
def test_codex_transcript_gives_steps_with_tool_call_ids_and_token_counts():
    out = CodexHarness().parse_events(events(f"codex-{CodexHarness.version}.jsonl"))
    assert out.error_kind is None and out.model_calls == 2
    assert out.steps == [AgentStep(269, ("chatcmpl-tool-dbe0d7d531784087",)), AgentStep(9, ())]


def test_claude_code_transcript_gives_one_step_per_message_id():
    # recorded from `swe-gym-env demo --harness claude-code`; its `attachment` and `api-request*` records (skill
    # lists, full request bodies: 200 kB) left out
    out = ClaudeCodeHarness().parse_events(events(f"claude-code-{ClaudeCodeHarness.version}.jsonl"))
    assert out.error_kind is None and out.model_calls == 3
    assert out.steps == [
        AgentStep(39, ("chatcmpl-tool-19f41d7583f24a4c",)),  # Read
        AgentStep(218, ("chatcmpl-tool-d5d2ef260c004eea",)),  # Edit
        AgentStep(9, ()),
    ]


def test_gemini_cli_transcript_gives_steps_with_the_captures_tool_call_ids():
    out = GeminiCliHarness().parse_events(events(f"gemini-cli-{GeminiCliHarness.version}.jsonl"))
    assert out.error_kind is None and out.model_calls == 2
    assert out.steps == [AgentStep(233, ("chatcmpl-tool-35de1c67e0b34f5d",)), AgentStep(9, ())]


def test_codex_failure_is_read_from_its_own_events():
    line = json.dumps({"type": "error", "message": "stream disconnected: error sending request for url"})
    out = CodexHarness().parse_events(line + "\n")
    assert out.model_calls == 0 and out.error_kind == "endpoint_unreachable"
    text = {"type": "text", "text": "API Error: Connection error."}
    api = {"type": "assistant", "parentUuid": None, "isApiErrorMessage": True}
    api["message"] = {"model": "<synthetic>", "content": [text]}
    assert ClaudeCodeHarness().parse_events(json.dumps(api) + "\n").error_kind == "endpoint_unreachable"
    err = {"type": "error", "timestamp": "t", "severity": "error", "message": "fetch failed"}
    assert GeminiCliHarness().parse_events(json.dumps(err) + "\n").error_kind == "endpoint_unreachable"


@pytest.mark.parametrize("cls", [CodexHarness, ClaudeCodeHarness, GeminiCliHarness])
def test_new_harness_config_is_offline_and_keeps_the_key_out_of_argv(cls):
    h = cls()
    files = h.config_files(CFG, KEY, "fix it")
    cmd = h.command(CFG)
    assert KEY not in cmd and all(mode == 0o600 for _, mode in files.values())
    assert [p for p, (d, _) in files.items() if KEY.encode() in d] == ["/home/agent/.capture.env"]
    assert "/opt/swe-gym-agent/" in cmd and h.dialect in ("openai-responses", "anthropic-messages", "gemini")
    text = b"\n".join(d for d, _ in files.values()).decode() + cmd
    if cls is CodexHarness:
        for want in (
            'wire_api = "responses"',
            'env_key = "SWE_GYM_CAPTURE_KEY"',
            "[analytics]\nenabled = false",
            "plugins = false",
            'web_search = "disabled"',
            "check_for_update_on_startup = false",
        ):
            assert want in text, want
        assert "[projects" not in text and "mcp_servers" not in text  # the task repo is never trusted
    elif cls is ClaudeCodeHarness:
        for want in (
            "--strict-mcp-config",
            "--setting-sources user",
            "--max-turns 100",
            "--disallowedTools",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
            "DISABLE_TELEMETRY=1",
            "DISABLE_AUTOUPDATER=1",
            "CLAUDE_CONFIG_DIR=/home/agent/.claude",
        ):
            assert want in text, want
    else:
        settings = h.settings(CFG)
        assert settings["advanced"]["ignoreLocalEnv"] is True and settings["telemetry"]["enabled"] is False
        assert settings["privacy"]["usageStatisticsEnabled"] is False and settings["ide"]["enabled"] is False
        assert settings["general"]["enableAutoUpdate"] is False and settings["model"]["maxSessionTurns"] == 100
        assert "web_fetch" in settings["tools"]["exclude"] and settings["mcp"]["allowed"] == ["swe-gym-no-mcp-server"]
        assert "--allowed-mcp-server-names swe-gym-no-mcp-server" in cmd
        # the workspace is trusted (else --yolo is downgraded): ours are the system settings, which override its own
        assert settings["hooksConfig"] == {"enabled": False} and settings["mcp"]["serverCommand"] == ""
        assert settings["tools"]["discoveryCommand"] == settings["tools"]["callCommand"] == ""
        assert "GEMINI_CLI_SYSTEM_SETTINGS_PATH=/home/agent/.gemini-system-settings.json" in text
