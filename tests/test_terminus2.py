"""Terminus-2 (harbor's `terminus-2` agent) as a harness: its own loop in the sandbox, driving the tmux its bundle
brings, against the built-in engine's oracle (which answers in Terminus-2's JSON / XML keystroke format).

End to end: the demo task on `local` under strace (the agent's process tree reaches only the capture relay: the
watcher of tests/test_five_harnesses.py), cross-checked against its own ATIF trajectories; the XML reply format and
Anthropic Messages; `landlock` refused at validate (tmux makes its own pty and talks over a unix socket: neither
exists there). Units: its trajectories read back (recorded from real runs: the demo, a run stopped by the call budget,
a reply cut at max_tokens), a summarization's calls put in their place, its configuration (the key only in the env
file and litellm's memory), and the oracle's replies parsed by harbor's own parsers in the bundle's Python."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import require
from test_five_harnesses import traced_demo
from test_harness_units import turn

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AgentConfig, AgentError, reconcile
from swe_gym_env.server.agents.harnesses.terminus2 import (
    LAUNCHER,
    PY,
    TMUX,
    TMUX_WRAPPER,
    Terminus2Harness,
    _documents,
)
from swe_gym_env.server.agents.registry import get_harness
from swe_gym_env.server.engine.policy import KEYSTROKE_CHUNK, OraclePolicy
from swe_gym_env.tasks.catalog import bundled_tasks
from swe_gym_env.wire import RolloutRequest, Turn

from helpers import Stack

# the one unix socket the agent's tree may use beside the capture's: its tmux server's, under TMUX_TMPDIR
TMUX_SOCKET = re.compile(r'sa_family=AF_UNIX, sun_path="/home/agent/tmux-\d+/default"')
FIXTURES = Path(__file__).parent / "fixtures" / "agents" / "terminus-2"
CFG = AgentConfig(
    base_url="http://127.0.0.1:9/capture", model="Qwen/Qwen3-8B", context_window=32768, max_tokens=512, max_calls=7
)


def built() -> Terminus2Harness:
    h = get_harness("terminus-2")
    assert isinstance(h, Terminus2Harness)
    try:
        h.mounts()
    except AgentError as e:
        require(False, f"terminus-2: {e}")
    return h


# -- end to end ------------------------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_demo_solves_the_task_matches_its_trajectories_and_reaches_only_the_capture(
    need_sandbox, need_tokenizer, tmp_path
):
    h = built()
    result, mine, outbound = traced_demo("terminus-2", "local", tmp_path)
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    # the patch typed in, then task_complete, then its confirmation: three calls, none discarded
    assert len(result["turns"]) == 3 and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {"openai-chat"}
    assert result["turns"][0]["prompt_len"] < h.min_context_tokens // 4  # its template + the task: short
    assert any("127.0.0.1" in line for line in mine), f"the agent's calls to the relay were not traced: {mine}"
    # tmux's client talks to its own server over a unix socket in the agent's home (TMUX_TMPDIR): not a peer outside
    own = [line for line in outbound if TMUX_SOCKET.search(line)]
    assert own, "tmux's own socket was not traced (the check below would see nothing of tmux)"
    assert [line for line in outbound if line not in own] == [], "\n".join(outbound)


@pytest.fixture(scope="module")
def stack():
    s = Stack("oracle", env={"SWE_GYM_ENGINE_MAX_MODEL_LEN": str(Terminus2Harness.min_context_tokens)})
    yield s
    s.stop()


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.slow
async def test_its_xml_format_and_anthropic_messages_solve_the_task_too_and_landlock_is_refused(
    stack, need_sandbox, need_tokenizer
):
    built()
    async with SweGymClient(stack.mcp_url) as c:
        xml = await c.run_rollout(harness="terminus-2", harness_options={"parser": "xml"}, sandbox="local")
        anthropic = await c.run_rollout(harness="terminus-2", harness_options={"api": "anthropic"}, sandbox="local")
        refused = await c.run_rollout(harness="terminus-2", sandbox="landlock")
    assert xml.ok and xml.reward == 1.0, xml.error
    assert xml.cross_check == "match", xml.cross_check_detail
    assert "<keystrokes" in str(xml.turns[0].response_message.get("content"))
    assert anthropic.ok and anthropic.reward == 1.0, anthropic.error
    assert anthropic.cross_check == "match", anthropic.cross_check_detail
    assert {t.dialect for t in anthropic.turns} == {"anthropic-messages"}
    assert not refused.ok and refused.phase == "validate" and refused.reward is None
    assert "needs a pty its own process makes (a tmux server)" in (refused.error or ""), refused.error


# -- its record -------------------------------------------------------------------------------------------------------
def turns(*completions: int) -> list[Turn]:
    return [turn(i, n) for i, n in enumerate(completions)]


def test_its_trajectory_of_the_demo_is_three_calls_with_their_completion_tokens():
    out = Terminus2Harness().parse_events((FIXTURES / "demo-events.json").read_text())
    assert out.model_calls == 3 and out.completion_tokens == [580, 40, 40] and out.error_kind is None
    assert reconcile(out, turns(580, 40, 40), 0).verdict == "match"
    assert reconcile(out, turns(580, 41, 40), 0).verdict == "mismatch"  # a count it did not see: caught


def test_a_run_stopped_by_the_budget_counts_the_budget_reply_as_the_last_step():
    out = Terminus2Harness().parse_events((FIXTURES / "budget-events.json").read_text())
    # the patch, then the proxy's budget reply (not JSON: a parse-error step with no tokens); max_turns ended the loop
    assert out.model_calls == 2 and out.completion_tokens == [580, 0] and out.error_kind is None
    r = reconcile(out, turns(580), budget_replies=1)
    assert r.verdict == "match" and r.missing == 0


def summarized(sample: str) -> str:
    """The demo's record with one summarization before its second call, as harbor writes one: a system step naming its
    three subagents' trajectories, each with copied steps (no metrics) and its own call."""
    exit_doc, main = _documents(sample)
    refs = [
        {"session_id": f"s-summarization-1-{k}", "trajectory_path": f"trajectory.summarization-1-{k}.json"}
        for k in ("summary", "questions", "answers")
    ]
    results = [{"subagent_trajectory_ref": refs}]
    system = {"step_id": 3, "source": "system", "message": "summarized", "observation": {"results": results}}
    main["steps"].insert(2, system)
    subs = [
        {
            "session_id": ref["session_id"],
            "agent": {"name": f"terminus-2-summarization-{ref['session_id'].rsplit('-', 1)[1]}"},
            "steps": [
                {"step_id": 1, "source": "agent", "message": "copied", "is_copied_context": True},
                {"step_id": 2, "source": "user", "message": "summarize"},
                {"step_id": 3, "source": "agent", "message": "…", "metrics": {"completion_tokens": 7 + i}},
            ],
        }
        for i, ref in enumerate(refs)
    ]
    return "".join(json.dumps(d, indent=2) for d in (exit_doc, main, *subs))


