"""Build the `pypi` split: real bug fixes of small pure-Python packages, from two consecutive sdists on PyPI each.

    python -m swe_gym_env.commands.pypi_build            # download (sha256-pinned), build bundles + tasks.jsonl
    python -m swe_gym_env.commands.pypi_build --envs       # ... and the `local` task venvs (network)
    python -m swe_gym_env.commands.pypi_build --check      # verify the specs against the sdists; write nothing
    python -m swe_gym_env.commands.pypi_build --discover   # (authoring) run the tests before/after the fix in
                                                              # the local sandbox and write FAIL_TO_PASS /
                                                              # PASS_TO_PASS into each task.toml

specs/<name>/ holds one task, written for this project:
  task.toml     instance_id, repo, package, the two releases (version, sdist URL, sha256), the row's install_config
                (python, pip_packages, install, test_cmd, log_parser), FAIL_TO_PASS / PASS_TO_PASS (measured by
                --discover, less `excluded_tests`: tests whose outcome depends on the sandbox), notes
  problem.md    the problem statement (issue-style, written by us)
  fix.patch     the gold patch: the release's fix, non-test files only, against the older sdist's tree
  test.patch    the test that came with the fix (or, where the release added none, one we wrote: see notes)

The base commit is the older sdist's tree (without generated *.egg-info and bytecode), committed by a fixed author
at the older release's upload time, so commit ids are reproducible. Every line a patch adds must appear in the newer
sdist's copy of that file (the fix is the release's own), except a test written by us (`test_written_by_us`).
Output (not committed; rebuilt at setup): <cache>/tasks/pypi/{tasks.jsonl, <name>.bundle}; sdists under
<cache>/sdists/.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
import urllib.request
from importlib.resources import files
from pathlib import Path

from swe_gym_env.core.assets import cache_dir
from swe_gym_env.core.procs import pip_download
from swe_gym_env.tasks.models import patch_files


def _specs_dir() -> Path:
    """The task specs (package data), as a directory on disk."""
    found = files("swe_gym_env.tasks.pypi_fixes") / "specs"
    if not isinstance(found, Path):
        raise RuntimeError(f"swe_gym_env must be installed unzipped to build the pypi split ({found})")
    return found


SPECS = _specs_dir()
GIT_ENV = {
    "GIT_AUTHOR_NAME": "swe-gym-env",
    "GIT_AUTHOR_EMAIL": "pypi-fixes@swe-gym-env.invalid",
    "GIT_COMMITTER_NAME": "swe-gym-env",
    "GIT_COMMITTER_EMAIL": "pypi-fixes@swe-gym-env.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}
JUNK_DIRS = {"__pycache__", ".pytest_cache", ".tox", ".eggs"}
TEST_CMD = "pytest --no-header -rA --tb=no -p no:cacheprovider"


class DataError(Exception):
    """The data of one task is unusable (a checksum, a patch that does not apply, a missing file …)."""


def out_dir() -> Path:
    return cache_dir() / "tasks" / "pypi"


def sdist_dir() -> Path:
    return cache_dir() / "sdists"


def task_names() -> list[str]:
    return sorted(p.name for p in SPECS.iterdir() if (p / "task.toml").is_file())


def load_spec(name: str) -> dict:
    return tomllib.loads((SPECS / name / "task.toml").read_text(encoding="utf-8"))


def git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, encoding="utf-8")
    if proc.returncode:
        raise DataError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


# -- sdists -------------------------------------------------------------------------------------------------------


def fetch_sdist(package: str, release: dict, log=print) -> Path:
    """The sdist of a release, downloaded once into the cache and checked against its pinned sha256."""
    name = release["url"].rsplit("/", 1)[-1]
    path = sdist_dir() / name
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == release["sha256"]:
        return path
    sdist_dir().mkdir(parents=True, exist_ok=True)
    data = b""
    try:
        log(f"downloading {release['url']}")
        with urllib.request.urlopen(release["url"], timeout=120) as r:
            data = r.read()
    except OSError as e:  # no direct route to files.pythonhosted.org: pip's index configuration may have one
        log(f"direct download failed ({e}); trying pip download")
        with tempfile.TemporaryDirectory() as tmp:
            pip_download(tmp, [f"{package}=={release['version']}"], "--no-binary", ":all:", capture_output=True)
            found = Path(tmp) / name
            data = found.read_bytes() if found.is_file() else b""
    got = hashlib.sha256(data).hexdigest()
    if got != release["sha256"]:
        raise DataError(f"{name}: sha256 {got} != pinned {release['sha256']}" if data else f"{name}: download failed")
    tmp_path = path.with_suffix(".part")
    tmp_path.write_bytes(data)
    tmp_path.replace(path)
    return path


def unpack(sdist: Path, dest: Path) -> None:
    """The sdist's files (without the top directory, generated egg-info and bytecode), modes normalised."""
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            parts = m.name.split("/")[1:]
            if not parts or not m.isfile():
                continue
            if JUNK_DIRS.intersection(parts) or any(p.endswith(".egg-info") for p in parts) or m.name.endswith(".pyc"):
                continue
            if any(p in ("", ".", "..") for p in parts):
                raise DataError(f"{sdist.name}: unsafe member {m.name!r}")
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            f = tf.extractfile(m)
            assert f is not None
            target.write_bytes(f.read())
            os.chmod(target, 0o755 if m.mode & 0o111 else 0o644)


# -- one task --------------------------------------------------------------------------------------------------------


def canonical_diff(repo: Path, patch: Path) -> str:
    """``patch`` applied to HEAD, as `git diff` prints it; the work tree is left clean."""
    if not patch.is_file():
        raise DataError(f"{patch.name} is missing")
    git(repo, "apply", "--index", str(patch))
    out = git(repo, "diff", "--cached", "--no-color", "--no-ext-diff")
    git(repo, "reset", "-q", "--hard")
    return out


