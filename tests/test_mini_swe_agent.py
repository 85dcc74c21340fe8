"""mini-swe-agent end to end, on its bundle's own Python (server/agents/pyruntime.py): the relocatable runtime in
images without it (and without any C library at all), `demo --harness mini-swe-agent` on `local` and `landlock`,
a rollout on `docker` in a pypi stand-in image, and — from inside the sandbox — that the agent's Python opened no
socket but the capture proxy's and resolved no name (litellm's cost map, telemetry: all off)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import docker_has, docker_ready, require

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import AgentConfig, AgentError
from swe_gym_env.server.agents.bundle import _copy_in
from swe_gym_env.server.agents.harnesses.mini_swe_agent import NET, PRUNED, MiniSweAgentHarness, without
from swe_gym_env.server.engine.policy import SUBMIT_COMMAND, OraclePolicy
from swe_gym_env.tasks.catalog import bundled_tasks

from helpers import Stack, audit_lines, full_turns, rows_match_export

TASK = "uiri__toml-0.10.2"  # as tests/test_task_images.py: one file, one hunk
# the agent's own shell reads its network log ($HOME: landlock maps /home/agent only at the sandbox's API)
PROBE = f"oracle+probe:cat $HOME/{NET.rsplit('/', 1)[1]}; echo net-log-end"


@pytest.fixture(scope="module")
def bundle():
    h = MiniSweAgentHarness()
    try:
        (path,) = h.mounts()
    except AgentError as e:
        require(False, f"mini-swe-agent: {e}")
    return path


def run_python(image: str, bundle: str, code: str, *extra: str) -> subprocess.CompletedProcess:
    argv = ["docker", "run", "--rm", "--network", "none", "-v", f"{bundle}:/opt/swe-gym-agent:ro", *extra, image]
    argv += [*pyruntime.python_command("/opt/swe-gym-agent").split(), "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.integration
@pytest.mark.slow
def test_the_runtime_runs_isolated_in_an_image_with_no_c_library(bundle, tmp_path):
    """Nothing of the image is used: an image with no /lib, no /usr, no shell runs the runtime and its wheels."""
    require(docker_ready(), "no docker daemon: run `bash scripts/setup_docker.sh`")
    (tmp_path / "root" / "tmp").mkdir(parents=True)
    tar = tmp_path / "empty.tar"
    subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tar), "."], check=True)
    image = "swe-gym-env-test/no-libc:mini"
    subprocess.run(["docker", "import", str(tar), image], check=True, capture_output=True, timeout=120)
    try:
        code = (
            "import os, sys, ssl, sqlite3, ctypes, pydantic_core, tiktoken, tokenizers, yaml; "
            "print(os.path.exists('/lib'), os.path.exists('/usr'), sys.flags.isolated, sys.path)"
        )
        r = run_python(image, bundle, code, "-e", "PYTHONPATH=/task/evil", "-e", "PYTHONHOME=/nowhere")
        assert r.returncode == 0, r.stderr[-2000:]
        lib, usr, isolated, path = r.stdout.split(" ", 3)
        assert (lib, usr, isolated) == ("False", "False", "1")
        assert ast.literal_eval(path) == [
            "/opt/swe-gym-agent/python/lib/python3.11",
            "/opt/swe-gym-agent/python/lib/python3.11/lib-dynload",
            "/opt/swe-gym-agent/site",
        ]
    finally:
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True, timeout=120)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["local", "landlock"])
def test_demo_solves_the_task_and_matches_the_trajectory(bundle, sandbox, need_sandbox, need_tokenizer):
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--sandbox", sandbox, "--harness", "mini-swe-agent"]
    run = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"], (result.get("error"), run.stderr[-2000:])
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    assert len(result["turns"]) == 2 and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {"openai-chat"}
    assert result["turns"][0]["prompt_len"] < MiniSweAgentHarness.min_context_tokens


@pytest.fixture(scope="module")
def probe_stack():
    s = Stack(PROBE)
    yield s
    s.stop()


def net_log(result) -> list[list[str]]:
    """The agent's own record of its sockets, as the probe's output reached the next prompt."""
    seen = [t for t in full_turns(result)[1:] if "net-log-end" in str(t.request.get("messages"))]
    assert seen, "the probe's output never reached the model"
    text = json.loads(seen[0].request["messages"][-1]["content"])["output"]
    return audit_lines(text)


def say_times(sandbox: str, result) -> None:
    """Boot and boot -> first model call, as `-s` shows them (the figures in the notes)."""
    t = result.timings
    print(f"mini-swe-agent on {sandbox}: boot {t['boot']:.2f}s, first call {t['first_call']:.2f}s after its start")


def assert_only_the_capture(events: list[list[str]]) -> None:
    """One endpoint, the capture proxy's, as a numeric loopback address (so no name was looked up): no cost-map
    fetch, no telemetry, nothing else."""
    assert events and any(e[0] == "socket.connect" for e in events), f"no connection logged: {events}"
    where = {ast.literal_eval(e[1])[:2] for e in events}
    assert len(where) == 1 and next(iter(where))[0] == "127.0.0.1", events


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("sandbox", ["local", "landlock"])
async def test_litellm_calls_nothing_but_the_capture_from_inside_the_sandbox(bundle, probe_stack, sandbox):
    async with SweGymClient(probe_stack.mcp_url) as c:
        result = await c.run_rollout(harness="mini-swe-agent", sandbox=sandbox, deadline_s=240)
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
            harness="mini-swe-agent", sandbox="docker", split="pypi", instance_id=TASK, deadline_s=500
        )
    assert result.ok, (result.phase, result.error, result.agent_log_tail[-2000:])
    assert result.reward == 1.0 and result.grading is not None and result.cross_check == "match"
    assert result.grading.graded_by == "install_config"
    assert_only_the_capture(net_log(result))
    say_times("docker", result)
    await rows_match_export(probe_stack, result)


# -- units: its config, its trajectory, the oracle's submission ------------------------------------------------------
CFG = AgentConfig(base_url="http://127.0.0.1:9/capture", model="Qwen/Qwen3-8B", context_window=8192, max_tokens=512)


def test_config_points_at_the_capture_with_the_budget_as_step_limit_and_no_key_in_it():
    h = MiniSweAgentHarness()
    cfg = AgentConfig(**{**CFG.__dict__, "max_calls": 7})
    files = h.config_files(cfg, "sgk-secret", "fix it")
    conf = json.loads(files["/home/agent/mini-config.yaml"][0])
    assert conf["model"]["model_name"] == "openai/Qwen/Qwen3-8B"
    assert conf["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:9/capture/v1"
    assert conf["agent"]["step_limit"] == 8 and conf["agent"]["cost_limit"] == 0  # the budget + its budget reply
    assert conf["run"]["task"] == "fix it" and conf["environment"]["env"] == {"OPENAI_API_KEY": ""}
    assert all(mode == 0o600 for _, mode in files.values())
    assert [p for p, (data, _) in files.items() if b"sgk-secret" in data] == ["/home/agent/.capture.env"]
    cmd = h.command(cfg)
    assert "sgk-secret" not in cmd and "fix it" not in cmd
    assert cmd.splitlines()[-1].startswith("/opt/swe-gym-agent/python/lib/ld-linux-x86-64.so.2 --library-path ")
    assert " -I -X utf8 " in cmd and "LITELLM_LOCAL_MODEL_COST_MAP=True" in cmd


def traj(*messages: dict) -> str:
    return json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, *messages]})


def reply(call_id: str | None, tokens: int) -> dict:
    calls = [{"id": call_id, "type": "function"}] if call_id else None
    return {
        "choices": [{"message": {"role": "assistant", "tool_calls": calls}}],
        "usage": {"completion_tokens": tokens},
    }


def test_the_trajectory_gives_one_step_per_model_call():
    h = MiniSweAgentHarness()
    text = traj(
        {"role": "assistant", "extra": {"response": reply("call_1", 12)}},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1"},
        {
            "role": "user",
            "content": "no tool call",
            "extra": {"interrupt_type": "FormatError", "response": reply(None, 3)},
        },
        {"role": "assistant", "extra": {"response": reply("call_2", 5)}},
        {"role": "exit", "content": "", "extra": {"exit_status": "Submitted", "submission": ""}},
    )
    out = h.parse_events(text)
    assert out.model_calls == 3 and out.error_kind is None
    assert [(s.completion_tokens, s.tool_call_ids) for s in out.steps] == [(12, ("call_1",)), (3, ()), (5, ("call_2",))]
    assert h.parse_events(text[: len(text) // 2]).model_calls == 0  # caught mid-write: nothing yet


def test_an_exception_exit_is_an_error_unreachable_before_any_call():
    h = MiniSweAgentHarness()
    down = {"exit_status": "InternalServerError", "exception_str": "litellm.InternalServerError: Connection error."}
    out = h.parse_events(traj({"role": "exit", "content": "", "extra": down}))
    assert out.error_kind == "endpoint_unreachable" and "Connection error" in (out.error or "")
    out = h.parse_events(
        traj({"role": "assistant", "extra": {"response": reply("c", 1)}}, {"role": "exit", "extra": down})
    )
    assert out.error_kind == "agent_crashed" and out.model_calls == 1
    limits = {"exit_status": "LimitsExceeded", "submission": ""}
    assert h.parse_events(traj({"role": "exit", "content": "LimitsExceeded", "extra": limits})).error_kind is None


def test_the_oracle_ends_with_the_submission_command_where_the_prompt_names_it():
    task = bundled_tasks()[0]
    bash = [{"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {}}}}}]
    plan = OraclePolicy().plan(task, bash, submit=True)
    assert plan[-1].tool_calls == [("bash", {"command": SUBMIT_COMMAND})] and plan[-1].content is None
    assert "git apply" in plan[0].tool_calls[0][1]["command"]
    assert OraclePolicy().plan(task, bash)[-1].tool_calls == []  # the others: "done" as text


def test_the_bundle_leaves_out_only_what_is_pruned(tmp_path):
    """`without` lists a tree less its pruned paths: copied, it is the whole tree's copy less those paths (links to
    directories, `.bin`, source maps and dangling links left out at every level, as a whole copy leaves them)."""
    site = tmp_path / "site"
    files = [
        "six.py",
        "litellm/__init__.py",
        "litellm/llms/openai.py",
        "litellm/proxy/_types.py",
        "litellm/proxy/app.js.map",
        "litellm/proxy/.bin/tool",
        "litellm/proxy/_experimental/post_call_rules.py",
        "litellm/proxy/_experimental/out/index.html",
        "litellm/proxy/_experimental/out/_next/app.js",
    ]
    for rel in files:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(rel)
    (site / "litellm/proxy/linked").symlink_to(site / "litellm/llms")
    (site / "litellm/proxy/dangling.py").symlink_to(tmp_path / "nowhere")
    contents = without(site, "site", PRUNED)
    assert "site/six.py" in contents and contents["site/litellm/llms"] == site / "litellm/llms"  # the rest: whole
    pruned, whole = tmp_path / "pruned", tmp_path / "whole"
    for rel, src in contents.items():
        _copy_in(src, pruned / rel)
    _copy_in(site, whole / "site")

    def tree(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    assert tree(pruned) == {f for f in tree(whole) if not f.startswith("site/litellm/proxy/_experimental/out/")}
    assert "site/litellm/proxy/_experimental/post_call_rules.py" in tree(pruned)
    assert without(site, "site", ()) == {"site": site}


def test_pruning_rebuilds_the_bundle_not_the_install():
    h = MiniSweAgentHarness
    assert h.bundle_inputs == (*h.install_inputs, "prune litellm/proxy/_experimental/out")
    assert not any(i.startswith("prune ") for i in h.install_inputs)


@pytest.mark.integration
def test_the_built_bundle_keeps_litellms_proxy_modules_and_drops_its_admin_ui(bundle):
    """mini-swe-agent loads a dozen `litellm.proxy` modules (an import audit of a whole run): the package stays; its
    admin UI (a static web build only litellm's proxy server serves) does not."""
    site = Path(bundle) / "site" / "litellm" / "proxy"
    for module in ("_types.py", "common_utils/timezone_utils.py", "spend_tracking/savings.py", "types_utils/utils.py"):
        assert (site / module).is_file(), module
    assert (site / "_experimental" / "post_call_rules.py").is_file()  # beside the admin UI: kept
    assert not (site / "_experimental" / "out").exists()
