"""The committed bundled tasks (bundles, tasks.jsonl) are exactly what tasks/bundled/build.py makes of src/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BUNDLED = Path(__file__).resolve().parents[1] / "tasks" / "bundled"
BUILD = BUNDLED / "build.py"


def run_build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BUILD), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A private copy of tasks/bundled (data and outputs) to break."""
    dest = tmp_path / "bundled"
    shutil.copytree(BUNDLED, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def outputs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.suffix in (".bundle", ".jsonl")}


def test_committed_outputs_match_the_data():
    proc = run_build("--check")
    assert proc.returncode == 0, proc.stderr
    assert "batchtools: base_commit=" in proc.stdout


def edit_fix_patch(root: Path) -> None:
    patch = root / "src" / "dotenvlite" / "fix.patch"
    text = patch.read_text()
    assert text.count("literally;") == 1
    patch.write_text(text.replace("literally;", "verbatim;"))  # still applies, but is another fix


def edit_history(root: Path) -> None:
    readme = root / "src" / "invoicer" / "commits" / "1" / "README.md"
    readme.write_text(readme.read_text() + "\nMore words.\n")


def edit_failing_tests(root: Path) -> None:
    toml = root / "src" / "retrykit" / "task.toml"
    text = toml.read_text()
    assert text.count("test_no_wait_after_the_last_attempt") == 1
    toml.write_text(text.replace("test_no_wait_after_the_last_attempt", "test_renamed"))


@pytest.mark.parametrize(
    "corrupt,task,what",
    [
        (edit_fix_patch, "dotenvlite", "patch"),
        (edit_history, "invoicer", "base_commit"),
        (edit_failing_tests, "retrykit", "FAIL_TO_PASS"),
    ],
)
def test_check_fails_naming_the_task_whose_data_changed(
    copy: Path, corrupt: Callable[[Path], None], task: str, what: str
):
    before = outputs(copy)
    corrupt(copy)
    proc = run_build("--check", "--root", str(copy))
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith(f"error: {task}: ")]
    assert errors and what in "\n".join(errors), proc.stderr
    others = {"batchtools", "layercfg", "dotenvlite", "invoicer", "billcycle", "retrykit"} - {task}
    assert not any(f"error: {name}:" in proc.stderr for name in others), proc.stderr
    assert outputs(copy) == before  # --check changes nothing


def test_a_patch_that_does_not_apply_is_an_error_naming_the_task(copy: Path):
    patch = copy / "src" / "batchtools" / "fix.patch"
    patch.write_text(patch.read_text().replace("-    count = len(items)", "-    count = LEN(items)"))
    for args in (["--check"], []):
        proc = run_build(*args, "--root", str(copy))
        assert proc.returncode == 1 and "error: batchtools: " in proc.stderr and "does not apply" in proc.stderr


def test_build_restores_missing_or_stale_outputs(copy: Path):
    expected = outputs(copy)
    (copy / "layercfg.bundle").unlink()
    (copy / "tasks.jsonl").write_text("".join(reversed((copy / "tasks.jsonl").read_text().splitlines(True))))
    proc = run_build("--root", str(copy))
    assert proc.returncode == 0, proc.stderr
    assert outputs(copy) == expected
    assert run_build("--check", "--root", str(copy)).returncode == 0
