"""The `pypi` split: real bug fixes of small PyPI packages, built reproducibly from sha256-pinned sdists.

`validate` scores every gold patch 1.0 and every empty patch 0.0 on `local` (each task in its own venv, built from
its install_config) and in the tasks' stand-in SWE-Gym images on `docker` (the image's conda `testbed` env), and the
JUnit cross-check agrees with swebench's parser on every FAIL_TO_PASS / PASS_TO_PASS test. The stand-in images have
what the issue asks of them: conda activation, the repo at /testbed at base_commit, git, no Node, no system pytest.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import once_per_run, require

from swe_gym_env.core.procs import file_lock
from swe_gym_env.server.grading import grade
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.models import Task, patch_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CLI = str(Path(sys.executable).parent / "swe-gym-env")
SPECIAL = {"pytest-plugin-addopts", "parametrised-ids", "src-layout", "import-error-before-fix", "gold-edits-pyproject"}


@pytest.fixture(scope="session")
def pypi_split(tmp_path_factory) -> tuple[Task, ...]:
    """The split as `swe-gym-env setup --all` leaves it: built, with every task's local venv (built here if missing);
    once per test run, and under a lock in the cache dir (its files are shared by every run on the machine)."""
    from swe_gym_env.tasks.catalog import pypi_tasks

    once_per_run(tmp_path_factory, "pypi-split", _build_pypi_split)
    return pypi_tasks()


def _build_pypi_split() -> None:
    from swe_gym_env.core.assets import task_runtime_dir
    from swe_gym_env.tasks.catalog import pypi_tasks
    from swe_gym_env.tasks.envs import EnvError, build_env, env_ready
    from swe_gym_env.tasks.pypi_fixes import build

    require(shutil.which("bwrap") is not None, "bubblewrap missing: apt-get install bubblewrap")
    require((task_runtime_dir() / ".ready").is_file(), "task runtime not prepared: run `swe-gym-env setup`")
    with file_lock(build.out_dir().parent / ".pypi-split-tests.lock"):
        try:
            build.build(build.out_dir(), build.task_names(), log=lambda _: None)
        except build.DataError as e:
            require(False, f"the pypi split cannot be built (sdists from PyPI): {e}")
        for t in pypi_tasks():
            if not env_ready(t):
                try:
                    build_env(t)
                except EnvError as e:
                    require(False, f"task venv cannot be built (network to PyPI?): {e}")


@pytest.fixture(scope="session")
def pypi_images(pypi_split, need_docker, tmp_path_factory) -> tuple[Task, ...]:
    """The stand-in images (scripts/build_standin_images.sh; built here when missing, skipped when present), once
    per test run."""
    once_per_run(tmp_path_factory, "pypi-images", lambda: _build_pypi_images(pypi_split))
    return pypi_split


def _build_pypi_images(tasks: tuple[Task, ...]) -> None:
    from swe_gym_env.tasks.pypi_fixes import standin

    ok = subprocess.run(["docker", "image", "inspect", standin.BASE_IMAGE], capture_output=True).returncode == 0
    require(ok, f"docker base image {standin.BASE_IMAGE} missing: run scripts/setup_docker.sh")
    with file_lock(standin_lock()):
        standin.build_all(list(tasks), log=lambda _: None)


def standin_lock() -> Path:
    from swe_gym_env.core.assets import cache_dir

    return cache_dir() / "locks" / "standin-images.lock"


def test_the_split_is_reproducible_and_covers_the_special_cases(tmp_path, pypi_split):
    from swe_gym_env.tasks.pypi_fixes import build

    a = build.build(tmp_path / "a", build.task_names(), log=lambda _: None)
    b = build.build(tmp_path / "b", build.task_names(), log=lambda _: None)
    assert (tmp_path / "a" / "tasks.jsonl").read_text() == (tmp_path / "b" / "tasks.jsonl").read_text()
    assert (tmp_path / "a" / "tasks.jsonl").read_text() == (build.out_dir() / "tasks.jsonl").read_text()
    assert len(a) == len(b) >= 9 and len({r["repo"] for r in a}) == len(a)
    assert SPECIAL <= {s for r in a for s in r["meta"]["special"]}
    for row in a:
        meta = row["meta"]
        assert re.fullmatch(r"[0-9a-f]{64}", meta["old"]["sha256"]) and re.fullmatch(
            r"[0-9a-f]{64}", meta["new"]["sha256"]
        )
        assert meta["old"]["version"] != meta["new"]["version"] and row["FAIL_TO_PASS"]
        cfg = row["install_config"]
        assert any(p.startswith("pytest==") for p in cfg["pip_packages"]) and cfg["install"] and cfg["python"]
        assert row["docker_image"].startswith("swe-gym-env-standin/sweb.eval.x86_64.")
        assert not meta["test_written_by_us"] or "written by us" in meta["notes"]
    semver = next(r for r in a if r["meta"]["package"] == "semver")
    assert any(p.startswith("pytest-cov==") for p in semver["install_config"]["pip_packages"])
    assert any("[" in t for r in a for t in r["FAIL_TO_PASS"])  # parametrised ids
    cachetools = next(r for r in a if "import-error-before-fix" in r["meta"]["special"])
    assert cachetools["PASS_TO_PASS"] == [] and len(cachetools["FAIL_TO_PASS"]) > 1
    # a gold patch that edits pyproject.toml, none of it pytest's settings (the grader pins those, keeps the rest)
    edits = next(r for r in a if "gold-edits-pyproject" in r["meta"]["special"])
    assert "pyproject.toml" in patch_files(edits["patch"]) and "tool.pytest" not in edits["patch"]
    tasks = {t.instance_id: t for t in pypi_split}
    assert all(tasks[r["instance_id"]].image == r["docker_image"] for r in a)  # the loader names the image


def test_validate_on_local_scores_gold_1_and_empty_0_on_every_task(pypi_split):
    r = subprocess.run([CLI, "validate", "--dataset", "pypi", "--sandbox", "local"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(pypi_split)} ok, 0 surprises, 0 rows skipped" in r.stdout


def check(task: Task, gold, empty, environment: str) -> None:
    assert gold.reward == 1.0, (task.instance_id, gold.report.fail_to_pass, gold.report.pass_to_pass["failure"])
    assert empty.reward == 0.0, task.instance_id
    assert empty.report.fail_to_pass["failure"] == task.FAIL_TO_PASS, task.instance_id
    assert empty.report.pass_to_pass["failure"] == [], task.instance_id
    for g in (gold, empty):
        r = g.report
        assert (r.graded_by, r.parser, r.junit_cross_check) == ("install_config", task.log_parser, "match"), r
        assert r.environment.startswith(environment), r.environment
        assert not [f for f in g.findings if "JUnit" in str(f)], g.findings


async def grade_all(tasks, backend: str, spec_of, environment: str, parallel: int = 2) -> None:
    gate = asyncio.Semaphore(parallel)

    async def one(t: Task) -> None:
        async with gate:
            make = lambda: create_sandbox(backend, spec_of(t))  # noqa: E731
            check(t, await grade(t, t.patch, make), await grade(t, "", make), environment)

    await asyncio.gather(*(one(t) for t in tasks))


@pytest.mark.anyio
async def test_local_grading_runs_each_task_in_its_own_venv_and_junit_agrees(pypi_split):
    def spec_of(t: Task) -> SandboxSpec:
        return SandboxSpec(repo_source=t.repo_source or "", base_commit=t.base_commit, workdir=t.workdir)

    await grade_all(pypi_split, "local", spec_of, "local venv /opt/swe-gym/runtime/envs/")
    assert len({t.env_activation for t in pypi_split}) == len(pypi_split)  # one env per requirement set


@pytest.mark.anyio
async def test_docker_grading_in_the_stand_in_images(pypi_images):
    """The image holds the repo at /testbed and the env: nothing of the host's is mounted for the task."""

    def spec_of(t: Task) -> SandboxSpec:
        return SandboxSpec(base_commit=t.base_commit, workdir=t.workdir, image=t.image)

    await grade_all(pypi_images, "docker", spec_of, "the image's conda env testbed")