def check_provenance(patch: str, newer: Path, what: str) -> None:
    """Every line the patch adds is in the newer release's copy of that file (the fix is the release's own)."""
    for path in patch_files(patch):
        section = patch.split(f"diff --git a/{path} b/{path}\n", 1)[1].split("\ndiff --git ", 1)[0]
        added = [line[1:] for line in section.splitlines() if line.startswith("+") and not line.startswith("+++")]
        target = newer / path
        have = set(target.read_text(encoding="utf-8").splitlines()) if target.is_file() else set()
        missing = [line for line in added if line.strip() and line not in have]
        if missing:
            raise DataError(
                f"{what}: {len(missing)} added line(s) of {path} are not in the newer release: {missing[:2]}"
            )


def image_name(instance_id: str) -> str:
    """The stand-in image of a row, named like SWE-Gym's (`sweb.eval.x86_64.<id, "__" → "_s_">`, lower case) under
    our own namespace (never mistaken for a real SWE-Gym image)."""
    return "swe-gym-env-standin/sweb.eval.x86_64." + instance_id.replace("__", "_s_").lower() + ":latest"


def build_task(name: str, work: Path, log=print) -> tuple[dict, Path]:
    spec = load_spec(name)
    data = SPECS / name
    old_sdist, new_sdist = (
        fetch_sdist(spec["package"], spec["old"], log),
        fetch_sdist(spec["package"], spec["new"], log),
    )
    repo, newer = work / name, work / f"{name}.newer"
    repo.mkdir()
    newer.mkdir()
    unpack(old_sdist, repo)
    unpack(new_sdist, newer)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    message = f"{spec['package']} {spec['old']['version']} (sdist from PyPI)"
    git(repo, "commit", "-q", "-m", message, date=spec["old"]["released"])
    fix, test = canonical_diff(repo, data / "fix.patch"), canonical_diff(repo, data / "test.patch")
    for path in patch_files(fix):
        if "test" in Path(path).name or path.startswith("tests/"):
            raise DataError(f"fix.patch touches a test file: {path}")
    for path in patch_files(test):
        if "test" not in path:
            raise DataError(f"test.patch touches a non-test file: {path}")
    check_provenance(fix, newer, "fix.patch")
    if not spec.get("test_written_by_us"):
        check_provenance(test, newer, "test.patch")
    git(repo, "apply", "--check", str(data / "fix.patch"))
    cfg = dict(spec["install_config"])
    cfg.setdefault("test_cmd", TEST_CMD)
    cfg.setdefault("log_parser", "parse_log_pytest")
    row = {
        "instance_id": spec["instance_id"],
        "repo": spec["repo"],
        "base_commit": git(repo, "rev-parse", "HEAD").strip(),
        "problem_statement": (data / "problem.md").read_text(encoding="utf-8"),
        "hints_text": "",
        "created_at": spec["new"]["released"],
        "version": spec["version"],
        "patch": fix,
        "test_patch": test,
        "FAIL_TO_PASS": spec.get("tests", {}).get("FAIL_TO_PASS") or [],
        "PASS_TO_PASS": spec.get("tests", {}).get("PASS_TO_PASS") or [],
        "install_config": cfg,
        "docker_image": image_name(spec["instance_id"]),
        "repo_source": f"{name}.bundle",
        "meta": {
            "source": "pypi",
            "package": spec["package"],
            "old": spec["old"],
            "new": spec["new"],
            "special": spec.get("special", []),
            "test_written_by_us": bool(spec.get("test_written_by_us")),
            "notes": spec.get("notes", ""),
        },
    }
    bundle = work / f"{name}.bundle"
    git(repo, "bundle", "create", str(bundle), "main")
    return row, bundle


def build(dest: Path, names: list[str], log=print) -> list[dict]:
    """Build every task into ``dest`` (tasks.jsonl + bundles), replacing what differs; returns the rows."""
    rows: list[dict] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        built = []
        for i, name in enumerate(names):
            log(f"pypi split: {100 * i // max(1, len(names)):3d}% {name}")
            try:
                built.append(build_task(name, Path(tmp), log))
            except (DataError, OSError, KeyError, tarfile.TarError) as e:
                errors.append(f"{name}: {type(e).__name__}: {e}")
        if errors:
            raise DataError("; ".join(errors))
        dest.mkdir(parents=True, exist_ok=True)
        for row, bundle in built:
            target = dest / bundle.name
            heads = git(Path(tmp), "bundle", "list-heads", str(bundle))
            same = target.is_file() and git(Path(tmp), "bundle", "list-heads", str(target)) == heads
            if not same:
                shutil.copyfile(bundle, target)
            rows.append(row)
            log(f"{row['instance_id']}: base_commit={row['base_commit']}")
    text = "".join(json.dumps(r) + "\n" for r in rows)
    jsonl = dest / "tasks.jsonl"
    if not jsonl.is_file() or jsonl.read_text() != text:
        tmp_jsonl = jsonl.with_suffix(".part")
        tmp_jsonl.write_text(text)
        tmp_jsonl.replace(jsonl)
    return rows


def ensure_split(log=print) -> Path:
    """The split's tasks.jsonl, built once when missing (for a rollout naming the split on a server whose setup did
    not build it; `swe-gym-env setup --all` does): servers sharing the cache wait on a file lock, the second finds it
    built. Raises DataError."""
    import fcntl

    dest = out_dir()
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".pypi-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (dest / "tasks.jsonl").is_file():
                log("the pypi split is not built on this server: building it now, on first use (sdists from PyPI)")
                build(dest, task_names(), log)
                log("pypi split: 100% built")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return dest / "tasks.jsonl"
