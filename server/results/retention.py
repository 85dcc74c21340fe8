"""Retention: the results store and the capture store never fill the disk.

A pass deletes stored results and ended capture sessions, oldest first, while one of these holds:
- older than ``max_age_s`` (``SWE_GYM_RETENTION_MAX_AGE_H``, default 168 h: a week);
- the store over its byte budget (``SWE_GYM_RETENTION_RESULTS_BYTES`` / ``SWE_GYM_RETENTION_CAPTURE_BYTES``,
  default 10G each);
- the data disk's free space under ``SWE_GYM_RETENTION_MIN_FREE_BYTES`` (default 2G) — whatever else fills it.
Never a rollout in flight (nor its capture session: open sessions are never deleted), and never anything that ended
less than ``SWE_GYM_RETENTION_GRACE_S`` ago (default 3600: a client that lost its connection fetches its result by id
well within that). ``0`` turns an age or byte limit off. Sizes take a K/M/G/T suffix (powers of 1024).

Why these defaults: a free Space has about 50 GB of ephemeral disk, shared with the image's task environments,
harness installs and model files; the two stores get 20 GB together, and the free-space floor keeps the rest
usable. A compact 80-call result is a few MB and its capture session about as much (prompts stored as their new
tokens only), so 10 GB holds thousands of long rollouts: more than a week of a trainer's traffic at one Space's
concurrency. The capture store gives deleted pages back to the file system (``PRAGMA incremental_vacuum``).

A pass runs every ``SWE_GYM_RETENTION_INTERVAL_S`` (default 600) and after each finished rollout (coalesced; cheap when
nothing is over a limit: one index query, one stat, one statvfs).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swe_gym_env.core.settings import setting

if TYPE_CHECKING:
    from swe_gym_env.server.capture.store import CaptureStore
    from swe_gym_env.server.results.store import ResultsStore

GiB = 1024**3
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": GiB, "T": 1024**4}


def parse_bytes(raw: str) -> int:
    """``"10G"`` → 10 GiB; ``"512M"``, ``"1024"``, ``"1.5G"`` likewise."""
    s = raw.strip().upper().removesuffix("B").removesuffix("I")
    unit = s[-1] if s and s[-1] in _UNITS else ""
    value = float(s[: len(s) - len(unit)] if unit else s)
    if value < 0:
        raise ValueError(f"negative size {raw!r}")
    return int(value * _UNITS[unit])


@dataclass(frozen=True)
class RetentionSettings:
    max_age_s: float = 7 * 24 * 3600.0
    results_max_bytes: int = 10 * GiB
    capture_max_bytes: int = 10 * GiB
    min_free_bytes: int = 2 * GiB
    grace_s: float = 3600.0
    interval_s: float = 600.0

    @classmethod
    def from_env(cls) -> RetentionSettings:
        s = setting  # SWE_GYM_RETENTION_* (swe_gym_env/core/settings.py); a bad value names its variable
        return cls(
            max_age_s=s("retention_max_age_h") * 3600,
            results_max_bytes=s("retention_results_bytes"),
            capture_max_bytes=s("retention_capture_bytes"),
            min_free_bytes=s("retention_min_free_bytes"),
            grace_s=s("retention_grace_s"),
            interval_s=max(1.0, s("retention_interval_s")),
        )


class Retention:
    """Runs passes over the two stores; ``busy()`` names the rollouts in flight (never touched)."""

    def __init__(
        self,
        settings: RetentionSettings,
        results: ResultsStore | None,
        capture: CaptureStore | None,
        busy: Callable[[], set[str]] = set,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.results = results
        self.capture = capture
        self.busy = busy
        self.clock = clock
        self.last: dict[str, Any] | None = None  # the last pass's figures
        self.incremental: bool | None = None  # the capture store gives pages back (after `prepare`)
        self._task: asyncio.Task | None = None
        self._again = False

    # -- figures --------------------------------------------------------------------------------------------------
    def _root(self) -> Path | None:
        if self.results is not None:
            return self.results.root
        return self.capture.path.parent if self.capture is not None else None

    def free_bytes(self) -> int | None:
        root = self._root()
        return shutil.disk_usage(root).free if root is not None else None

    def usage(self) -> dict[str, Any]:
        """For /health: what each store holds, the limits, and the data disk (no paths)."""
        s = self.settings
        out: dict[str, Any] = {
            "max_age_h": round(s.max_age_s / 3600, 3),
            "grace_s": s.grace_s,
            "interval_s": s.interval_s,
            "min_free_bytes": s.min_free_bytes,
        }
        if (root := self._root()) is not None:
            du = shutil.disk_usage(root)
            out["disk"] = {"total_bytes": du.total, "free_bytes": du.free}
        if self.results is not None:
            n, total = self.results.usage()
            cached, cached_bytes = self.results.cache_usage()
            out["results"] = {
                "count": n,
                "bytes": total,
                "max_bytes": s.results_max_bytes,
                "cached": cached,
                "cached_bytes": cached_bytes,
            }
        if self.capture is not None:
            out["capture"] = {
                "bytes": self.capture.disk_bytes(),
                "max_bytes": s.capture_max_bytes,
                "incremental_vacuum": self.incremental,
            }
        out["last_pass"] = self.last
        return out

    # -- a pass ---------------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """At startup: the capture store in incremental-vacuum mode (a one-off VACUUM of a small older store)."""
        if self.capture is not None:
            try:
                self.incremental = self.capture.ensure_incremental_vacuum()
            except Exception as e:  # e.g. no room for the VACUUM's copy: free pages are still reused
                self.incremental = False
                print(f"swe-gym-env retention: capture store stays as it is ({type(e).__name__}: {e})", file=sys.stderr)

    def _low_on_disk(self, freed_pending: int = 0) -> bool:
        floor = self.settings.min_free_bytes
        free = self.free_bytes()
        return bool(floor) and free is not None and free + freed_pending < floor

    def run_pass(self, reconcile: bool = False) -> dict[str, Any]:
        """One pass (blocking: run it in a thread). Returns (and keeps in ``last``) what it deleted."""
        s, now, t0 = self.settings, self.clock(), time.monotonic()
        busy = self.busy()
        settled = now - s.grace_s  # anything that ended after this is kept whatever the limits
        too_old = now - s.max_age_s if s.max_age_s > 0 else float("-inf")
        out: dict[str, Any] = {"at": round(now, 3), "results_deleted": 0, "results_freed_bytes": 0}
        out.update(sessions_deleted=0, capture_freed_bytes=0)
        if self.results is not None:
            if reconcile:
                out["reconciled"] = self.results.reconcile()
            _, total = self.results.usage()
            for rid, finished, size in self.results.oldest():
                if finished > settled:
                    break
                over = s.results_max_bytes > 0 and total > s.results_max_bytes
                if not (finished < too_old or over or self._low_on_disk()):
                    break
                if rid in busy:
                    continue
                freed = self.results.delete(rid)
                total -= size
                out["results_deleted"] += 1
                out["results_freed_bytes"] += freed
        if self.capture is not None:
            self._capture_pass(out, busy, settled, too_old)
        out["seconds"] = round(time.monotonic() - t0, 3)
        self.last = out
        return out

    def _capture_pass(self, out: dict[str, Any], busy: set[str], settled: float, too_old: float) -> None:
        assert self.capture is not None
        s = self.settings
        live = self.capture.live_bytes() if s.capture_max_bytes > 0 else 0
        deleted_since_reclaim = 0
        after: tuple[float, str] = (float("-inf"), "")
        done = False
        while not done:
            page = self.capture.ended_sessions(after)
            if not page:
                break
            for sid, ended in page:
                after = (ended, sid)
                over = s.capture_max_bytes > 0 and live > s.capture_max_bytes
                if ended > settled or not (ended < too_old or over or self._low_on_disk(deleted_since_reclaim)):
                    done = True
                    break
                if sid in busy:
                    continue
                freed = self.capture.delete_session(sid)
                live -= freed
                deleted_since_reclaim += freed
                out["sessions_deleted"] += 1
                if deleted_since_reclaim > 256 * 1024 * 1024:  # give pages back as we go when the disk is short
                    out["capture_freed_bytes"] += self.capture.reclaim()
                    deleted_since_reclaim = 0
        if out["sessions_deleted"]:
            out["capture_freed_bytes"] += self.capture.reclaim()

    # -- scheduling -----------------------------------------------------------------------------------------------
    def poke(self) -> None:
        """After a rollout finished: a pass soon (coalesced with one in progress), in a thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.create_task(self._passes(), name="retention-pass")

    async def _passes(self, reconcile: bool = False) -> None:
        while True:
            self._again = False
            try:
                await asyncio.to_thread(self.run_pass, reconcile)
            except Exception as e:  # a pass that fails is retried at the next poke or interval
                self.last = {"at": round(self.clock(), 3), "error": f"{type(e).__name__}: {e}"}
                print(f"swe-gym-env retention: pass failed: {type(e).__name__}: {e}", file=sys.stderr)
            if not self._again:
                return

    async def run_forever(self) -> None:
        """Every ``interval_s``: a pass that also reconciles the results index with the files."""
        while True:
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._passes(reconcile=True), name="retention-pass")
            await asyncio.shield(self._task)  # cancelled (shutdown): the pass finishes, `aclose` waits for it
            await asyncio.sleep(self.settings.interval_s)

    async def aclose(self) -> None:
        """Wait for a pass in progress (a thread cannot be cancelled; the stores close after it)."""
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