def test_validate_on_docker(pypi_images):
    """`validate --dataset pypi --sandbox docker`: each task in its own stand-in image, the repo the image holds."""
    cmd = [CLI, "validate", "--dataset", "pypi", "--sandbox", "docker", "--limit", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0 and "2 ok, 0 surprises" in r.stdout, r.stdout + r.stderr


def test_stand_in_images_look_like_swe_gym_images(pypi_images):
    from swe_gym_env.tasks.pypi_fixes.standin import STANDIN_BASE

    no_node = "find / -xdev \\( -name node -o -name nodejs \\) -type f | grep . && exit 11; exit 0"
    r = subprocess.run(["docker", "run", "--rm", "--network", "none", STANDIN_BASE, "bash", "-c", no_node])
    assert r.returncode == 0, "the shared stand-in layer holds a node binary"
    probe = (
        "set -e; command -v node && exit 10;"
        " /usr/bin/python3 -c 'import pytest' 2>/dev/null && exit 12;"
        " source /opt/miniconda3/bin/activate && conda activate testbed;"
        ' echo "$CONDA_DEFAULT_ENV $(command -v python) $(command -v pytest)";'
        " cd /testbed && git rev-parse HEAD && git status --porcelain | wc -l && git remote | wc -l && git --version"
    )
    for t in pypi_images:
        r = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", t.image or "", "bash", "-c", probe],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (t.image, r.returncode, r.stdout, r.stderr)
        env, head, dirty, remotes, gitv = r.stdout.strip().splitlines()
        assert env == "testbed /opt/miniconda3/envs/testbed/bin/python /opt/miniconda3/envs/testbed/bin/pytest"
        assert head == t.base_commit and dirty == "0" and remotes == "0" and gitv.startswith("git version")
    from swe_gym_env.tasks.envs import envs_status, images_status

    assert images_status(pypi_images) == (len(pypi_images), len(pypi_images), [])  # what `info` reports
    assert envs_status(pypi_images) == (len(pypi_images), len(pypi_images))
    labels = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", pypi_images[0].image or ""],
        capture_output=True,
        text=True,
    ).stdout
    assert json.loads(labels)["swe-gym-env.standin.instance"] == pypi_images[0].instance_id
