"""The npm harnesses of issue 44 (Droid, OpenClaw) end to end and in their parts.

End to end: `swe-gym-env demo --harness X` in a subprocess (the real CLI from its bundle against the built-in engine's
oracle through /capture, real grading, the agent's own log cross-checked against the capture), on `local` traced with
strace (the same watcher as tests/test_five_harnesses.py: nothing in the agent's process tree may connect or look up a
name but through the capture relay), and on `landlock`. Units: each one's configuration (hermetic switches, the key
only in the env file, each dialect it speaks) and its own log read from recorded samples."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import require
from test_five_harnesses import (
    CFG,
    demo_solved_hermetically,
    installed_harness,
    secret_only_in_the_env_file,
)

from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.registry import get_harness

HARDER = ["droid", "openclaw"]  # the npm harnesses of issue 44
# on landlock too where cheap: OpenClaw's demo there costs ~45 s more (its start: ~17 s of CPU); its landlock-only need
# (its fixed /tmp paths following TMPDIR) is held by test_openclaw_bundle_patch_finds_each_fixed_tmp_path and its build
LANDLOCK = ["droid"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARDER)
def test_demo_solves_the_task_matches_its_own_log_and_reaches_only_the_capture(
    harness, need_sandbox, need_tokenizer, tmp_path
):
    demo_solved_hermetically(harness, tmp_path)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", LANDLOCK)
def test_demo_on_landlock(harness, need_tokenizer):
    from swe_gym_env.server.sandbox.landlock import preflight

    ok, why = preflight()
    require(ok, f"landlock backend unavailable here: {why}")
    installed_harness(harness)
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--harness", harness, "--sandbox", "landlock", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"], (result.get("error"), run.stderr[-2000:])
    assert result["reward"] == 1.0 and result["cross_check"] == "match", result["cross_check_detail"]


# -- Droid ---------------------------------------------------------------------------------------------------------
DROID_ORG = "/home/agent/.droid-org-settings.json"


def test_droid_is_airgapped_pinned_to_the_capture_above_the_repos_settings_and_keeps_the_key_in_the_env():
    h = get_harness("droid")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    org = json.loads(files[DROID_ORG][0])
    assert org["customModels"] == [
        {
            "model": "Qwen/Qwen3-8B",
            "displayName": "capture",  # its id: custom:capture-0
            "baseUrl": "http://127.0.0.1:9/capture/v1",
            "apiKey": "${SWE_GYM_CAPTURE_KEY}",
            "provider": "generic-chat-completion-api",
            "maxContextLimit": 32768,
            "maxOutputTokens": 512,
            "noImageSupport": True,
        }
    ]
    # a repo's .factory/settings.json naming another endpoint is refused by the org level's policy
    assert org["modelPolicy"] == {"allowCustomModels": True, "allowedBaseUrls": ["http://127.0.0.1:9/capture/v1"]}
    assert org["allowManagedHooksOnly"] is True and org["cloudSessionSync"] is False
    user = json.loads(files["/home/agent/.droid-home/.factory/settings.json"][0])
    assert user["compactionTokenLimit"] == int(0.8 * 32768) - 512  # not its 250,000 for any custom model
    assert files["/home/agent/.capture.env"][0] == b"SWE_GYM_CAPTURE_KEY=sgk-secret\n"
    # the image's FACTORY_* / DROID_* unset, then ours: Airgap Mode (no lookup of its own hosts), private home
    assert cmd.index("FACTORY\\|DROID") < cmd.index("FACTORY_AIRGAP_ENABLED=1")
    assert f"FACTORY_ORG_MANAGED_SETTINGS_LOCAL_PATH={DROID_ORG}" in cmd
    assert "FACTORY_HOME_OVERRIDE=/home/agent/.droid-home" in cmd
    run = next(line for line in cmd.splitlines() if "bin/droid exec" in line)
    assert run.startswith("/opt/swe-gym-agent/bin/droid exec --skip-permissions-unsafe --disable-builtin-skills ")
    assert "--only-tools Read,LS,Execute,Edit,Grep,Glob,Create " in run and "-m custom:capture-0 " in run
    assert "-o stream-json" in run and "-f /home/agent/prompt.txt" in run


@pytest.mark.parametrize(
    ("api", "base", "dialect"),
    [
        ("generic-chat-completion-api", "/capture/v1", "openai-chat"),
        ("openai", "/capture/v1", "openai-responses"),
        ("anthropic", "/capture", "anthropic-messages"),
    ],
)
def test_droid_speaks_each_of_its_custom_model_providers_to_the_capture(api, base, dialect):
    from swe_gym_env.server.agents.harnesses.droid import APIS
    from swe_gym_env.wire import HARNESS_OPTIONS, RolloutRequest

    assert RolloutRequest(harness="droid", harness_options={"api": api}).harness_options == {"api": api}
    assert HARNESS_OPTIONS["droid"]["api"] == tuple(APIS) and APIS[api][0] == dialect
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    org = json.loads(get_harness("droid").config_files(cfg, "sgk-secret", "fix it")[DROID_ORG][0])
    assert org["customModels"][0]["provider"] == api
    assert org["customModels"][0]["baseUrl"] == org["modelPolicy"]["allowedBaseUrls"][0] == f"http://127.0.0.1:9{base}"
    with pytest.raises(ValueError):  # its `google` provider is no custom-model provider (no model configured)
        RolloutRequest(harness="droid", harness_options={"api": "google"})


def droid_record(*events: dict, stream: tuple[dict, ...] = ()) -> str:
    """A session file (as 0.215.0 writes it) followed by its stream-json output, as the harness collects them."""
    session = [{"type": "session_start", "id": "s1", "cwd": "/testbed", "version": 2}, *events]
    return "".join(json.dumps(e) + "\n" for e in (*session, *stream))


def test_droid_record_gives_one_step_per_reply_and_per_compaction():
    def msg(role: str, *content: dict) -> dict:
        return {"type": "message", "id": "m", "message": {"role": role, "content": list(content)}}

    text = droid_record(
        msg("user", {"type": "text", "text": "fix it"}),
        msg("assistant", {"type": "tool_use", "id": "call_1", "name": "Execute", "input": {}}),
        msg("user", {"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}),
        {"type": "compaction_state", "id": "c", "summaryText": "…", "summaryKind": "llm_summary", "removedCount": 1},
        msg("assistant", {"type": "text", "text": "done"}),
        {"type": "agent_turn_outcome", "reason": "completed"},
        stream=(
            {"type": "message", "role": "assistant", "text": "done"},  # its stream's copy: not a second step
            {"type": "completion", "finalText": "done", "numTurns": 2},
        ),
    )
    out = get_harness("droid").parse_events(text)
    assert [s.tool_call_ids for s in out.steps] == [("call_1",), (), ()]
    assert out.error_kind is None and out.completion_tokens == []  # no per-call counts in its record


def test_droid_unreachable_endpoint_is_named_from_its_loop_not_its_exit_summary():
    stream = (
        {"type": "error", "source": "agent_loop", "message": "Connection error."},
        {"type": "error", "source": "cli", "message": "Exec failed"},
    )
    dead = get_harness("droid").parse_events(droid_record(stream=stream))
    assert dead.error_kind == "endpoint_unreachable" and dead.error == "Connection error." and dead.model_calls == 0
    crashed = get_harness("droid").parse_events(droid_record(stream=stream[1:]))
    assert crashed.error_kind == "agent_crashed" and crashed.error == "Exec failed"


# -- OpenClaw ------------------------------------------------------------------------------------------------------
OPENCLAW_CONFIG = "/home/agent/openclaw-config.json"


def test_openclaw_config_is_pinned_to_the_capture_with_the_file_and_shell_tools_only():
    h = get_harness("openclaw")
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    conf = json.loads(files[OPENCLAW_CONFIG][0])
    assert conf["models"] == {
        "mode": "replace",  # our provider only: no discovery of others
        "providers": {
            "capture": {
                "baseUrl": "http://127.0.0.1:9/capture/v1",
                "apiKey": "${SWE_GYM_CAPTURE_KEY}",
                "api": "openai-completions",
                "models": [
                    {
                        "id": "Qwen/Qwen3-8B",
                        "name": "capture",
                        "contextWindow": 32768,
                        "maxTokens": 512,
                        "input": ["text"],
                        "reasoning": False,
                    }
                ],
            }
        },
    }
    assert conf["tools"] == {
        "profile": "coding",
        "allow": ["read", "write", "edit", "apply_patch", "exec", "process", "ls"],
        "toolSearch": False,
    }
    assert conf["update"] == {"checkOnStart": False}
    assert conf["agents"]["defaults"]["compaction"]["memoryFlush"] == {"enabled": False}  # no model call of its own
    assert files["/home/agent/.capture.env"][0] == b"SWE_GYM_CAPTURE_KEY=sgk-secret\n"
    assert cmd.index("(OPENCLAW_[A-Za-z0-9_]*") < cmd.index("export OPENCLAW_HOME=/home/agent/.openclaw-home")
    assert "OPENCLAW_NO_AUTO_UPDATE=1 TMPDIR=/home/agent/.openclaw-home/tmp" in cmd
    run = next(line for line in cmd.splitlines() if "openclaw.mjs agent exec" in line)
    assert run.startswith(
        "/opt/swe-gym-agent/node/bin/node /opt/swe-gym-agent/openclaw/node_modules/openclaw/openclaw.mjs "
    )
    assert f"--config {OPENCLAW_CONFIG} --state-dir /home/agent/.openclaw-state " in run
    assert "--model Qwen/Qwen3-8B" not in run and "--model capture/Qwen/Qwen3-8B " in run
    assert "--message-file /home/agent/prompt.txt" in run and "--json" in run
    # its SQLite transcript dumped by the bundle's own Node, while it runs and after
    assert "/opt/swe-gym-agent/node/bin/node /home/agent/openclaw-dump.mjs " in cmd


@pytest.mark.parametrize(
    ("api", "base", "dialect"),
    [
        ("openai-completions", "/capture/v1", "openai-chat"),
        ("openai-responses", "/capture/v1", "openai-responses"),
        ("anthropic-messages", "/capture", "anthropic-messages"),
        ("google-generative-ai", "/capture/v1beta", "gemini"),
    ],
)
def test_openclaw_speaks_each_provider_api_to_the_capture(api, base, dialect):
    from swe_gym_env.server.agents.harnesses.pi_apis import PI_APIS
    from swe_gym_env.wire import HARNESS_OPTIONS, RolloutRequest

    assert RolloutRequest(harness="openclaw", harness_options={"api": api}).harness_options == {"api": api}
    assert HARNESS_OPTIONS["openclaw"]["api"] == tuple(PI_APIS) and PI_APIS[api] == dialect
    cfg = AgentConfig(**{**CFG.__dict__, "options": {"api": api}})
    conf = json.loads(get_harness("openclaw").config_files(cfg, "sgk-secret", "fix it")[OPENCLAW_CONFIG][0])
    assert conf["models"]["providers"]["capture"]["api"] == api
    assert conf["models"]["providers"]["capture"]["baseUrl"] == f"http://127.0.0.1:9{base}"


def test_openclaw_record_is_its_transcript_then_its_envelope():
    def reply(*content: dict, output: int, stop: str = "toolUse") -> dict:
        usage = {"input": 10, "output": output, "totalTokens": 10 + output}
        msg = {"role": "assistant", "content": list(content), "usage": usage, "stopReason": stop}
        return {"type": "message", "id": "m", "message": msg}

    events = [
        {"type": "session", "version": 4, "id": "s1", "cwd": "/testbed"},
        {"type": "message", "message": {"role": "user", "content": "fix it"}},
        reply({"type": "toolCall", "id": "call_1", "name": "edit", "arguments": {}}, output=217),
        {"type": "message", "message": {"role": "toolResult", "toolCallId": "call_1", "content": []}},
        {"type": "compaction", "summary": "…", "firstKeptEntryId": "m"},
        reply({"type": "toolCall", "id": "call_2|fc_9", "name": "exec", "arguments": {}}, output=30),  # Responses
        reply({"type": "text", "text": "done"}, output=9, stop="stop"),
        {"ok": True, "status": "ok", "final": "done", "assistantTurns": 3},
    ]
    out = get_harness("openclaw").parse_events("".join(json.dumps(e) + "\n" for e in events))
    assert [(s.completion_tokens, s.tool_call_ids) for s in out.steps] == [
        (217, ("call_1",)),
        (None, ()),
        (30, ("call_2",)),
        (9, ()),
    ]
    assert out.error_kind is None


def test_openclaw_failures_come_from_its_transcript_or_its_envelope():
    refused = {
        "type": "message",
        "message": {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "Connection error."},
    }
    envelope = {"ok": False, "status": "error", "error": {"message": "Connection error.", "kind": "model"}}
    dead = get_harness("openclaw").parse_events(json.dumps(refused) + "\n" + json.dumps(envelope) + "\n")
    assert dead.error_kind == "endpoint_unreachable" and dead.model_calls == 0
    bad_config = {"ok": False, "status": "error", "error": {"message": "Invalid config at /home/agent/openclaw.json"}}
    crashed = get_harness("openclaw").parse_events(json.dumps(bad_config) + "\n")
    assert crashed.error_kind == "agent_crashed" and "Invalid config" in (crashed.error or "")


def test_openclaw_bundle_patch_finds_each_fixed_tmp_path(tmp_path):
    """Its fixed /tmp paths follow $TMPDIR once patched (minified and plain chunks alike); a build whose package no
    longer has one of them fails instead of making a bundle `landlock` cannot start."""
    from swe_gym_env.server.agents.harnesses.openclaw import PATCHED, patch_tmp

    dist = tmp_path / "openclaw" / "dist"
    (dist / "worker").mkdir(parents=True)
    (dist / "worker" / "w.mjs").write_text(
        "p=Ot.preferredDir??`/tmp/openclaw`;q=win?path.join(os.homedir(),`AppData`,`Local`,`OpenClaw`,`locks`):`/tmp`:x"
    )
    (dist / "a.js").write_text(
        'return win ? path.join(os.homedir(), "AppData", "Local", "OpenClaw", "locks") : "/tmp";\n'
        'DEFAULT_POSIX_TMP_ROOT = "/tmp/openclaw";\n'
    )
    patch_tmp(dist.parent)
    text = (dist / "worker" / "w.mjs").read_text() + (dist / "a.js").read_text()
    assert '"/tmp/openclaw"' not in text and "`/tmp/openclaw`" not in text and ': "/tmp";' not in text
    assert text.count('(process.env.TMPDIR||"/tmp")') == 4 and (dist.parent / PATCHED).is_file()
    patch_tmp(dist.parent)  # once: the install is kept between builds
    (dist.parent / PATCHED).unlink()
    (dist / "a.js").write_text("nothing to patch\n")
    (dist / "worker" / "w.mjs").write_text("nor here\n")
    with pytest.raises(AgentError, match="/tmp paths were not all found"):
        patch_tmp(dist.parent)
