"""The `pypi` split's command (`swe-gym-env setup` runs it; `python -m swe_gym_env.commands.pypi_build --help`): the
split built from its specs (`swe_gym_env.tasks.pypi_fixes.build`), the `local` task venvs, and for authoring
(`--discover`) FAIL_TO_PASS / PASS_TO_PASS measured by running the tests in the local sandbox before and after the
fix — the part that grades in sandboxes, beside `validate`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from swe_gym_env.server.grading import Guarded, eval_script, load_swebench, make_test_spec, parse_junit
from swe_gym_env.server.grading import junit_key as key_of
from swe_gym_env.server.grading.taskenv import ensure_env
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.envs import EnvError, build_env
from swe_gym_env.tasks.loaders import load_tasks
from swe_gym_env.tasks.pypi_fixes import build as split_build
from swe_gym_env.tasks.pypi_fixes.build import SPECS, DataError, build, load_spec, out_dir, task_names

# -- authoring: measure FAIL_TO_PASS / PASS_TO_PASS ----------------------------------------------------------------


async def measure(task, log=print) -> tuple[list[str], list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS, disagreements) from running the test files in the local sandbox, in the task's
    own environment, with the test patch alone and with the fix: swebench's parser and the JUnit report must agree
    on every test kept."""
    swebench = await asyncio.to_thread(load_swebench)
    probe = task.model_copy(update={"FAIL_TO_PASS": ["?"], "PASS_TO_PASS": []})
    statuses = []
    disagree: set[str] = set()
    for patch in ("", task.patch):
        spec = SandboxSpec(repo_source=task.repo_source, base_commit=task.base_commit, workdir=task.workdir)
        sbx = await create_sandbox("local", spec)
        guard = Guarded.new(junit=True)
        try:
            await ensure_env(sbx, probe)
            await sbx.write_file("/tmp/grading/model.patch", patch.encode())
            await sbx.write_file("/tmp/grading/test.patch", task.test_patch.encode())
            await guard.install(sbx)
            await sbx.write_file("/tmp/grading/eval.sh", eval_script(probe, bool(patch), guard).encode(), 0o700)
            res = await sbx.exec("bash /tmp/grading/eval.sh", timeout=900)
            try:
                junit = parse_junit(await sbx.read_file(guard.junit_path))
            except OSError as e:
                tail = (res.stdout + res.stderr)[-1500:]
                raise DataError(f"{task.instance_id}: no JUnit report ({e}): {tail}") from e
        finally:
            await sbx.close()
        with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
            f.write(res.stdout + "\n" + res.stderr)
            f.flush()
            status_map, found = swebench.get_logs_eval(make_test_spec(probe, swebench), f.name)
        if not found:
            raise DataError(f"{task.instance_id}: no parsable test results: {res.stdout[-1500:]}")
        for t, s in status_map.items():
            if "::" in t and (s == "PASSED") != (junit.get(key_of(t)) == "PASSED"):
                disagree.add(t)
        statuses.append(status_map)
        log(f"{task.instance_id}: {'gold' if patch else 'base'}: {len(status_map)} tests parsed")
    before, after = statuses
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED" and t not in disagree)
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED" and t not in disagree)
    return f2p, p2p, sorted(disagree)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        if not v:
            return "[]"
        return "[\n" + "".join(f"    {toml_value(x)},\n" for x in v) + "]"
    raise TypeError(type(v))


def write_lists(name: str, f2p: list[str], p2p: list[str]) -> None:
    """Replace the FAIL_TO_PASS / PASS_TO_PASS arrays of specs/<name>/task.toml (kept at the file's end)."""
    path = SPECS / name / "task.toml"
    text = path.read_text(encoding="utf-8")
    head = text.split("\n# measured by build.py --discover", 1)[0].rstrip("\n")
    tail = f"FAIL_TO_PASS = {toml_value(f2p)}\nPASS_TO_PASS = {toml_value(p2p)}\n"
    # The arrays live in the [tests] table so they may follow the other tables.
    path.write_text(f"{head}\n\n# measured by build.py --discover\n[tests]\n{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(split_build.__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <cache>/tasks/pypi)")
    parser.add_argument("--check", action="store_true", help="verify the specs against the sdists; write nothing")
    parser.add_argument("--envs", action="store_true", help="also build the local task venvs (needs network)")
    parser.add_argument("--discover", action="store_true", help="measure FAIL_TO_PASS / PASS_TO_PASS into the specs")
    parser.add_argument("names", nargs="*", help="only these tasks (folder names under specs/)")
    args = parser.parse_args(argv)
    names = args.names or task_names()
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                rows = build(Path(tmp), names)
            bad = [r["instance_id"] for r in rows if not r["FAIL_TO_PASS"]]
            if bad:
                print(f"error: no FAIL_TO_PASS measured for {bad} (run --discover)", file=sys.stderr)
                return 1
            print(f"{len(rows)} tasks ok")
            return 0
        dest = args.out or out_dir()
        build(dest, task_names())  # tasks.jsonl always holds every task
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.discover or args.envs:
        report = load_tasks(str(dest / "tasks.jsonl"), kind="swe-rebench")
        tasks = {t.repo_source and Path(t.repo_source).stem: t for t in report.tasks}
        placeholder = [r for r in report.skipped]
        if placeholder and not args.discover:
            print("error: " + "; ".join(placeholder), file=sys.stderr)
            return 1
        for name in names:
            task = tasks.get(name)
            if task is None:  # rows without measured lists do not validate as tasks yet
                row = next(json.loads(line) for line in (dest / "tasks.jsonl").open() if f'"{name}.bundle"' in line)
                row["FAIL_TO_PASS"], row["repo_source"] = ["?"], str(dest / row["repo_source"])
                task = load_rows([row])[0]
            try:
                build_env(task, log=print)
            except EnvError as e:
                print(f"error: {e}", file=sys.stderr)
                return 1
            if args.discover:
                f2p, p2p, disagree = asyncio.run(measure(task))
                if disagree:
                    print(f"{name}: parser and JUnit disagree on (left out): {disagree}")
                print(f"{name}: FAIL_TO_PASS {len(f2p)}, PASS_TO_PASS {len(p2p)}")
                excluded = set(load_spec(name).get("excluded_tests", []))
                write_lists(name, [t for t in f2p if t not in excluded], [t for t in p2p if t not in excluded])
        if args.discover:
            build(dest, task_names())
    return 0


def load_rows(rows: list[dict]):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        report = load_tasks(str(path), kind="swe-rebench")
    if report.skipped:
        raise DataError("; ".join(report.skipped))
    return report.tasks


if __name__ == "__main__":
    sys.exit(main())
