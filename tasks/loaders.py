"""Loaders for SWE-Gym / SWE-Gym-Lite, SWE-bench (full / Lite / Verified) and SWE-rebench rows.

A source is a local JSONL / JSON / parquet file or a Hugging Face Hub dataset id (read with `datasets`). Every row
is normalised into the one `Task` model; a malformed row is skipped with a reason naming the row and the field,
and the loader reports how many it skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from swe_gym_env.tasks.envs import CONDA_ACTIVATE, activation_for
from swe_gym_env.tasks.models import InstallConfig, Task

Kind = Literal["swe-gym", "swe-bench", "swe-rebench"]
REBENCH_DEFAULT_TEST_CMD = "pytest --no-header -rA --tb=no -p no:cacheprovider"
# Repos whose tests do not run under pytest: their own runner, as SWE-bench's harness ran them (swebench 4.x specs;
# 5.x keeps only the parsers, `MAP_REPO_TO_PARSER_PY`). A row's own `test_cmd` wins.
REPO_TEST_RUNNERS: dict[str, tuple[str, Literal["files", "django_labels"]]] = {
    "django/django": ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1", "django_labels"),
    "sympy/sympy": ("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose", "files"),
}


class DatasetError(RuntimeError):
    """The source itself cannot be read (as opposed to one bad row)."""


@dataclass
class LoadReport:
    source: str
    kind: Kind
    tasks: list[Task] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "row N (instance_id): field: reason"

    def summary(self) -> str:
        return f"{self.source}: {len(self.tasks)} tasks loaded ({self.kind}), {len(self.skipped)} rows skipped"


def guess_kind(source: str, first_row: dict[str, Any] | None = None) -> Kind:
    """The schema of a source: from the row's own fields where they tell (a local file's folders say nothing: the
    cache lives under `swe_gym_env/`), else from the name (Hub ids, file names), else SWE-Gym."""
    row = first_row or {}
    by_row: Kind | None = None
    if row.get("docker_image") or row.get("image_name") or row.get("install_config"):  # null fields say nothing
        by_row = "swe-rebench"
    elif "environment_setup_commit" in row or isinstance(row.get("FAIL_TO_PASS"), str):
        by_row = "swe-bench"
    path = Path(source)
    if by_row and path.exists():
        return by_row
    low = (path.name if path.exists() else source).lower()
    if "rebench" in low:
        return "swe-rebench"
    if "swe-gym" in low or "swe_gym" in low:
        return "swe-gym"
    if "swe-bench" in low or "swe_bench" in low:
        return "swe-bench"
    return by_row or "swe-gym"


def swe_gym_image(instance_id: str) -> str:
    return "xingyaoww/sweb.eval.x86_64." + instance_id.replace("__", "_s_").lower()


def swe_bench_image(instance_id: str) -> str:
    return "swebench/sweb.eval.x86_64." + instance_id.replace("__", "_1776_").lower()


def _json_field(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("{", "["):
        return json.loads(value)
    return value


def normalise_row(row: dict[str, Any], kind: Kind, source: str) -> dict[str, Any]:
    """Map one raw row of the given schema onto Task's fields (validation happens in Task)."""
    iid = str(row.get("instance_id", ""))
    out = {
        k: row[k]
        for k in (
            "instance_id",
            "repo",
            "base_commit",
            "problem_statement",
            "patch",
            "test_patch",
            "FAIL_TO_PASS",
            "PASS_TO_PASS",
        )
        if k in row
    }
    out["hints_text"] = row.get("hints_text") or ""
    out["dataset"] = source
    if row.get("version") is not None:
        out["version"] = str(row["version"])
    if row.get("repo_source"):
        out["repo_source"] = row["repo_source"]
    setup = _json_field(row.get("setup_commands"))
    if setup:  # our own field (any schema): a list of shell lines, or one line
        out["setup_commands"] = [setup] if isinstance(setup, str) else setup
    if row.get("eval_script"):  # newer SWE-bench-format rows: graded by their own script and parser
        out["eval_script"] = row["eval_script"]
        out["eval_type"] = row.get("eval_type") or "pass_and_fail"
    if row.get("log_parser"):
        out["log_parser"] = row["log_parser"]
    if kind in ("swe-gym", "swe-bench"):
        out["image"] = row.get("image") or (swe_gym_image if kind == "swe-gym" else swe_bench_image)(iid)
        out["env_activation"] = CONDA_ACTIVATE
        runner = REPO_TEST_RUNNERS.get(str(out.get("repo")))
        if runner and not row.get("eval_script"):
            out["test_cmd"], out["test_args"] = runner
    else:
        out["image"] = row.get("docker_image") or row.get("image_name") or row.get("image")
        raw = _json_field(row.get("install_config")) or {}
        if not isinstance(raw, dict):
            raise ValueError("install_config: not an object")
        test_cmd = raw.get("test_cmd") or REBENCH_DEFAULT_TEST_CMD
        if isinstance(test_cmd, list):  # some rows give several commands; the last one runs the tests
            test_cmd = test_cmd[-1]
        out["test_cmd"] = test_cmd
        out["log_parser"] = raw.get("log_parser") or row.get("log_parser") or "parse_log_pytest"
        try:
            cfg = InstallConfig.model_validate(raw) if raw else None  # no install_config: the image's env, if any
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"install_config.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
        out["install_config"] = cfg
        if isinstance(out.get("repo"), str) and isinstance(out.get("base_commit"), str):
            out["env_activation"] = activation_for(
                cfg, out["repo"], out["base_commit"], image=bool(out["image"]), local=bool(row.get("repo_source"))
            )
    if row.get("test_cmd"):  # our own field (any schema): the row's test command wins
        out["test_cmd"] = row["test_cmd"]
    return out


