"""What grading measured of a task, on disk: run times and empty-patch baselines per image and sandbox kind, and the
task's mutation canaries (with the gold run's runtime events). One JSON file per task, keyed by the task's content
(a digest of everything that decides its verdict), so a restarted server, or another server sharing the folder, starts
with what an earlier one measured. Writers hold a file lock (`swe_gym_env.core.procs.file_lock`) and replace the file
atomically; readers never see half a file.

The folder is `$SWE_GYM_DATA_DIR/grading` where that is set, else `<cache dir>/grading`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from swe_gym_env.core.procs import file_lock
from swe_gym_env.core.settings import setting
from swe_gym_env.tasks.models import Task

VERSION = 2  # 2: the launcher, the base tree, gold statuses (earlier records are rebuilt)
MAX_BYTES = 16 * 1024 * 1024  # a task's record larger than this is not read (and not trusted)
STORE_DIR: Path | None = None  # tests point this at a tmp folder


def store_dir() -> Path:
    if STORE_DIR is not None:
        return STORE_DIR
    from swe_gym_env.core.assets import cache_dir

    data = setting("data_dir")
    return (Path(data) if data else cache_dir()) / "grading"


def task_digest(task: Task) -> str:
    """The task's content: what decides its verdict (not where its repository or image lives)."""
    fields = task.model_dump(
        include={
            "instance_id",
            "repo",
            "base_commit",
            "patch",
            "test_patch",
            "FAIL_TO_PASS",
            "PASS_TO_PASS",
            "workdir",
            "test_cmd",
            "test_args",
            "log_parser",
            "install_config",
            "eval_script",
            "eval_type",
            "setup_commands",
        }
    )
    blob = json.dumps([VERSION, fields], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:40]


def path_for(task: Task) -> Path:
    return store_dir() / f"{task.instance_id[:80]}-{task_digest(task)}.json"


def load(task: Task) -> dict[str, Any]:
    """The task's record ({} when there is none or it cannot be read)."""
    path = path_for(task)
    try:
        if path.stat().st_size > MAX_BYTES:
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


@contextlib.contextmanager
def locked(task: Task, what: str = "write") -> Iterator[None]:
    """The task's lock across processes (blocking: enter it in a thread from async code): `write` is held for a
    read-change-write of the record (milliseconds), `build` for building its canaries (seconds; the build writes
    under `write` too)."""
    path = path_for(task)
    with file_lock(path.with_suffix(f".{what}.lock")):
        yield


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def update(task: Task, change: Callable[[dict[str, Any]], None]) -> None:
    """Read, change and write back the task's record, under its `write` lock. A store that cannot be written costs
    only the persistence: the in-memory caches still hold the value."""
    try:
        with locked(task):
            data = load(task) or {"version": VERSION, "instance_id": task.instance_id}
            change(data)
            _write(path_for(task), data)
    except OSError:
        pass
