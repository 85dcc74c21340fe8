"""Run times and empty-patch baselines per task, image and sandbox kind: the test timeout a run gets.

Measured by every complete run (gold, empty, model) and by `validate`; kept in memory and in the task's record on
disk (`store`), so a fresh server knows them. With no measurement, grading runs the empty patch first (once per task,
image and kind, however many rollouts wait for it) and sizes the model run's timeout from it."""

from __future__ import annotations

import asyncio

import swe_gym_env.server.grading.store as store
from swe_gym_env.core.settings import setting
from swe_gym_env.tasks.models import Task

# None: the settings' SWE_GYM_GRADING_TIMEOUT_FLOOR_S / _MULTIPLE (120 s, 5), read when a timeout is sized; tests may
# set a number here
TIMEOUT_FLOOR_S: float | None = None
TIMEOUT_MULTIPLE: float | None = None
_RUNTIMES: dict[tuple, float] = {}  # (task, image, sandbox kind) -> the shortest complete test run seen, seconds
_BASELINES: dict[tuple, str | None] = {}  # (task, image, kind) -> why the empty patch's run broke (None: it did not)
_BASELINE_LOCKS: dict[tuple, asyncio.Lock] = {}  # one empty-patch run per task at a time, however many broke
_CACHE_MAX = 4096


def _where(task: Task, cache_key: str) -> str:
    return f"{task.image or task.repo_source or ''}|{cache_key}"


def _task_key(task: Task, cache_key: str) -> tuple:
    """Also keyed by the store's directory: what memory holds stands for that store's record only."""
    return (str(store.store_dir()), store.task_digest(task), task.image or task.repo_source or "", cache_key)


def _remember(cache: dict, key: tuple, value) -> None:
    if len(cache) >= _CACHE_MAX:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _from_disk(task: Task, cache_key: str) -> None:
    """Fill the memory caches from the task's record on disk (a fresh server's first look)."""
    key = _task_key(task, cache_key)
    data = store.load(task)
    where = _where(task, cache_key)
    seen = data.get("runtimes", {}).get(where)
    if isinstance(seen, int | float) and seen > 0 and key not in _RUNTIMES:
        _remember(_RUNTIMES, key, float(seen))
    baselines = data.get("baselines", {})
    if where in baselines and key not in _BASELINES and (baselines[where] is None or isinstance(baselines[where], str)):
        _remember(_BASELINES, key, baselines[where])


def runtime(task: Task, cache_key: str = "") -> float | None:
    """The shortest complete test run of this task seen here or on disk (None: never measured)."""
    key = _task_key(task, cache_key)
    if key not in _RUNTIMES:
        _from_disk(task, cache_key)
    return _RUNTIMES.get(key)


def baseline(task: Task, cache_key: str = "") -> tuple[bool, str | None]:
    """(known, why the empty patch's run broke): why is None when it reports results."""
    key = _task_key(task, cache_key)
    if key not in _BASELINES:
        _from_disk(task, cache_key)
    return (key in _BASELINES, _BASELINES.get(key))


def record_runtime(task: Task, cache_key: str, seconds: float) -> None:
    key = _task_key(task, cache_key)
    old = _RUNTIMES.get(key)
    if old is not None and old <= seconds:
        return  # nothing new to keep (and no write)
    best = seconds
    _remember(_RUNTIMES, key, best)
    where = _where(task, cache_key)

    def change(data: dict) -> None:
        runtimes = data.setdefault("runtimes", {})
        old = runtimes.get(where)
        runtimes[where] = min(best, old) if isinstance(old, int | float) and old > 0 else best

    store.update(task, change)


def record_baseline(task: Task, cache_key: str, why: str | None) -> None:
    key = _task_key(task, cache_key)
    if key in _BASELINES and _BASELINES[key] == why:
        return
    _remember(_BASELINES, key, why)
    where = _where(task, cache_key)
    store.update(task, lambda data: data.setdefault("baselines", {}).__setitem__(where, why))


def measured_timeout(seen: float) -> float:
    """The timeout a run of a task whose complete run takes ``seen`` seconds gets: the multiple, at least the floor."""
    floor = TIMEOUT_FLOOR_S if TIMEOUT_FLOOR_S is not None else setting("grading_timeout_floor_s")
    multiple = TIMEOUT_MULTIPLE if TIMEOUT_MULTIPLE is not None else setting("grading_timeout_multiple")
    return max(floor, multiple * seen)


def test_timeout(task: Task, timeout_s: float, cache_key: str = "") -> float:
    """The task's own measured run time times the multiple (at least the floor), never above ``timeout_s``."""
    seen = runtime(task, cache_key)
    if seen is None:
        return timeout_s
    return min(timeout_s, measured_timeout(seen))
