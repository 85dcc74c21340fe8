"""Build the bundled tasks (<name>.bundle and tasks.jsonl beside this file) from the data under src/.

    python tasks/bundled/build.py           # rewrite what differs from the data
    python tasks/bundled/build.py --check   # rebuild in a temp dir; exit 1 naming each task that differs

src/tasks.toml lists the tasks in row order. src/<name>/ holds one task, a small repo written for this project:
  task.toml        instance_id, repo, created_at, version, FAIL_TO_PASS, PASS_TO_PASS, and one [[commits]] table
                   (message, date) per commit of the history, oldest first
  commits/<n>/     the files commit n adds or changes (commits/1/ is the whole first tree); the last commit
                   introduces the bug and its tip is the row's base_commit
  problem.md       the problem statement; hints.md (optional) the hints
  fix.patch        the gold patch (source files only), test.patch the tests, both against base_commit

Commits get a fixed author, committer and date and git runs without user or system config, so the commit ids are
reproducible. The patches are stored exactly as `git diff` prints them; --check also fails when one is not.
A bundle is only rewritten when its branch head differs: pack bytes may vary between git versions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "swe-gym-env",
    "GIT_AUTHOR_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_COMMITTER_NAME": "swe-gym-env",
    "GIT_COMMITTER_EMAIL": "demo@swe-gym-env.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
}
JUNK = {"__pycache__", ".pytest_cache", ".ruff_cache", ".DS_Store"}  # never part of a commit


class DataError(Exception):
    """The data of one task is unusable (a patch that does not apply, a missing file …)."""


def git(cwd: Path, *args: str, date: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | GIT_ENV
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, encoding="utf-8")
    if proc.returncode:
        raise DataError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the files under ``src`` into ``dest`` as plain (non-executable) files, skipping caches."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_file() and not JUNK.intersection(rel.parts) and path.suffix != ".pyc":
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(path.read_bytes())


def canonical_diff(repo: Path, patch: Path) -> str:
    """``patch`` applied to HEAD, as `git diff` prints it; the work tree is left clean."""
    if not patch.is_file():
        raise DataError(f"{patch.name} is missing")
    git(repo, "apply", "--index", str(patch))
    out = git(repo, "diff", "--cached", "--no-color", "--no-ext-diff")
    git(repo, "reset", "-q", "--hard")
    return out


PATCHES = {"patch": "fix.patch", "test_patch": "test.patch"}  # row key: file under src/<name>/


def build_task(data: Path, work: Path) -> tuple[dict, Path]:
    """Build one task in ``work``: its tasks.jsonl row and its bundle."""
    name = data.name
    meta = tomllib.loads((data / "task.toml").read_text(encoding="utf-8"))
    repo = work / name
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for n, commit in enumerate(meta["commits"], 1):
        tree = data / "commits" / str(n)
        if not tree.is_dir():
            raise DataError(f"commits/{n}/ is missing")
        copy_tree(tree, repo)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", commit["message"], date=commit["date"])
    hints = data / "hints.md"
    row = {
        "instance_id": meta["instance_id"],
        "repo": meta["repo"],
        "base_commit": git(repo, "rev-parse", "HEAD").strip(),
        "problem_statement": (data / "problem.md").read_text(encoding="utf-8"),
        "hints_text": hints.read_text(encoding="utf-8") if hints.is_file() else "",
        "created_at": meta["created_at"],
        "version": meta["version"],
        **{key: canonical_diff(repo, data / file) for key, file in PATCHES.items()},
        "FAIL_TO_PASS": meta["FAIL_TO_PASS"],
        "PASS_TO_PASS": meta["PASS_TO_PASS"],
        "repo_source": f"{name}.bundle",
    }
    bundle = work / f"{name}.bundle"
    git(repo, "bundle", "create", str(bundle), "main")
    return row, bundle


def bundle_matches(committed: Path, rebuilt: Path, work: Path) -> bool:
    """Whether ``committed`` holds the same branch head as ``rebuilt`` (and, if its bytes differ, is readable)."""
    if not committed.is_file():
        return False
    if committed.read_bytes() == rebuilt.read_bytes():
        return True
    try:
        if git(work, "bundle", "list-heads", str(committed)) != git(work, "bundle", "list-heads", str(rebuilt)):
            return False
        probe = Path(tempfile.mkdtemp(dir=work))  # fetching checks every object of the pack
        git(probe, "init", "-q")
        git(probe, "fetch", "-q", str(committed), "main")
    except DataError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each task that differs")
    parser.add_argument("--root", type=Path, default=HERE, help="the folder with src/, the bundles and tasks.jsonl")
    args = parser.parse_args(argv)
    root, src = args.root.resolve(), args.root.resolve() / "src"
    order = tomllib.loads((src / "tasks.toml").read_text(encoding="utf-8"))["order"]
    on_disk = {p.name for p in src.iterdir() if p.is_dir() and p.name not in JUNK}
    errors = [f"src/{n}/ is not listed in src/tasks.toml" for n in sorted(on_disk - set(order))]
    errors += [f"{n}: src/{n}/ is missing" for n in order if n not in on_disk]
    jsonl = root / "tasks.jsonl"
    old_text = jsonl.read_text(encoding="utf-8") if jsonl.is_file() else ""
    try:
        old_rows = {r.get("repo_source"): r for r in map(json.loads, old_text.splitlines())}
    except (json.JSONDecodeError, AttributeError):
        old_rows = {}  # unreadable: every row differs
    with tempfile.TemporaryDirectory() as tmp:
        built: list[tuple[str, dict, Path]] = []
        for name in (n for n in order if n in on_disk):
            try:
                built.append((name, *build_task(src / name, Path(tmp))))
            except (DataError, OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
                errors.append(f"{name}: {type(e).__name__}: {e}")
        if errors:  # unusable data: write nothing
            print("\n".join(f"error: {e}" for e in errors), file=sys.stderr)
            return 1
        diffs = []
        for name, row, bundle in built:
            print(f"{name}: base_commit={row['base_commit']}")
            fields = [k for k in row if old_rows.get(row["repo_source"], {}).get(k) != row[k]]
            if fields:
                diffs.append(f"{name}: the tasks.jsonl row differs from the data in {', '.join(fields)}")
            if not bundle_matches(root / bundle.name, bundle, Path(tmp)):
                diffs.append(f"{name}: {bundle.name} does not hold base_commit {row['base_commit']}")
                if not args.check:
                    shutil.copyfile(bundle, root / bundle.name)
            for key, file in PATCHES.items():
                if (src / name / file).read_text(encoding="utf-8") != row[key]:
                    diffs.append(f"{name}: src/{name}/{file} is not exactly as `git diff` prints it")
                    if not args.check:
                        (src / name / file).write_text(row[key], encoding="utf-8")
        text = "".join(json.dumps(row) + "\n" for _, row, _ in built)
        if text != old_text:
            diffs.append("tasks.jsonl differs from the data" + ("" if diffs else " (row order or formatting)"))
            if not args.check:
                jsonl.write_text(text, encoding="utf-8")
    for d in diffs:
        print(f"error: {d}" if args.check else f"rewritten: {d}", file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and diffs else 0


if __name__ == "__main__":
    sys.exit(main())