def _read_local(path: Path) -> Iterator[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open() as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as e:
                        yield {"__error__": f"line {n} is not JSON: {e}"}
    elif suffix == ".json":
        data = json.loads(path.read_text())
        yield from (data if isinstance(data, list) else [data])
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    else:
        raise DatasetError(f"{path}: unsupported file type {suffix!r} (use .jsonl, .json or .parquet)")


def _read_hub(dataset_id: str, split: str) -> Iterator[dict[str, Any]]:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise DatasetError(f"{dataset_id!r} is a Hub dataset id and HF_HUB_OFFLINE is set: use a local file")
    import datasets

    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as e:  # datasets raises many types; the message is what matters
        raise DatasetError(f"could not load {dataset_id!r} split {split!r}: {type(e).__name__}: {e}") from e
    for row in ds:
        if isinstance(row, dict):
            yield row


def rows_of(source: str, split: str = "train") -> Iterator[dict[str, Any]]:
    path = Path(source)
    if path.exists():
        return _read_local(path)
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise DatasetError(f"{source!r} is neither an existing file nor a Hub dataset id (OWNER/NAME)")
    return _read_hub(source, split)


def load_tasks(source: str, split: str = "train", kind: Kind | None = None, limit: int | None = None) -> LoadReport:
    rows: Iterable[dict[str, Any]] = rows_of(source, split)
    report: LoadReport | None = None
    base = Path(source).parent if Path(source).exists() else None
    for n, row in enumerate(rows):
        if report is None:
            report = LoadReport(source=source, kind=kind or guess_kind(source, row))
        if limit is not None and len(report.tasks) >= limit:
            break
        iid = row.get("instance_id", "?") if isinstance(row, dict) else "?"
        if not isinstance(row, dict) or "__error__" in row:
            report.skipped.append(f"row {n}: {row.get('__error__') if isinstance(row, dict) else 'not an object'}")
            continue
        try:
            data = normalise_row(row, report.kind, source)
            if base is not None and data.get("repo_source") and not os.path.isabs(data["repo_source"]):
                data["repo_source"] = str(base / data["repo_source"])
            report.tasks.append(Task.model_validate(data))
        except ValidationError as e:
            errs = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:3])
            report.skipped.append(f"row {n} ({iid}): {errs}")
        except (ValueError, TypeError) as e:
            report.skipped.append(f"row {n} ({iid}): {e}")
    return report or LoadReport(source=source, kind=kind or guess_kind(source))
