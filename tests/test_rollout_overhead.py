"""Rollout overhead cuts (issue 19 item 3): workspaces copied from one pristine tree per task, independent of each
other and of that tree; the tree made once and made again when the task's source changes; no repeated git work per
rollout; the sandboxes' cgroup parent weighed per sandbox."""

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from swe_gym_env.server.sandbox import cgroups, pristine
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

pytestmark = [pytest.mark.anyio]
sandboxed = pytest.mark.usefixtures("need_sandbox")


@pytest.fixture
def own_pristine(tmp_path, monkeypatch) -> Path:
    """Pristine trees under tmp_path (the cache dir itself also holds the task runtime, so it stays)."""
    where = tmp_path / "pristine"
    monkeypatch.setattr(pristine, "root", lambda: where)
    return where


def task_spec() -> SandboxSpec:
    t = bundled_tasks()[0]
    return SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit)


async def git(repo: Path, *args: str) -> str:
    run = await asyncio.to_thread(subprocess.run, ["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def trees(where: Path) -> list[Path]:
    return sorted(p for p in where.iterdir() if (p / pristine.READY).is_file()) if where.is_dir() else []


@sandboxed
async def test_a_write_in_one_workspace_is_seen_neither_in_another_nor_in_the_pristine_tree(own_pristine):
    async with await create_sandbox("local", task_spec()) as a, await create_sandbox("local", task_spec()) as b:
        (tree,) = trees(own_pristine)
        original = (tree / "testbed" / "batchtools" / "chunks.py").read_bytes()
        # in place (same inode: what a hard link would carry over), a new file, a commit and a file removed
        r = await a.exec(
            "echo '# in place' >> batchtools/chunks.py && echo new > NEW.txt && git add -A && "
            "git -c user.name=x -c user.email=x@y commit -qm mine && rm README.md",
            timeout=60,
        )
        assert r.ok, r.stderr
        seen = await b.exec("cat batchtools/chunks.py; ls; git log --oneline", timeout=60)
        assert seen.ok and "# in place" not in seen.stdout and "NEW.txt" not in seen.stdout
        assert "README.md" in seen.stdout and "mine" not in seen.stdout
        assert (await b.exec("git status --short", timeout=60)).stdout == ""  # a clean work tree
        assert (tree / "testbed" / "batchtools" / "chunks.py").read_bytes() == original
        assert not (tree / "testbed" / "NEW.txt").exists() and (tree / "testbed" / "README.md").exists()
        assert "mine" not in await git(tree / "testbed", "log", "--oneline")
        # a copy, not links: no file of the workspace shares an inode with the pristine tree
        pristine_inodes = {p.stat().st_ino for p in (tree / "testbed").rglob("*") if p.is_file()}
        mine = {p.stat().st_ino for p in (b.root / "testbed").rglob("*") if p.is_file()}  # type: ignore[attr-defined]
        assert pristine_inodes and not (pristine_inodes & mine)


@sandboxed
async def test_the_pristine_tree_is_made_once_stripped_and_made_again_when_the_source_changes(own_pristine, tmp_path):
    t = bundled_tasks()[0]
    source = tmp_path / "repo.bundle"
    shutil.copy(t.repo_source, source)
    spec = SandboxSpec(repo_source=str(source), base_commit=t.base_commit)
    for _ in range(2):
        async with await create_sandbox("local", spec) as sbx:
            r = await sbx.exec("git rev-parse HEAD; git log --all --oneline | wc -l; git remote | wc -l", timeout=60)
            head, commits, remotes = r.stdout.split()
            assert head == t.base_commit and remotes == "0"
    (first,) = trees(own_pristine)
    # history past the base is gone from the tree itself
    assert int(await git(first / "testbed", "rev-list", "--all", "--count")) == int(commits)
    os.utime(source, ns=(1, 1))  # the task's source changed: a new tree
    async with await create_sandbox("local", spec):
        pass
    assert len(trees(own_pristine)) == 2


@sandboxed
async def test_least_recently_used_trees_go_past_the_cap_and_a_branch_name_is_never_cached(own_pristine, monkeypatch):
    monkeypatch.setenv("SWE_GYM_PRISTINE_MAX", "1")
    t0, t1 = bundled_tasks()[:2]
    for t in (t0, t1):
        async with await create_sandbox("local", SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit)):
            pass
    (left,) = trees(own_pristine)
    assert (left / pristine.READY).read_text() == pristine.key(t1.repo_source, t1.base_commit)
    assert not pristine.cacheable(t0.repo_source, "main", True)
    assert not pristine.cacheable(t0.repo_source, t0.base_commit, False)  # history kept: a clone of its own
    monkeypatch.setenv("SWE_GYM_PRISTINE_MAX", "0")
    assert not pristine.cacheable(t0.repo_source, t0.base_commit, True)  # the cache turned off


GIT_COUNT = textwrap.dedent(
    """
    import asyncio
    from swe_gym_env.server.grading import grade, load_swebench
    from swe_gym_env.server.rollout.workspace import extract_diff, task_spec
    from swe_gym_env.server.sandbox.registry import create_sandbox
    from swe_gym_env.tasks.catalog import get_task

    async def main():
        task = get_task("bundled", 0)
        sbx = await create_sandbox("local", task_spec(task, "local"))
        fix = await sbx.exec("patch -p1 -s", timeout=30, stdin=task.patch.encode())  # the agent, without git
        assert fix.ok, fix.stderr
        patch = await extract_diff(sbx, task.base_commit)
        await sbx.close()
        g = await grade(task, patch, lambda: create_sandbox("local", task_spec(task, "local")))
        print("reward", g.reward)

    load_swebench()
    asyncio.run(main())
    """
)


@sandboxed
def test_a_rollout_outside_its_agent_runs_eight_git_processes_once_its_tree_exists(tmp_path):
    """Workspace copy (none), diff (add, diff) and grading (model patch, test files reset, test patch), then the
    canary run a 1.0 gets (the same three): 8. Before the pristine trees: 39 (two clones and two history strips with
    `git gc`)."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    script = tmp_path / "one.py"
    script.write_text(GIT_COUNT)
    run = [sys.executable, str(script)]
    assert subprocess.run(run, capture_output=True, timeout=300).returncode == 0  # the tree exists from here on
    trace = tmp_path / "trace"
    out = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=execve", "-e", "signal=none", "-o", str(trace), *run],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "reward 1.0" in out.stdout, out.stderr[-2000:]
    gits = [
        line
        for line in trace.read_text().splitlines()
        if ('execve("' in line and '/git"' in line.split(",")[0]) or "/git-core/" in line.split(",")[0]
    ]
    gits = [line for line in gits if "ENOENT" not in line]
    assert len(gits) == 8, "\n".join(gits)


def test_the_sandboxes_parent_group_weighs_one_process_per_sandbox(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.shares").write_text("1024")
    for i in range(3):
        (v1 / f"sbx-{i}").mkdir()
    cgroups._share_parent(v1)
    assert (v1 / "cpu.shares").read_text() == str(3 * 1024)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.weight").write_text("100")
    for i in range(200):
        (v2 / f"sbx-{i}").mkdir()
    cgroups._share_parent(v2)
    assert (v2 / "cpu.weight").read_text() == "10000"  # the kernel's maximum
    for d in list(v1.iterdir()):
        if d.is_dir():
            d.rmdir()
    cgroups._share_parent(v1)
    assert (v1 / "cpu.shares").read_text() == "1024"  # an empty group weighs as one process, never zero
