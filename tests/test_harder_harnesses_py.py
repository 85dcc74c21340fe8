"""The PyPI harnesses of issue 44 (Aider, Hermes Agent) end to end and in parts.

End to end: one `swe-gym-env demo --harness X` each on `local` under strace (`test_five_harnesses`' watcher: nothing in
the agent's process tree connects or looks up a name but through the capture relay), the task solved with the
built-in engine's oracle, the agent's own log cross-checked (`match`); and once on `landlock`. In parts: each one's
configuration (the key only in the env file, the switches that keep it offline), its record parsed from a recorded
sample, and the cross-check failing where its record and the capture disagree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require
from test_five_harnesses import (
    CFG,
    demo_solved_hermetically,
    installed_harness,
    secret_only_in_the_env_file,
)
from test_harness_units import turn

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AgentError, AgentStep, Harness, reconcile
from swe_gym_env.server.agents.harnesses.aider import LAUNCHER as AIDER_LAUNCHER
from swe_gym_env.server.agents.harnesses.aider import llm_replies
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.engine.policy import OraclePolicy, edit_blocks
from swe_gym_env.tasks.catalog import bundled_tasks

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
HARNESSES = ["aider", "hermes"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_demo_solves_the_task_matches_its_own_log_and_reaches_only_the_capture(
    harness, need_sandbox, need_tokenizer, tmp_path
):
    demo_solved_hermetically(harness, tmp_path, min_turns=1)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", HARNESSES)
def test_demo_on_landlock(harness, need_sandbox, need_tokenizer):
    installed_harness(harness)
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--harness", harness, "--sandbox", "landlock", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"] and result["reward"] == 1.0, (result.get("error"), run.stderr[-2000:])
    assert result["cross_check"] == "match", result["cross_check_detail"]


def configured(name: str) -> tuple[Harness, dict[str, tuple[bytes, int]], str]:
    """The harness, its files and its command for `CFG`, the key checked to be only in the env file."""
    h = get_harness(name)
    files, cmd = h.config_files(CFG, "sgk-secret", "fix it"), h.command(CFG)
    secret_only_in_the_env_file(files, cmd)
    return h, files, cmd


# -- Aider -------------------------------------------------------------------------------------------------------------
def test_aider_configuration_keeps_the_key_in_the_env_file_and_itself_offline():
    _, files, cmd = configured("aider")
    assert files["/home/agent/.capture.env"][0].startswith(b"OPENAI_API_KEY=")
    settings = json.loads(files["/home/agent/aider-model-settings.yml"][0])  # JSON is YAML
    assert settings == [
        {
            "name": "openai/Qwen/Qwen3-8B",
            "edit_format": "diff",
            "use_repo_map": False,
            "weak_model_name": "openai/Qwen/Qwen3-8B",
            "editor_model_name": "openai/Qwen/Qwen3-8B",
            "extra_params": {"max_tokens": 512},
        }
    ]
    meta = json.loads(files["/home/agent/aider-model-metadata.json"][0])
    assert meta["openai/Qwen/Qwen3-8B"]["max_input_tokens"] == 32768
    # its price-table cache, pre-seeded non-empty (an empty one is fetched again)
    prices = files["/home/agent/.aider/caches/model_prices_and_context_window.json"][0]
    assert json.loads(prices) == meta
    run = next(line for line in cmd.splitlines() if "--message-file" in line)
    assert "--openai-api-base http://127.0.0.1:9/capture/v1 " in run and "--message-file /home/agent/prompt.txt" in run
    for switch in ("--no-check-update", "--analytics-disable", "--no-auto-commits", "--no-gitignore", "--yes-always"):
        assert switch in run
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in cmd and "HOME=/home/agent" in cmd
    assert "unset OPENAI_API_BASE OPENAI_BASE_URL" in cmd and "AIDER_" in cmd


@pytest.fixture
def aider_python() -> list[str]:
    h = get_harness("aider")
    try:
        root = h.finished_install()
    except AgentError as e:
        require(False, str(e))
    return pyruntime.python_command(str(root)).split()


def test_aider_reads_no_config_of_the_work_tree(aider_python, tmp_path):
    """A task repository's `.aider.conf.yml` and `.env` (which could point Aider at another endpoint or model, or
    turn its test runs on) are not read through our launcher; Aider itself, started plainly, does read them."""
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".aider.conf.yml").write_text("model: openai/from-the-repo\n")
    (repo / ".env").write_text("AIDER_MODEL=openai/from-the-dotenv\n")
    launch = tmp_path / "launch.py"
    launch.write_text(AIDER_LAUNCHER)
    args = ["--exit", "--no-check-update", "--analytics-disable", "--yes-always", "--no-pretty", "--no-fancy-input"]
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "SWE_GYM_NET_LOG": str(tmp_path / "net"), "OPENAI_API_KEY": "x"}

    def model(start: list[str]) -> str:
        out = subprocess.run([*start, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        return next((line for line in out.stdout.splitlines() if line.startswith("Model:")), out.stdout[-500:])

    assert "from-the-dotenv" in model([*aider_python, "-m", "aider"])  # plain Aider: the repo's files decide
    assert model([*aider_python, str(launch), "--model", "openai/ours"]).startswith("Model: openai/ours ")
    assert model([*aider_python, str(launch)]).split()[1] not in ("openai/from-the-repo", "openai/from-the-dotenv")


def test_aider_record_gives_each_call_its_reply_text_and_the_files_edited_from_it():
    text = (FIXTURES / "aider-two-calls.txt").read_text()
    reply = "I will fix it.\n\ncalc.py\n```python\n<<<<<<< SEARCH\n    return a - b\n=======\n    return a + b\n"
    reply += ">>>>>>> REPLACE\n```"
    assert llm_replies(text) == [reply, reply]
    out = get_harness("aider").parse_events(text)
    assert out.error_kind is None and out.model_calls == 2
    assert [(s.content, s.edited) for s in out.steps] == [(reply, ()), (reply, ("calc.py",))]

    def answered(i: int, content: str):
        t = turn(i, 32)
        return t.model_copy(update={"response_message": {"role": "assistant", "content": content}})

    assert reconcile(out, [answered(0, reply), answered(1, reply + "\n")], 0).verdict == "match"
    other = reconcile(out, [answered(0, reply), answered(1, reply.replace("a + b", "a * b"))], 0)
    assert other.verdict == "mismatch" and "text is not the captured reply's" in other.detail
    # an edit the agent says it applied from a reply that names no such file: not the captured reply's doing
    elsewhere = reply.replace("calc.py", "other.py")
    out.steps[1] = AgentStep(None, (), elsewhere, ("calc.py",))
    moved = reconcile(out, [answered(0, reply), answered(1, elsewhere)], 0)
    assert moved.verdict == "mismatch" and "the captured reply names no such file" in moved.detail


def test_aider_record_of_an_unreachable_endpoint():
    chat = (
        "#### fix it\n"
        + "> litellm.InternalServerError: InternalServerError: OpenAIException - Connection error.\n" * 3
    )
    out = get_harness("aider").parse_events(chat)
    assert out.model_calls == 0 and out.error_kind == "endpoint_unreachable"
    after = get_harness("aider").parse_events((FIXTURES / "aider-two-calls.txt").read_text() + chat)
    assert after.model_calls == 2 and after.error_kind == "agent_crashed"  # it gave up on a third call


def test_the_oracle_answers_aider_with_its_edit_blocks_then_again_once_it_added_the_files():
    task = bundled_tasks()[0]
    system = {"role": "system", "content": "reply with *SEARCH/REPLACE* blocks like\n<<<<<<< SEARCH\n"}
    example = [{"role": "user", "content": "an example"}, {"role": "assistant", "content": "an example reply"}]
    asked = [system, *example, {"role": "user", "content": f"working on:\n{task.problem_statement}"}]
    policy = OraclePolicy()
    first = policy.reply(asked, None)
    assert first.content == edit_blocks(task.patch) and "<<<<<<< SEARCH" in first.content and not first.tool_calls
    added = [*asked, {"role": "assistant", "content": first.content}]
    again = policy.reply([*added, {"role": "user", "content": "I added these files to the chat: x.py\nLet me"}], None)
    assert again.content == first.content
    done = policy.reply([*added, {"role": "user", "content": "some other answer"}], None)
    assert done.content is not None and "SEARCH" not in done.content


def test_edit_blocks_carry_each_hunk_and_new_files():
    patch = (
        "diff --git a/pkg/m.py b/pkg/m.py\n--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n"
        "+    return 2\ndiff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n"
        "@@ -0,0 +1 @@\n+X = 1\n"
    )
    blocks = edit_blocks(patch)
    assert (
        "pkg/m.py\n```\n<<<<<<< SEARCH\ndef f():\n    return 1\n=======\ndef f():\n    return 2\n>>>>>>> REPLACE"
        in blocks
    )
    assert "new.py\n```\n<<<<<<< SEARCH\n=======\nX = 1\n>>>>>>> REPLACE" in blocks


# -- Hermes Agent ------------------------------------------------------------------------------------------------------
def test_hermes_configuration_keeps_the_key_in_the_env_file_and_itself_offline():
    import yaml

    h, files, cmd = configured("hermes")
    conf = yaml.safe_load(files["/home/agent/.hermes-home/config.yaml"][0])
    assert conf["model"] == {
        "provider": "custom",
        "base_url": "http://127.0.0.1:9/capture/v1",
        "api_key": "${OPENAI_API_KEY}",  # Hermes expands it from its environment: the env file's
        "default": "Qwen/Qwen3-8B",
        "context_length": 32768,
        "max_tokens": 512,
        "ollama_num_ctx": 0,  # given: no probe of the endpoint for Ollama's
    }
    assert conf["security"] == {"tirith_enabled": False}  # else it downloads tirith from GitHub on its first run
    assert conf["agent"] == {"max_turns": 100, "environment_probe": False}
    update = json.loads(files["/home/agent/.hermes-home/.update_check"][0])  # a fresh cache: no update check
    assert update["ver"] == h.version and update["ts"] > 4e9
    assert files["/home/agent/prompt.txt"][0] == b"fix it"
    run = next(line for line in cmd.splitlines() if "hermes-launch.py" in line)
    assert "-t terminal,file,todo --ignore-rules" in run and "--yolo" in run and "--max-turns 100" in run
    assert "TIRITH_ENABLED=false" in cmd and "HERMES_HOME=/home/agent/.hermes-home" in cmd and "HERMES_" in cmd
    assert h.min_context_tokens == 65536  # its MINIMUM_CONTEXT_LENGTH


def test_hermes_launcher_takes_out_its_price_lookup_and_reads_the_prompt_from_a_file():
    from swe_gym_env.server.agents.harnesses.hermes import LAUNCHER

    assert "usage_pricing.fetch_endpoint_model_metadata = lambda" in LAUNCHER
    assert 'sys.argv[1:1] = ["chat", "-q", prompt]' in LAUNCHER


def test_hermes_record_gives_a_step_per_call_with_its_completion_tokens():
    text = (FIXTURES / "hermes-agent-log.txt").read_text()
    out = get_harness("hermes").parse_events(text)
    assert out.error_kind is None and [s.completion_tokens for s in out.steps] == [5]
    assert reconcile(out, [turn(0, 5)], 0).verdict == "match"
    other = reconcile(out, [turn(0, 6)], 0)
    assert other.verdict == "mismatch" and "completion tokens" in other.detail


def test_hermes_record_of_an_unreachable_endpoint():
    out = get_harness("hermes").parse_events((FIXTURES / "hermes-agent-log-unreachable.txt").read_text())
    assert out.model_calls == 0 and out.error_kind == "endpoint_unreachable", out.error


@pytest.mark.parametrize("api", ["codex_responses", "anthropic_messages"])
def test_hermes_other_dialects_go_through_a_named_provider_with_its_api_mode(api):
    import dataclasses

    import yaml

    from swe_gym_env.wire import HARNESS_OPTIONS

    assert api in HARNESS_OPTIONS["hermes"]["api"]
    cfg = dataclasses.replace(CFG, options={"api": api})
    conf = yaml.safe_load(
        get_harness("hermes").config_files(cfg, "sgk-secret", "fix it")["/home/agent/.hermes-home/config.yaml"][0]
    )
    base = "http://127.0.0.1:9/capture" + ("/v1" if api == "codex_responses" else "")  # Anthropic's SDK adds /v1
    assert conf["model"]["provider"] == "custom:capture" and "base_url" not in conf["model"]
    assert conf["providers"] == {
        "capture": {"base_url": base, "api_key": "${OPENAI_API_KEY}", "api_mode": api, "default_model": "Qwen/Qwen3-8B"}
    }


def test_aider_on_anthropic_messages_through_litellm_with_the_key_only_in_its_environment():
    import dataclasses

    from swe_gym_env.wire import HARNESS_OPTIONS

    assert HARNESS_OPTIONS["aider"]["api"] == ("openai", "anthropic")
    cfg = dataclasses.replace(CFG, options={"api": "anthropic"})
    h = get_harness("aider")
    files, cmd = h.config_files(cfg, "sgk-secret", "fix it"), h.command(cfg)
    secret_only_in_the_env_file(files, cmd)
    run = next(line for line in cmd.splitlines() if "--message-file" in line)
    assert "--model anthropic/Qwen/Qwen3-8B --set-env ANTHROPIC_API_BASE=http://127.0.0.1:9/capture " in run
    assert "--openai-api-base" not in run
    assert 'export ANTHROPIC_API_KEY="$OPENAI_API_KEY"' in cmd  # from the env file, into its environment only
    meta = json.loads(files["/home/agent/aider-model-metadata.json"][0])
    assert meta["anthropic/Qwen/Qwen3-8B"]["litellm_provider"] == "anthropic"
