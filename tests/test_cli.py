"""The CLI as a user runs it: info, rollout (no server), export, validate."""

import inspect
import json
import subprocess
import sys

import pytest

from swe_gym_env.commands import export as export_mod
from swe_gym_env.core import procs

from helpers import ME

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def engine():
    port = procs.free_port()
    p = procs.start([*ME, "engine", "--port", str(port)], f"http://127.0.0.1:{port}/health")
    yield f"http://127.0.0.1:{port}/v1"
    procs.stop(p)


def run(*args, env=None, timeout=600):
    import os

    return subprocess.run(
        [*ME, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@pytest.mark.usefixtures("need_tokenizer")
def test_info_certifies_the_builtin_engine_honestly(engine):
    out = run("info", "--llm-url", engine)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    cert = info["engine"]
    assert cert["reachable"] and cert["level"] == "tokens" and cert["logprobs_mode"] == "placeholder"
    assert info["datasets"]["bundled"]["tasks"] >= 5 and "pi" in info["agents"]


def test_info_reports_an_unreachable_engine():
    out = run("info", "--llm-url", "http://127.0.0.1:9/v1")
    assert json.loads(out.stdout)["engine"]["level"] == "unreachable"


@pytest.mark.usefixtures("need_pi")
def test_rollout_without_a_server_then_export(engine, tmp_path):
    env = {"SWE_GYM_DATA_DIR": str(tmp_path)}
    out = run("rollout", "-n", "3", "--engine-url", engine, "--concurrency", "3", env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["ok"] for r in results] == [True, True, True] and all(r["reward"] == 1.0 for r in results)
    assert len({r["instance_id"] for r in results}) == 3
    exported = tmp_path / "all.jsonl"
    out = run("export", "--out", str(exported), env=env)
    assert out.returncode == 0 and "exported 3 rollouts" in out.stdout
    rows = [json.loads(line) for line in exported.read_text().splitlines()]
    assert sorted(r["rollout_id"] for r in rows) == sorted(r["rollout_id"] for r in results)
    assert all(r["schema_version"] == 2 for r in rows)  # compact: each prompt once, in the turns that add to it
    assert all(t["prompt_len"] and t["prompt_new_ids"] is not None and t["logprobs"] for r in rows for t in r["turns"])


@pytest.mark.usefixtures("need_pi")
def test_rollout_tries_an_impossible_variant_from_the_shell(engine, tmp_path):
    out = run("rollout", "--variant", "impossible", "--engine-url", engine, env={"SWE_GYM_DATA_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    (result,) = [json.loads(line) for line in out.stdout.splitlines()]
    # the oracle applies the gold patch, which the impossible variant's tests contradict
    assert result["ok"] and result["variant"] == "impossible" and result["reward"] == 0.0, result


def test_rollout_takes_what_run_rollout_takes():
    from swe_gym_env.cli import build_parser, rollout_request
    from swe_gym_env.wire import RolloutRequest

    args = build_parser().parse_args(
        "rollout --variant impossible --tests-visible --harness pi --harness-option api=anthropic-messages "
        "--purpose train --mode black_box --engine big --temperature 0.5 --top-p 0.9 --top-k 5 --seed 7 "
        "--result-form full --max-model-calls 3 --max-tokens 64 --deadline 30 --instance-id x".split()
    )
    req = rollout_request(args)
    assert req == RolloutRequest(
        variant="impossible",
        tests_visible=True,
        harness="pi",
        harness_options={"api": "anthropic-messages"},
        purpose="train",
        mode="black_box",
        engine="big",
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        seed=7,
        result_form="full",
        max_model_calls=3,
        max_tokens=64,
        deadline_s=30.0,
        instance_id="x",
        sandbox=args.sandbox,
    )
    defaults = rollout_request(build_parser().parse_args(["rollout"]))
    assert defaults == RolloutRequest(sandbox=defaults.sandbox)  # the flags' defaults are run_rollout's
    # every run_rollout argument has a flag, but the idempotency key (-n rollouts share one request) and the
    # server-side engine URL of a request (rollout's --engine-url names this process's default engine instead)
    assert set(RolloutRequest.model_fields) - {"rollout_id", "index", "engine_url", "engine_model"} <= {
        *(f.replace("-", "_") for f in vars(args)),
        "deadline_s",
        "harness_options",
    }
    bad = run("rollout", "--harness-option", "nokey")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


def test_every_command_prints_its_help_and_exits_0(capsys):
    from swe_gym_env.cli import BENCHES, build_parser, main

    commands = [c for c in build_parser()._subparsers._group_actions[0].choices]  # type: ignore[union-attr]
    assert "parity" in commands and "rollout" in commands
    for argv in [[c] for c in commands] + [["bench", b] for b in BENCHES]:
        with pytest.raises(SystemExit) as exit:
            main([*argv, "--help"])
        out = capsys.readouterr()
        assert exit.value.code == 0 and "usage:" in out.out, (argv, out.err[-2000:])
    # parity's options live where torch is: its usage is printed here all the same (this venv has no trainer)
    out = run("parity", "--help", env={"SWE_GYM_TRAINER_PYTHON": "/nonexistent/python"})
    assert out.returncode == 0 and "--rollout" in out.stdout, out.stderr


@pytest.mark.usefixtures("need_sandbox")
def test_validate_passes_on_the_bundled_tasks():
    out = run("validate")
    assert out.returncode == 0, out.stdout + out.stderr
    assert " 0 surprises" in out.stdout and out.stdout.count(" ok ") >= 5


class FakeHfApi:
    """Stands in for the Hub (unreachable here); records what would be sent."""

    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def create_repo(self, **kw):
        self.calls.append(("create_repo", kw))

    def upload_file(self, **kw):
        self.calls.append(("upload_file", kw))
        return "commit-url"


def test_export_to_hub_sends_a_dataset_upload(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    f = tmp_path / "rows.jsonl"
    f.write_text("{}\n")
    export_mod.upload_to_hub(f, "me/rollouts")
    (_, create), (_, upload) = FakeHfApi.calls
    assert create == {"repo_id": "me/rollouts", "repo_type": "dataset", "exist_ok": True}
    assert upload["repo_type"] == "dataset" and upload["path_in_repo"] == "data/rows.jsonl"
    # Contract with the real client: every keyword we send exists on huggingface_hub.HfApi.
    from huggingface_hub.hf_api import HfApi

    for method, kw in FakeHfApi.calls:
        params = inspect.signature(getattr(HfApi, method)).parameters
        assert set(kw) <= set(params), (method, set(kw) - set(params))


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "swe_gym_env.cli", "--help"], capture_output=True, text=True)
    for cmd in ("setup", "engine", "serve", "demo", "rollout", "export", "info", "validate"):
        assert cmd in out.stdout
