"""Task catalog: named splits of validated tasks. `bundled` ships with the package; more come from loaders."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files
from pathlib import Path

from swe_gym_env.core.settings import setting
from swe_gym_env.tasks.loaders import LoadReport, load_tasks
from swe_gym_env.tasks.models import Task
from swe_gym_env.tasks.pypi_fixes.build import DataError, ensure_split, out_dir


def _bundled_dir() -> Path:
    """The bundled tasks (package data: tasks.jsonl and the git bundles it names), as a directory on disk: git
    clones the bundles by path, so a zipped install cannot serve them."""
    found = files("swe_gym_env.tasks") / "bundled"
    if not isinstance(found, Path):
        raise RuntimeError(f"swe_gym_env must be installed unzipped: the bundled tasks are git bundles ({found})")
    return found


BUNDLED_DIR = _bundled_dir()


class TaskNotFound(LookupError):
    pass


@lru_cache(maxsize=1)
def bundled_tasks() -> tuple[Task, ...]:
    report = load_tasks(str(BUNDLED_DIR / "tasks.jsonl"), kind="swe-gym")
    if report.skipped:  # a bundled row must be valid: say which one is not
        raise ValueError("bundled tasks.jsonl: " + "; ".join(report.skipped))
    # Bundled repos run in the local sandbox with the host's Python: no conda, no image.
    return tuple(
        t.model_copy(update={"image": None, "env_activation": None, "dataset": "bundled"}) for t in report.tasks
    )


PYPI_SPLIT = "pypi"  # real bug fixes from PyPI sdists, built at setup (swe_gym_env.tasks.pypi_fixes.build)


def pypi_jsonl() -> Path:
    return out_dir() / "tasks.jsonl"


@lru_cache(maxsize=4)
def _pypi_tasks(jsonl: str, mtime: float) -> tuple[Task, ...]:
    report = load_tasks(jsonl, kind="swe-rebench")
    if report.skipped:
        raise ValueError(f"{jsonl}: " + "; ".join(report.skipped))
    return tuple(t.model_copy(update={"dataset": PYPI_SPLIT}) for t in report.tasks)


def unbuilt(split: str) -> bool:
    """A split this package builds itself (`pypi`) that is not built yet on this host."""
    return split == PYPI_SPLIT and PYPI_SPLIT not in extra_sources() and not pypi_jsonl().is_file()


def build_split(split: str, log=print) -> None:
    """Build a split `unbuilt` names (blocking: run it in a thread). Raises TaskNotFound saying why it failed."""
    try:
        ensure_split(log)
    except (DataError, OSError) as e:
        raise TaskNotFound(
            f"split {split!r} could not be built on first use: {e}; run `swe-gym-env setup --all` on the server"
        ) from e


def pypi_tasks() -> tuple[Task, ...]:
    path = pypi_jsonl()
    if not path.is_file():
        raise TaskNotFound(
            f"split {PYPI_SPLIT!r} is not built: run `swe-gym-env setup --all` (or `python -m "
            "swe_gym_env.tasks.pypi_fixes.build`); a server builds it on a rollout's first use"
        )
    return _pypi_tasks(str(path), path.stat().st_mtime)


@lru_cache(maxsize=32)
def dataset_split(source: str, split: str = "train") -> LoadReport:
    return load_tasks(source, split)


def extra_sources() -> dict[str, tuple[str, str]]:
    """SWE_GYM_DATASETS="name=SOURCE[@split],…" registers more splits (local files or Hub ids)."""
    out: dict[str, tuple[str, str]] = {}
    for item in filter(None, (s.strip() for s in setting("datasets").split(","))):
        name, _, spec = item.partition("=")
        source, _, split = spec.partition("@")
        out[name.strip()] = (source.strip(), split.strip() or "train")
    return out


def split_names() -> list[str]:
    """Known splits: `pypi` once it is built, then those SWE_GYM_DATASETS registers."""
    return ["bundled", *([PYPI_SPLIT] if pypi_jsonl().is_file() else []), *extra_sources()]


def tasks_in(split: str) -> tuple[Task, ...]:
    if split == "bundled":
        return bundled_tasks()
    if split == PYPI_SPLIT and PYPI_SPLIT not in extra_sources():
        return pypi_tasks()
    sources = extra_sources()
    if split not in sources:
        raise TaskNotFound(f"unknown split {split!r}; known: {split_names()}")
    return tuple(dataset_split(*sources[split]).tasks)


def get_task(split: str = "bundled", index: int | None = None, instance_id: str | None = None) -> Task:
    tasks = tasks_in(split)
    if instance_id is not None:
        for t in tasks:
            if t.instance_id == instance_id:
                return t
        raise TaskNotFound(f"no task {instance_id!r} in split {split!r}")
    i = index or 0
    if not 0 <= i < len(tasks):
        raise TaskNotFound(f"index {i} out of range for split {split!r} ({len(tasks)} tasks)")
    return tasks[i]


def find_by_problem_statement(text: str) -> Task | None:
    """The task whose problem statement appears in ``text`` (used by the built-in engine's oracle policy)."""
    for split in split_names():
        for t in tasks_in(split):
            if t.problem_statement.strip() and t.problem_statement.strip() in text:
                return t
    return None
