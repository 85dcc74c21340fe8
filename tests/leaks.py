"""What a server process holds, before vs after a rollout: child processes, sandbox and temp dirs, cgroups, capture
sessions, rollouts in flight and open sockets. Checked, not assumed: `assert_no_leaks` snapshots, waits a little
for things that close on their own (keep-alive connections, processes being reaped), then names what grew.

Everything is keyed by the server's pid (sandbox dirs and cgroups carry it in their names), because other servers
may run on this machine at the same time.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CGROUP_ROOT = Path("/sys/fs/cgroup")
OWNED_PREFIXES = ("swe-gym-sbx-", "swe-gym-ll-", "swe-gym-capture-")  # core/tempdirs.py: `<prefix><pid>-…`


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid`` (walking the ppid tree in /proc) → their command lines."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _read(f"/proc/{entry.name}/stat")
        if not stat:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 2 or fields[0] == "Z":  # zombies hold nothing but a pid
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop()
        cmd = _read(f"/proc/{p}/cmdline").replace("\0", " ").strip()
        if cmd:
            out[p] = cmd[:300]
        todo += children.get(p, [])
    return out


def processes_mentioning(text: str) -> dict[int, str]:
    """Any live process whose command line contains ``text`` (e.g. the sandbox dirs of a killed server, whose
    children were re-parented away from it)."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmd = _read(f"/proc/{entry.name}/cmdline").replace("\0", " ")
            if text in cmd and " Z " not in _read(f"/proc/{entry.name}/stat"):
                out[int(entry.name)] = cmd.strip()[:300]
    return out


def socket_fds(pid: int) -> set[str]:
    """The socket inodes a process holds open ("socket:[123]")."""
    out = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:"):
                out.add(target)
    except OSError:
        pass
    return out


def owned_temp(pid: int) -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {str(p) for prefix in OWNED_PREFIXES for p in tmp.glob(f"{prefix}{pid}-*")}


def owned_cgroups(pid: int) -> set[str]:
    if not CGROUP_ROOT.is_dir():
        return set()
    found = set()
    for pattern in (
        f"{depth}{prefix}{pid}-*" for prefix in ("swe-gym-sbx-", "swe-gym-ll-") for depth in ("", "*/", "*/*/")
    ):
        found |= {str(p) for p in CGROUP_ROOT.glob(pattern)}
    return found


@dataclass
class Snapshot:
    pid: int
    children: dict[int, str] = field(default_factory=dict)
    temp: set[str] = field(default_factory=set)
    cgroups: set[str] = field(default_factory=set)
    sockets: set[str] = field(default_factory=set)
    capture_sessions: int = 0
    rollouts_in_flight: int = 0

    @classmethod
    def take(cls, pid: int, health_url: str | None = None) -> Snapshot:
        s = cls(pid, descendants(pid), owned_temp(pid), owned_cgroups(pid), socket_fds(pid))
        if health_url is not None:
            h = httpx.get(health_url, timeout=10).json()
            s.capture_sessions, s.rollouts_in_flight = h["capture_sessions"], h["rollouts_in_flight"]
        return s

    def grown(self, before: Snapshot) -> list[str]:
        """What this snapshot holds beyond ``before`` (empty: nothing leaked)."""
        problems = []
        new_children = {p: c for p, c in self.children.items() if c not in before.children.values()}
        if new_children:
            problems.append(f"child processes: {new_children}")
        if self.temp - before.temp:
            problems.append(f"temp dirs: {sorted(self.temp - before.temp)}")
        if self.cgroups - before.cgroups:
            problems.append(f"cgroups: {sorted(self.cgroups - before.cgroups)}")
        if len(self.sockets) > len(before.sockets):
            problems.append(f"open sockets: {len(before.sockets)} -> {len(self.sockets)}")
        if self.capture_sessions > before.capture_sessions:
            problems.append(f"open capture sessions: {before.capture_sessions} -> {self.capture_sessions}")
        if self.rollouts_in_flight > before.rollouts_in_flight:
            problems.append(f"rollouts in flight: {before.rollouts_in_flight} -> {self.rollouts_in_flight}")
        return problems


def wait_no_leaks(before: Snapshot, health_url: str | None = None, settle_s: float = 30.0) -> list[str]:
    """Poll until nothing grew beyond ``before`` (keep-alive sockets idle out after ~15 s) or ``settle_s`` passed;
    returns what is still leaked."""
    deadline = time.monotonic() + settle_s
    while True:
        problems = Snapshot.take(before.pid, health_url).grown(before)
        if not problems or time.monotonic() >= deadline:
            return problems
        time.sleep(0.5)


def assert_no_leaks(before: Snapshot, health_url: str | None = None, settle_s: float = 30.0) -> None:
    problems = wait_no_leaks(before, health_url, settle_s)
    assert not problems, f"server {before.pid} leaked after {settle_s:.0f}s: " + "; ".join(problems)
