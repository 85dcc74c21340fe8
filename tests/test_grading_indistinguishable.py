"""Issue 40, item 5: a canary run no code can tell apart from the main run.

A probe patch (the code under test) records, at import inside the guarded test process, everything Python can observe
of its surroundings without reading the test files: the stat of every path under the tree, /tmp, $HOME and the
working folder (mode, owner, size, mtime, links, kind), every listing, the environment, argv, sys.path, interpreter
flags, resource limits, open descriptors, umask, uid and hostname. The main run and the canary run of one grading are
made by one procedure whose only differing input is the bytes of the mutated test files, so the two records must be
equal. What differs between *any* two runs, canary or not, is left out and named: inode and device numbers, ctime and
atime, and the digits of times written while the run goes on (the same files in both runs, stamped by the clock: the
probe records them as "now"), pipe and unlinked-file numbers, process ids. Every time set before the tests start is
the one instant `script.NORMALISE` gives it, and is compared exactly.

The same probe, given a mutant at a length of its own (unpadded, as the canary step once wrote them), sees the
difference: the check can fail.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from swe_gym_env.server.grading import grader, load_swebench, plan_for
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import BUNDLED_DIR, bundled_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.usefixtures("need_sandbox")]

PROBE = r"""

def _swe_gym_probe():
    import json, os, resource, socket, sys, stat, time
    out = {}
    now = time.time_ns()
    def when(ns):  # a time written during this run is "now" (the clock, not the run, decides its digits)
        return "now" if abs(now - ns) < 600 * 10**9 else ns
    def walk(top, depth=6):
        seen = {}
        for root, dirs, files in os.walk(top):
            dirs.sort()
            if root.count(os.sep) - top.count(os.sep) >= depth:
                dirs[:] = []
            for name in sorted(dirs + files):
                p = os.path.join(root, name)
                if p == "/tmp/probe.json":
                    continue
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                seen[p] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size,
                           when(st.st_mtime_ns), st.st_nlink]
        return seen
    out["tree"] = walk(os.getcwd())
    out["tmp"] = walk("/tmp")
    out["home"] = walk(os.path.expanduser("~"), 2)
    out["env"] = dict(os.environ)
    out["argv"] = sys.argv
    out["path"] = sys.path
    out["flags"] = repr(sys.flags)
    out["limits"] = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")}
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if ":[" in target:  # pipe:[N], socket:[N]: the kernel's numbering
            target = target.split(":[")[0]
        elif target.startswith("/tmp/#"):  # an unlinked temp file, named by its inode
            target = "/tmp/#<inode> (deleted)"
        fds[fd] = target
    out["fds"] = fds
    mask = os.umask(0)
    os.umask(mask)
    out["umask"] = mask
    out["uid"] = [os.getuid(), os.geteuid(), os.getgid()]
    out["host"] = socket.gethostname()
    out["cwd"] = os.getcwd()
    with open("/tmp/probe.json", "w") as f:
        json.dump(out, f, sort_keys=True)


import sys as _sys
if "pytest" in _sys.modules:
    _swe_gym_probe()
"""


def probe_patch(task, tmp_path: Path) -> str:
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(BUNDLED_DIR / task.repo_source), str(repo)], check=True)
    subprocess.run(["git", "checkout", "-q", task.base_commit], cwd=repo, check=True)
    init = repo / "batchtools" / "__init__.py"
    init.write_text(init.read_text() + PROBE)
    return subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout


class _Keeping:
    """A sandbox that hands back /tmp/probe.json before it closes."""

    def __init__(self, sbx, kept: list) -> None:
        self._sbx, self._kept = sbx, kept

    def __getattr__(self, name):
        return getattr(self._sbx, name)

    async def close(self) -> None:
        try:
            self._kept.append(json.loads(await self._sbx.read_file("/tmp/probe.json")))
        except Exception as e:  # the probe did not run: the comparison below fails loudly
            self._kept.append({"error": repr(e)})
        await self._sbx.close()


async def _probe_runs(task, patch: str, files: list[dict[str, bytes]]) -> list[dict]:
    spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
    kept: list[dict] = []

    async def make():
        return _Keeping(await create_sandbox("local", spec), kept)

    swebench = load_swebench()
    plan = plan_for(task, swebench)
    for test_files in files:
        await grader._run_tests(task, patch, make, plan, None, 120, grader._Clock(None), test_files)
    return kept


def _differences(a: dict, b: dict) -> list[str]:
    out = []
    for key in sorted(a.keys() | b.keys()):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += [
                f"{key}[{k}]: {x.get(k)} != {y.get(k)}" for k in sorted(x.keys() | y.keys()) if x.get(k) != y.get(k)
            ]
        elif x != y:
            out.append(f"{key}: {x} != {y}")
    return out


async def test_the_main_and_the_canary_run_look_the_same_to_the_code_under_test(tmp_path):
    task = bundled_tasks()[0]
    swebench = load_swebench()
    ctx = grader._Grading(
        task,
        lambda: create_sandbox(
            "local", SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
        ),
        swebench,
        plan_for(task, swebench),
        None,
        120,
        "local",
        grader._Clock(None),
        None,
    )
    entry = await grader.task_canaries(ctx)
    pair = grader._canary_pair(entry)
    assert pair is not None, entry.get("why")
    main, canary = pair
    assert main.keys() == canary.keys() and all(main[p] != canary[p] for p in main), "the runs differ in bytes"
    assert all(len(main[p]) == len(canary[p]) for p in main)
    patch = probe_patch(task, tmp_path)
    first, second = await _probe_runs(task, patch, [main, canary])
    assert "error" not in first and "error" not in second, (first.get("error"), second.get("error"))
    assert first["tree"] and first["tmp"], "the probe saw the tree and /tmp"
    diffs = _differences(first, second)
    assert diffs == [], "\n".join(diffs)

    # the check can fail: a mutant written at a length of its own (the canary step once wrote mutants unpadded) is seen
    unpadded = {p: data + b"\n# unpadded\n" for p, data in canary.items()}
    assert any(len(unpadded[p]) != len(main[p]) for p in main)
    a, b = await _probe_runs(task, patch, [main, unpadded])
    assert any(d.startswith("tree[") and "test_chunks.py" in d for d in _differences(a, b)), _differences(a, b)