def test_a_summarizations_three_calls_are_put_where_they_were_made():
    out = Terminus2Harness().parse_events(summarized((FIXTURES / "demo-events.json").read_text()))
    assert out.completion_tokens == [580, 7, 8, 9, 40, 40]
    assert reconcile(out, turns(580, 7, 8, 9, 40, 40), 0).verdict == "match"


def test_an_exception_in_its_loop_is_the_agents_crash_or_an_unreachable_endpoint():
    h = Terminus2Harness()
    crash = h.parse_events('{"swe_gym_exit": "exception", "error": "RuntimeError: Failed to start tmux session"}')
    assert crash.error_kind == "agent_crashed" and "tmux" in (crash.error or "")
    down = h.parse_events('{"swe_gym_exit": "exception", "error": "APIConnectionError: Connection refused"}')
    assert down.error_kind == "endpoint_unreachable"
    cut = h.parse_events((FIXTURES / "demo-events.json").read_text()[:-40])  # copied while it wrote: still read
    assert cut.error_kind is None


# -- configuration ----------------------------------------------------------------------------------------------------
def test_the_key_is_only_in_the_env_file_and_litellm_is_kept_offline():
    h = Terminus2Harness()
    files = h.config_files(CFG, "sgk-secret", "fix it")
    cmd = h.command(CFG)
    assert [p for p, (data, _) in files.items() if b"sgk-secret" in data] == ["/home/agent/.capture.env"]
    assert all(mode == 0o600 for _, mode in files.values()) and "sgk-secret" not in cmd and "fix it" not in cmd
    conf = json.loads(files["/home/agent/terminus-2-config.json"][0])
    assert conf["model"] == "openai/Qwen/Qwen3-8B" and conf["api_base"] == "http://127.0.0.1:9/capture/v1"
    assert conf["max_turns"] == 8 and conf["max_tokens"] == 512 and conf["parser"] == "json"  # budget + its reply
    assert conf["model_info"]["max_input_tokens"] == 32768 and conf["model_info"]["max_output_tokens"] == 512
    # the key: out of the environment before tmux starts (its pane inherits it), into litellm's memory, never into
    # llm_kwargs (harbor writes those into its trajectory)
    assert 'key = os.environ.pop("OPENAI_API_KEY", "")' in LAUNCHER and "litellm.api_key = key" in LAUNCHER
    assert "llm_kwargs=" not in LAUNCHER and LAUNCHER.index('os.environ.pop("OPENAI_API_KEY"') < LAUNCHER.index(
        "setup("
    )
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in cmd and "LITELLM_TELEMETRY=False" in cmd
    assert "unset OPENAI_BASE_URL OPENAI_API_BASE ANTHROPIC_API_KEY ANTHROPIC_BASE_URL" in cmd
    assert "TMUX_TMPDIR=/home/agent" in cmd
    # harbor's own tmux install (apt-get, a download of tmux's source) is replaced: the bundle's tmux or a failure
    assert "t2.TmuxSession._attempt_tmux_installation = tmux_or_fail" in LAUNCHER
    assert "record_terminal_session=False" in LAUNCHER  # no asciinema (harbor would install it with pip)
    xml = h.config_files(dataclasses.replace(CFG, options={"parser": "xml"}), "k", "t")
    assert json.loads(xml["/home/agent/terminus-2-config.json"][0])["parser"] == "xml"
    assert RolloutRequest(harness="terminus-2", harness_options={"parser": "xml"}).harness_options == {"parser": "xml"}
    for bad in ({"parser": "yaml"}, {"api": "openai-responses"}):  # its Responses mode needs server-side state
        with pytest.raises(ValueError):
            RolloutRequest(harness="terminus-2", harness_options=bad)
    anthropic = h.config_files(dataclasses.replace(CFG, options={"api": "anthropic"}), "k", "t")
    conf = json.loads(anthropic["/home/agent/terminus-2-config.json"][0])
    assert conf["model"] == "anthropic/Qwen/Qwen3-8B" and conf["api_base"] == "http://127.0.0.1:9/capture"
    assert conf["model_info"]["litellm_provider"] == "anthropic"


