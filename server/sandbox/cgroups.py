"""CPU / memory / pid limits for `local` sandboxes through cgroups (v1 or v2), where the host lets us write them.

Each sandbox gets `swe-gym/<name>` under each controller; `<name>` carries the server pid (as the sandbox dir does),
so a restarted server removes what a killed one left. A cgroup also gives a sure way to kill a whole tree.
Where cgroups are not writable (unprivileged, read-only mount), `CgroupSet.create` returns None and the sandbox runs
without these limits (preflight says so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from swe_gym_env.server.sandbox.base import Limits

ROOT = Path("/sys/fs/cgroup")
GROUP = "swe-gym"
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _share_parent(parent: Path) -> None:
    """Weigh the sandboxes' parent group as one process per sandbox in it. Without this all sandboxes together get
    the CPU share of one process against everything outside the group (the server, other work on the host): 8
    rollouts' grading runs took 4x longer than their CPU need on a loaded 2-core host (issue 19, bench rollouts)."""
    with contextlib.suppress(OSError):  # best effort: the limits hold either way
        n = max(1, sum(1 for d in parent.iterdir() if d.is_dir()))
        if (parent / "cpu.shares").exists():  # v1: 1024 per process at nice 0
            _write(parent / "cpu.shares", str(1024 * n))
        elif (parent / "cpu.weight").exists():  # v2: 100 per group by default, at most 10000
            _write(parent / "cpu.weight", str(min(10000, 100 * n)))


def mode() -> str | None:
    """'v1', 'v2' or None (not usable)."""
    if (ROOT / "cgroup.controllers").is_file():
        ok = os.access(ROOT, os.W_OK) and {"memory", "pids"} <= set((ROOT / "cgroup.controllers").read_text().split())
        return "v2" if ok else None
    if all(os.access(ROOT / c, os.W_OK) for c in V1_CONTROLLERS):
        return "v1"
    return None


class CgroupSet:
    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(cls, name: str, limits: Limits) -> CgroupSet | None:
        kind = mode()
        try:
            if kind == "v1":
                dirs = []
                for c in V1_CONTROLLERS:
                    d = ROOT / c / GROUP / name
                    d.mkdir(parents=True, exist_ok=True)
                    dirs.append(d)
                mem, pids, cpu = dirs
                _write(mem / "memory.limit_in_bytes", str(limits.memory_mb * 1024 * 1024))
                _write(pids / "pids.max", str(limits.pids))
                _write(cpu / "cpu.cfs_period_us", "100000")
                _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * 100000)))
                _share_parent(cpu.parent)
                return cls(dirs)
            if kind == "v2":
                parent = ROOT / GROUP
                parent.mkdir(exist_ok=True)
                for ctl in ("+memory", "+pids", "+cpu"):
                    for level in (ROOT, parent):
                        try:
                            _write(level / "cgroup.subtree_control", ctl)
                        except OSError:
                            pass
                d = parent / name
                d.mkdir(exist_ok=True)
                _write(d / "memory.max", str(limits.memory_mb * 1024 * 1024))
                _write(d / "pids.max", str(limits.pids))
                if (d / "cpu.max").exists():
                    _write(d / "cpu.max", f"{int(limits.cpus * 100000)} 100000")
                _share_parent(parent)
                return cls([d])
        except OSError:
            return None
        return None

    def pids(self) -> set[int]:
        found: set[int] = set()
        for f in self.procs_files:
            try:
                found |= {int(p) for p in Path(f).read_text().split()}
            except (OSError, ValueError):
                continue
        return found

    def kill_all(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            _share_parent(d.parent)


def reap_orphans(prefix: str) -> list[str]:
    """Remove (killing what runs in them) cgroups `swe-gym/<prefix><pid>-…` of server pids that are gone."""
    removed = []
    kind = mode()
    parents = [ROOT / c / GROUP for c in V1_CONTROLLERS] if kind == "v1" else [ROOT / GROUP] if kind == "v2" else []
    for parent in parents:
        if not parent.is_dir():
            continue
        for d in parent.glob(f"{prefix}*-*"):
            pid = d.name[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                CgroupSet([d]).remove()
                removed.append(str(d))
    return removed
