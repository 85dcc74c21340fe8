"""Issue 40 on the pypi split: classes 2-5 of the issue (builtins.AssertionError made XFailed from the package, a
`pytest.py` at the root, an entry-point plugin from an upper-case `.DIST-INFO` folder, pytest settings behind TOML
escapes) on real releases' code, through `grade()` in each row's own environment: the three rows that had no canary
before the issue (marshmallow, python-dotenv, toml), where the construction cannot lean on the canaries.
Every patch fixes nothing: each must end 0.0 with its finding. (Bundled rows: the whole corpus, tests/test_grading.py
and, through the real pipeline, tests/test_grading_adversary.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from cheats import as_diff, issue_40
from test_pypi_split import pypi_split  # noqa: F401 (fixture)

from swe_gym_env.server.grading import grade
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import pypi_jsonl

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_sandbox")]

# row -> (a file of the package its tests import, a new module of that package: dotted name, path)
ROWS = {
    "toml": ("toml/__init__.py", "toml._flip", "toml/_flip.py"),
    "python-dotenv": ("src/dotenv/__init__.py", "dotenv._flip", "src/dotenv/_flip.py"),
    "marshmallow": ("src/marshmallow/__init__.py", "marshmallow._flip", "src/marshmallow/_flip.py"),
}
CASES = [(row, cheat.name) for row, args in ROWS.items() for cheat in issue_40(*args)]


@pytest.mark.parametrize(("row", "name"), CASES, ids=[f"{r}-{n}" for r, n in CASES])
async def test_issue_40_classes_on_pypi_rows(pypi_split, row, name, tmp_path):  # noqa: F811
    task = next(t for t in pypi_split if Path(str(t.repo_source)).name == f"{row}.bundle")
    cheat = next(c for c in issue_40(*ROWS[row]) if c.name == name)
    bundle = pypi_jsonl().parent / Path(str(task.repo_source)).name
    diff = as_diff(bundle, task.base_commit, cheat.command, tmp_path / "repo")
    spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
    g = await grade(task, diff, lambda: create_sandbox("local", spec), timeout_s=120)
    found = [f.code for f in g.findings if not isinstance(f, str)] + (["protected_files"] if g.dropped_files else [])
    assert g.reward == 0.0, (row, name, g.report.integrity, g.report.log_tail[-1500:])
    assert cheat.expect in found, (row, name, found, g.report.integrity, g.dropped_files)
    if cheat.expect == "grading_tampered":
        assert "replaced builtins.AssertionError" in g.report.integrity, g.report.integrity