def test_it_needs_a_pty_of_its_own_making_and_states_its_minimum_context():
    assert Terminus2Harness.needs_pty and not Terminus2Harness.takes_given_ptys
    assert all(get_harness(n).takes_given_ptys for n in ("openhands", "pi"))  # OpenHands takes landlock's pairs
    assert Terminus2Harness.min_context_tokens == 16384  # its summarization fires below 8,000 free tokens


# -- its bundle and the oracle's replies, read by harbor itself --------------------------------------------------------
def bundle_python(h: Terminus2Harness, code: str) -> str:
    root = h.finished_install()
    argv = [*pyruntime.python_command(str(root), PY).split(), "-c", code]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_its_bundle_runs_tmux_and_harbor_parses_the_oracles_replies_in_both_formats():
    h = built()
    root = h.finished_install()
    assert (root / TMUX).is_file() and (root / "bin" / "tmux").read_text() == TMUX_WRAPPER
    version = subprocess.run([str(root / "bin" / "tmux"), "-V"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0 and version.stdout.startswith("tmux 3."), version.stderr
    short, long = bundled_tasks()[0], next(t for t in bundled_tasks() if len(t.patch) > KEYSTROKE_CHUNK)
    cases = [(fmt, task) for fmt in ("json", "xml") for task in (short, long)]
    replies = json.dumps(
        [[fmt, [r.content for r in OraclePolicy().keystrokes_plan(t, "/work/repo", fmt)]] for fmt, t in cases]
    )
    code = (  # one interpreter for all four (harbor's import is the slow part)
        "import json\n"
        "from harbor.agents.terminus_2.terminus_json_plain_parser import TerminusJSONPlainParser\n"
        "from harbor.agents.terminus_2.terminus_xml_plain_parser import TerminusXMLPlainParser\n"
        "parsers = {'json': TerminusJSONPlainParser(), 'xml': TerminusXMLPlainParser()}\n"
        f"for fmt, texts in json.loads({replies!r}):\n"
        "    rs = [parsers[fmt].parse_response(t) for t in texts]\n"
        "    print(json.dumps([[r.error, [c.keystrokes for c in r.commands], r.is_task_complete] for r in rs]))\n"
    )
    for (fmt, task), line in zip(cases, bundle_python(h, code).splitlines(), strict=True):
        parsed = json.loads(line)
        assert all(not p[0] for p in parsed), (fmt, parsed)
        typed = [k for p in parsed for k in p[1]]
        assert all(k.endswith("\n") for k in typed) and typed[-1].startswith("cd /work/repo && ")
        assert [p[2] for p in parsed] == [False] * len(typed) + [True]  # the fix, then done (sent again: confirmed)
        # a long patch goes in pieces, one reply each, none longer than a reply may be
        assert len(typed) == (1 if task is short else -(-len(base64.b64encode(task.patch.encode())) // 800) + 1)
        assert all(len(k) < KEYSTROKE_CHUNK + 100 for k in typed)


def test_a_reply_cut_at_max_tokens_is_noted_where_its_trajectory_lost_it():
    """harbor drops a reply cut at max_tokens from its trajectory and asks again; the launcher notes it (before the
    step of the answer asked for), recorded from a real run (the oracle's one-line patch cut at 1,024 tokens)."""
    out = Terminus2Harness().parse_events((FIXTURES / "truncated-events.json").read_text())
    assert out.model_calls == 3 and out.completion_tokens == [40, 40] and out.error_kind is None
    assert reconcile(out, turns(1024, 40, 40), 0).verdict == "match"
    assert "swe_gym_truncated_before_step" in LAUNCHER and "OutputLengthExceededError" in LAUNCHER
