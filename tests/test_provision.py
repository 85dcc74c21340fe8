"""What `swe-gym-env setup` prepares, and harnesses / the pypi split installed on a rollout's first use
(server/agents/provision.py): refused at `validate`, naming the command, where this server cannot install; installed
with progress lines where it can (a real Pi from npm, in a demo against an empty cache)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import require
from test_agent_bundles import ToyHarness as BundleToyHarness

from swe_gym_env.cli import SetupPlan, setup_plan
from swe_gym_env.core.assets import task_runtime_dir, tokenizer_dir
from swe_gym_env.core.names import DEFAULT_HARNESS, HARNESSES
from swe_gym_env.server.agents import provision
from swe_gym_env.server.agents.bundle import find_bundle
from swe_gym_env.server.agents.harnesses.pi import PiHarness
from swe_gym_env.server.capture import EngineTarget
from swe_gym_env.server.rollout import ServerConfig
from swe_gym_env.wire import RolloutRequest

from helpers import ME, MODEL


# -- what setup prepares ----------------------------------------------------------------------------------------
def test_setup_prepares_only_the_demos_agent_unless_asked():
    assert DEFAULT_HARNESS == "pi" and setup_plan() == SetupPlan(("pi",), pypi=False)
    assert setup_plan(["codex"]) == SetupPlan(("codex",))
    assert setup_plan(["codex", "pi", "codex"]) == SetupPlan(("codex", "pi"))
    assert setup_plan(["all"]) == SetupPlan(tuple(HARNESSES))
    assert setup_plan(everything=True) == SetupPlan(tuple(HARNESSES), pypi=True)
    assert setup_plan(["pi"], everything=True) == SetupPlan(tuple(HARNESSES), pypi=True)


def test_setup_options_parse_to_the_plan(monkeypatch):
    from swe_gym_env import cli

    seen = []
    monkeypatch.setattr(cli, "cmd_setup", lambda args: seen.append(setup_plan(args.harness, args.all)) or 0)
    for argv in (["setup"], ["setup", "--all"], ["setup", "--harness", "opencode", "--harness", "codex"]):
        assert cli.main(argv) == 0
    assert seen == [SetupPlan(("pi",)), SetupPlan(tuple(HARNESSES), True), SetupPlan(("opencode", "codex"))]
    with pytest.raises(SystemExit):
        cli.main(["setup", "--harness", "no-such-agent"])


# -- whether this server may install on first use -------------------------------------------------------------
def test_install_refusals_name_the_reason(monkeypatch, tmp_path):
    monkeypatch.delenv("npm_config_offline", raising=False)
    monkeypatch.delenv("NPM_CONFIG_OFFLINE", raising=False)
    assert "SWE_GYM_INSTALL_ON_USE=0" in (provision.install_refusal(False) or "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm here
    assert "no npm" in (provision.install_refusal(True) or "")
    if (npm := shutil.which("npm", path=os.defpath + ":/usr/local/bin")) is not None:
        monkeypatch.setenv("PATH", str(Path(npm).parent))
        assert provision.install_refusal(True) is None
        monkeypatch.setenv("npm_config_offline", "true")
        assert "offline" in (provision.install_refusal(True) or "")
    for off in ("0", "false", "no", "OFF"):
        monkeypatch.setenv(provision.INSTALL_ON_USE_ENV, off)
        assert provision.install_on_use_from_env() is False
    monkeypatch.setenv(provision.INSTALL_ON_USE_ENV, "1")
    assert provision.install_on_use_from_env() is True and ServerConfig.from_env().install_on_use is True


class ToyHarness(BundleToyHarness):
    """test_agent_bundles' toy harness whose "npm install" takes a moment and is counted: install on first use
    without the network."""

    def __init__(self, src: Path) -> None:
        super().__init__(src)
        self.installs = 0

    def ensure_installed(self, log=print) -> Path:
        self.installs += 1
        threading.Event().wait(0.2)  # long enough for a second caller to arrive while this one installs
        return self.src

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {"bin/run": self.src / "run"}


def test_first_use_installs_once_for_concurrent_callers_with_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "run").write_text("#!/bin/sh\necho toy\n")
    toy = ToyHarness(tmp_path / "src")
    assert not provision.installed(toy)  # type: ignore[arg-type]
    lines: list[str] = []
    got = []
    threads = [
        threading.Thread(target=lambda: got.append(provision.install(toy, lines.append)))  # type: ignore[arg-type]
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert toy.installs == 1 and len({b.path for b in got}) == 1 and provision.installed(toy)  # type: ignore[arg-type]
    assert "installing it now, on first use" in lines[0] and "swe-gym-env setup --harness toy" in lines[0]
    pcts = [int(line.split(": ", 1)[1].split("%")[0]) for line in lines if line.startswith("toy 1.0: ")]
    assert pcts[0] == 0 and pcts[-1] == 100 and pcts == sorted(pcts), lines
    assert "agent bundle toy-1.0-" in lines[-1]


@pytest.mark.anyio
async def test_a_first_use_install_does_not_count_against_the_rollouts_deadline():
    import asyncio
    import time

    from swe_gym_env.server.rollout.record import RunState

    state = RunState(deadline=time.monotonic() + 0.3)
    before = state.deadline
    async with asyncio.timeout(0.3) as state.timeout:
        with state.deadline_paused():  # an install longer than the whole deadline
            await asyncio.sleep(0.5)
        assert state.deadline - before >= 0.5
        await asyncio.sleep(0.1)  # the rollout's own time is still there after it
    with pytest.raises(TimeoutError):  # ...and still ends it
        async with asyncio.timeout(0.3) as state.timeout:
            with state.deadline_paused():
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.5)


# -- a rollout for a harness this server lacks ----------------------------------------------------------------
def empty_home(tmp_path: Path, monkeypatch) -> ServerConfig:
    """A server whose cache holds no agent bundle and no pypi split; its engine is never reached."""
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SWE_GYM_DATASETS", raising=False)
    return ServerConfig(
        engines={"default": EngineTarget("http://127.0.0.1:9/v1", MODEL)},
        results_dir=tmp_path / "results",
        install_on_use=False,
    )


@pytest.mark.anyio
@pytest.mark.parametrize("harness", ["codex", "pi"])
async def test_a_missing_harness_the_server_may_not_install_fails_at_validate_naming_the_command(
    harness, tmp_path, monkeypatch
):
    from swe_gym_env.commands.runner import local_service

    config = empty_home(tmp_path, monkeypatch)
    async with local_service(config) as service:
        result = await service.run(RolloutRequest(harness=harness, sandbox="local"))
    assert not result.ok and result.phase == "validate" and result.reward is None, result.error
    assert f"`swe-gym-env setup --harness {harness}`" in (result.error or "")
    assert "`swe-gym-env setup --all`" in (result.error or "") and "SWE_GYM_INSTALL_ON_USE=0" in (result.error or "")


@pytest.mark.anyio
async def test_without_npm_a_missing_harness_fails_at_validate_too(tmp_path, monkeypatch):
    from swe_gym_env.commands.runner import local_service

    config = empty_home(tmp_path, monkeypatch)
    config.install_on_use = True
    monkeypatch.setenv("PATH", f"{tmp_path}/no-npm-here")
    async with local_service(config) as service:
        result = await service.run(RolloutRequest(harness="gemini-cli", sandbox="local"))
    assert not result.ok and result.phase == "validate", result.error
    assert "no npm" in (result.error or "") and "`swe-gym-env setup --harness gemini-cli`" in (result.error or "")


def link_pi(home: Path, real) -> None:
    """Pi installed in ``home``: its bundle (a link to the one built here) and its pointer."""
    (home / "bundles").mkdir(parents=True)
    os.symlink(real.path, home / "bundles" / real.path.name)
    shutil.copy(real.path.parent / f"pi-{PiHarness.version}.json", home / "bundles")


@pytest.mark.anyio
async def test_an_unbuilt_pypi_split_the_server_may_not_build_fails_at_validate(tmp_path, monkeypatch):
    from swe_gym_env.commands.runner import local_service

    real = find_bundle(PiHarness())
    require(real is not None, "Pi's bundle is not built: run `swe-gym-env setup`")
    config = empty_home(tmp_path, monkeypatch)
    link_pi(tmp_path / "home", real)  # Pi is installed here, the split is not
    async with local_service(config) as service:
        result = await service.run(RolloutRequest(harness="pi", sandbox="local", split="pypi"))
    assert not result.ok and result.phase == "validate", result.error
    assert "split 'pypi' is not built" in (result.error or "") and "`swe-gym-env setup --all`" in (result.error or "")


@pytest.mark.anyio
@pytest.mark.usefixtures("need_tokenizer")
async def test_an_unbuilt_task_env_the_server_may_not_build_fails_at_validate(tmp_path, monkeypatch):
    from swe_gym_env.commands.runner import local_service
    from swe_gym_env.tasks.pypi_fixes.build import out_dir

    from helpers import Served, engine_app

    real, split = find_bundle(PiHarness()), out_dir()
    require(real is not None, "Pi's bundle is not built: run `swe-gym-env setup`")
    require((split / "tasks.jsonl").is_file(), "the pypi split is not built: run `swe-gym-env setup --all`")
    engine = engine_app()  # the built-in engine (its tokenizer from this machine's cache), reachable
    config = empty_home(tmp_path, monkeypatch)
    link_pi(tmp_path / "home", real)
    shutil.copytree(split, tmp_path / "home" / "tasks" / "pypi")  # the split is built here, its task venvs are not
    with Served(engine) as url:
        config.engines = {"default": EngineTarget(f"{url}/v1", MODEL)}
        async with local_service(config) as service:
            result = await service.run(RolloutRequest(harness="pi", sandbox="local", split="pypi", index=0))
    assert not result.ok and result.phase == "validate", result.error
    assert "the environment of task" in (result.error or "") and "is not built on this server" in (result.error or "")
    assert "`swe-gym-env setup --all`" in (result.error or "")


def test_the_pypi_split_is_built_on_first_use_with_progress(tmp_path, monkeypatch):
    """What a rollout naming `pypi` runs on a server whose setup left it out (the sdists already downloaded here are
    reused; without them they come from PyPI)."""
    from swe_gym_env.tasks import catalog
    from swe_gym_env.tasks.pypi_fixes.build import sdist_dir, task_names

    sdists = sdist_dir()
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SWE_GYM_DATASETS", raising=False)
    (tmp_path / "home").mkdir()
    if sdists.is_dir():
        os.symlink(sdists, tmp_path / "home" / "sdists")
    assert catalog.unbuilt("pypi") and not catalog.unbuilt("bundled") and "pypi" not in catalog.split_names()
    lines: list[str] = []
    try:
        catalog.build_split("pypi", lines.append)
    except catalog.TaskNotFound as e:
        require(False, f"the pypi split cannot be built here (sdists from PyPI): {e}")
    assert not catalog.unbuilt("pypi") and "pypi" in catalog.split_names()
    assert len(catalog.tasks_in("pypi")) == len(task_names())
    assert "building it now, on first use" in lines[0] and lines[-1] == "pypi split: 100% built"
    assert [line for line in lines if line.startswith("pypi split:   0% ")]


# -- installed on first use, for real ---------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_on_a_cache_without_pi_installs_it_on_first_use_and_is_rewarded(tmp_path, monkeypatch, need_sandbox):
    """`swe-gym-env demo` against a cache holding only the tokenizer and the task runtime: the server installs Pi
    from npm during the rollout, says so with percentages, and the rollout is ok with reward 1.0."""
    require(shutil.which("npm") is not None, "npm missing")
    require((tokenizer_dir() / "tokenizer.json").is_file(), "tokenizer not prepared: run `swe-gym-env setup`")
    home = tmp_path / "home"
    (home / "runtime").mkdir(parents=True)
    os.symlink(tokenizer_dir().parent, home / "models")
    os.symlink(task_runtime_dir(), home / "runtime" / task_runtime_dir().name)
    env = {**os.environ, "SWE_GYM_ENV_HOME": str(home), "SWE_GYM_INSTALL_ON_USE": "1", "SWE_GYM_UI": "0"}
    run = subprocess.run([*ME, "demo", "--json"], capture_output=True, text=True, timeout=900, env=env)
    assert run.stdout.strip(), run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"] and result["reward"] == 1.0, (result["error"], run.stderr[-3000:])
    assert result["timings"]["install.harness"] > 0
    log = run.stderr
    assert "pi 0.73.1 is not installed on this server: installing it now, on first use" in log
    assert f"pi {PiHarness.version}:   0% npm install" in log and f"pi {PiHarness.version}: 100% agent bundle" in log
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(home))
    assert find_bundle(PiHarness()) is not None  # the demo's cache now holds Pi's bundle, for the next rollout


@pytest.mark.anyio
async def test_a_python_harness_the_server_cannot_build_fails_at_validate_for_its_own_reason(tmp_path, monkeypatch):
    """mini-swe-agent is built with a Python, ldd and pip, not npm: a server whose source Python does not run says
    so at validate (before: it passed validate on npm alone and failed later, in the install)."""
    from swe_gym_env.commands.runner import local_service

    config = empty_home(tmp_path, monkeypatch)
    config.install_on_use = True
    monkeypatch.setenv("SWE_GYM_AGENT_PYTHON", str(tmp_path / "no-python-here"))
    async with local_service(config) as service:
        result = await service.run(RolloutRequest(harness="mini-swe-agent", sandbox="local"))
    assert not result.ok and result.phase == "validate", result.error
    assert "does not run here" in (result.error or "") and "no npm" not in (result.error or "")
    assert "`swe-gym-env setup --harness mini-swe-agent`" in (result.error or "")
