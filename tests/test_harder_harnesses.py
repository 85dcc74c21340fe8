"""The npm harnesses of issue 44 (Droid, OpenClaw) end to end and in their parts.

End to end: `swe-gym-env demo --harness X` in a subprocess (the real CLI from its bundle against the built-in engine's
oracle through /capture, real grading, the agent's own log cross-checked against the capture), on `local` traced with
strace (the same watcher as tests/test_five_harnesses.py: nothing in the agent's process tree may connect or look up a
name but through the capture relay), and on `landlock`. Units: each one's configuration (hermetic switches, the key
only in the env file, each dialect it speaks) and its own log read from recorded samples."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from conftest import require
from test_five_harnesses import CFG, secret_only_in_the_env_file, traced_demo

from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.registry import get_harness

HARDER = ["droid"]  # the npm harnesses of issue 44 landed so far


def ready(harness: str):
    h = get_harness(harness)
    try:
        h.mounts()
    except AgentError as e:
        require(False, f"{harness}: {e}")
    return h


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARDER)
def test_demo_solves_the_task_matches_its_own_log_and_reaches_only_the_capture(
    harness, need_sandbox, need_tokenizer, tmp_path
):
    require(shutil.which("strace") is not None, "strace missing: apt-get install strace")
    h = ready(harness)
    result, mine, outbound = traced_demo(harness, "local", tmp_path)
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    assert len(result["turns"]) >= 2 and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {h.dialect}
    assert result["turns"][0]["prompt_len"] < h.min_context_tokens
    assert any("127.0.0.1" in line for line in mine), f"the agent's calls to the relay were not traced: {mine}"
    assert outbound == [], "\n".join(outbound)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARDER)
def test_demo_on_landlock(harness, need_tokenizer):
    from swe_gym_env.server.sandbox.landlock import preflight

    ok, why = preflight()
    require(ok, f"landlock backend unavailable here: {why}")
    ready(harness)
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
