"""What the grader trusts of a test run: the patch's paths and the record the launcher's collector chained.

Pure functions over text and bytes (no sandbox): `grading/__init__.py` puts them together. See its docstring for
the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import PurePosixPath

from swe_gym_env.server.grading.runtime_record import runtime_events as runtime_events
from swe_gym_env.server.grading.runtime_record import runtime_findings

RECORD_LIMIT = 16 * 1024 * 1024
PASSING = {"PASSED", "XFAIL"}


def guard_plugin_source() -> bytes:
    return resources.files("swe_gym_env.server.grading").joinpath("guard_plugin.py").read_bytes()


def guard_launch_source() -> bytes:
    return resources.files("swe_gym_env.server.grading").joinpath("guard_launch.py").read_bytes()


def section_paths(section: str) -> list[str]:
    """Every path one file section of a git diff names: old and new names of a rename or copy included."""
    paths: list[str] = []
    first = section.split("\n", 1)[0]
    if first.startswith("diff --git a/"):
        old, _, new = first[len("diff --git a/") :].partition(" b/")
        paths += [old, new]
    for line in section.splitlines():
        for prefix in ("--- a/", "+++ b/", "rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(prefix):
                paths.append(line[len(prefix) :].rstrip("\t"))
        if line.startswith("@@"):
            break
    return list(dict.fromkeys(p for p in paths if p))


def is_symlink_section(section: str) -> bool:
    head = section.split("\n@@", 1)[0]
    return bool(re.search(r"(?m)^(new file mode|new mode|old mode|deleted file mode|index \S+) ?120000\b", head))


def verdict_files(test_files: list[str], test_ids: list[str]) -> list[str]:
    """Files that decide the verdict: the test patch's files and every file a FAIL_TO_PASS / PASS_TO_PASS pytest id
    names (``path.py::...``); reset to base_commit before the test patch goes on."""
    files = list(test_files)
    for t in test_ids:
        path = t.split("::", 1)[0]
        if "::" in t and path.endswith(".py") and not path.startswith("/") and ".." not in PurePosixPath(path).parts:
            files.append(path)
    return list(dict.fromkeys(files))


# -- the guard's record ------------------------------------------------------------------------------------------
@dataclass
class Record:
    """The guard's verified lines. ``problems``: tampering for certain; the rest is evidence to compare."""

    started: bool = False
    ended: bool = False
    problems: list[str] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)
    logs: list[dict] = field(default_factory=list)
    hooks: list[list] = field(default_factory=list)
    pytest_version: str = ""
    junit_sha256: str = ""  # the JUnit report as pytest left it ('' when none was written)
    runtime: list[dict] = field(default_factory=list)  # the runtime record's events (`runtime_record`)
    audit_hook: bool | None = None  # the guard's audit hook ran (False: Python < 3.8; None: an older guard)
    guard_ended: bool = False  # the guard's `end` line (pytest reached its own end)
    exit_code: int | None = None  # the test process's exit status, as the collector saw it


def read_record(data: bytes, key: bytes) -> Record:
    """Verify the collector's chain (`guard_launch.py`): every line numbered in order and MACed, over the previous
    line's MAC, with a key the test process never held. The first line that does not verify ends what is trusted.
    Inside the chain, the guard's own lines (its pid, its numbering) are checked too: a line that is not the guard's
    (something else in the test process writing to the pipe) or a test phase recorded twice is tampering."""
    chain = _Chain(key)
    for n, raw in enumerate(data.splitlines()):
        if not chain.read(n, raw):
            break
    return chain.finish()


class _BadLine(Exception):
    """A record line that does not verify: what is trusted ends before it."""


def _unchain(raw: bytes, n: int, key: bytes, prev: str) -> tuple[str, str]:
    """Line ``n``'s payload and MAC, verified over the previous line's MAC (`_BadLine` where it does not verify)."""
    try:
        outer = json.loads(raw)
        payload, mac, seq = outer["p"], str(outer["mac"]), outer["n"]
        if not isinstance(payload, str) or seq != n:
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise _BadLine(f"the outcome record has a line the collector did not write (line {n + 1})") from None
    want = hmac.new(key, (prev + str(n) + "\n" + payload).encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, mac):
        raise _BadLine(f"the outcome record was altered (bad MAC at line {n + 1})")
    return payload, mac


def _payload_body(payload: str) -> dict | None:
    """A verified line's payload as the guard writes it: a JSON object (None: anything else)."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


@dataclass
class _Chain:
    """`read_record` under way: the record so far, the chain's last MAC and the guard's own numbering."""

    key: bytes
    rec: Record = field(default_factory=Record)
    prev: str = ""  # the last verified line's MAC
    guard_pid: int | None = None
    guard_seq: int = 0
    collector: bool = False  # the record starts with the collector's line
    exited: bool = False  # the collector's `exit` line (the test process's end) was read
    phases: dict[tuple[str, str], int] = field(default_factory=dict)  # (test id, phase) -> outcomes recorded

    def read(self, n: int, raw: bytes) -> bool:
        """Line ``n`` of the record into it; False where what is trusted ends with this line."""
        rec = self.rec
        try:
            payload, self.prev = _unchain(raw, n, self.key, self.prev)
        except _BadLine as e:
            rec.problems.append(str(e))
            return False
        body = _payload_body(payload)
        kind = body.get("k") if body is not None else None
        if body is None:
            rec.problems.append(f"the test process wrote a record line that is not the guard's (line {n + 1})")
        elif n == 0:
            self.collector = kind == "collector"
            if not self.collector:
                rec.problems.append("the outcome record does not start with the collector's line")
        elif kind == "exit":
            self.exited = True
            rec.exit_code = body.get("rc") if isinstance(body.get("rc"), int) else None
            return False
        elif kind in ("overlong", "overflow"):
            rec.problems.append(f"the test process wrote {'an overlong line' if kind == 'overlong' else 'too much'}")
        elif kind == "collector":
            rec.problems.append("a second collector line in the record")
        elif self._numbered(body, kind):
            self._take(body, kind)
        else:
            rec.problems.append(f"the test process wrote a record line that is not the guard's (line {n + 1})")
        return True

    def _numbered(self, body: dict, kind: object) -> bool:
        """Whether a line is the guard's next one (its pid, its numbering); counted where it is."""
        pid = body.get("pid")
        if self.guard_pid is None and kind == "start":
            self.guard_pid = pid if isinstance(pid, int) else None
        if pid != self.guard_pid or body.get("seq") != self.guard_seq:
            return False
        self.guard_seq += 1
        return True

    def _take(self, body: dict, kind: object) -> None:
        """One of the guard's own lines into the record."""
        rec = self.rec
        if kind == "start":
            rec.started = True
            rec.pytest_version = str(body.get("pytest", ""))
            if "audit" in body:
                rec.audit_hook = bool(body["audit"])
        elif kind == "rt":
            rec.runtime.append(body)
        elif kind == "problem":
            rec.problems.append(str(body.get("what", "")))
        elif kind == "call":
            phase = (str(body.get("id")), str(body.get("when")))
            self.phases[phase] = self.phases.get(phase, 0) + 1
            rec.calls.append(body)
        elif kind == "log":
            rec.logs.append(body)
        elif kind == "audit":
            rec.problems += [str(p) for p in body.get("problems", [])]
            rec.hooks += [h for h in body.get("hooks", []) if isinstance(h, list) and len(h) == 3]
        elif kind == "end":
            rec.guard_ended = True
            rec.junit_sha256 = str(body.get("junit") or "")

    def finish(self) -> Record:
        """The record, once every trusted line is in: whether it ended, and the test phases recorded twice."""
        rec = self.rec
        rec.ended = rec.started and rec.guard_ended and self.collector and self.exited
        # one outcome per test phase; a test with subtests reports its call phase once per subtest (pytest's own doing)
        with_subtests = {str(line.get("id")) for line in rec.logs if line.get("sub")}
        for (tid, when), count in self.phases.items():
            if count > 1 and not (when == "call" and tid in with_subtests):
                rec.problems.append(f"the record has {count} outcomes for {tid} ({when})")
        return rec


def guard_statuses(rec: Record) -> tuple[dict[str, str], set[str]]:
    """Per node id, the outcome the reporters were given (FAILED if any phase or subtest failed), and the ids with a
    failed subtest."""
    status: dict[str, str] = {}
    subfailed: set[str] = set()
    for line in rec.logs:
        tid, when, out = str(line.get("id")), line.get("when"), line.get("out")
        if out == "failed":
            status[tid] = "FAILED" if when == "call" or line.get("sub") else "ERROR"
            if line.get("sub"):
                subfailed.add(tid)
        elif status.get(tid) in ("FAILED", "ERROR"):
            continue
        elif when == "call":
            if out == "skipped":
                status[tid] = "XFAIL" if line.get("xf") else "SKIPPED"
            elif out == "passed" and not line.get("sub"):
                status[tid] = "PASSED"
        elif when == "setup" and out == "skipped":
            status[tid] = "SKIPPED"
    return status, subfailed


def subtest_failures(log: str, ids: list[str]) -> set[str]:
    """Listed ids with a ``SUBFAILED`` line in pytest's log (pytest >= 9 logs the test itself PASSED)."""
    found = set()
    for line in log.splitlines():
        if line.startswith("SUBFAILED"):
            for t in ids:
                if line.endswith(" " + t) or f" {t} - " in line:
                    found.add(t)
    return found


def tampering(
    rec: Record,
    touched: set[str],
    trusted_files: set[str],
    listed: list[str],
    log: str,
    junit_bytes: bytes | None,
    own: dict[str, str] | None,
    logged: dict[str, str] | None,
    junit: dict[str, str] | None,
    subfailed: set[str] = frozenset(),  # type: ignore[assignment]
    *,
    allowed_events: frozenset[str] = frozenset(),
) -> list[str]:
    """What the record shows the code under test did to the run (empty: nothing seen).

    ``touched``: files the model patch added or changed; ``trusted_files``: the verdict's test files (reset to
    base_commit); per listed id, where the parser keeps pytest's ids (else None): ``own`` the record's status,
    ``logged`` swebench's from the log (None when it found nothing), ``junit`` the JUnit report's.
    ``allowed_events``: `runtime_events` keys the gold patch's run also showed (not tampering)."""
    seen = list(rec.problems)
    seen += runtime_findings(rec, touched, trusted_files, allowed_events)
    for c in rec.calls:
        raw, out, tid = str(c.get("raw", "")), c.get("out"), c.get("id")
        if raw.startswith("exc:") and out == "passed":
            seen.append(f"the report of {tid} ({c.get('when')}) says passed where the test raised {raw[4:]}")
        origin = str(c.get("origin") or "")
        if raw in ("skip", "xfail") and origin and not origin.startswith("/") and _is_listed(str(tid), listed):
            if PurePosixPath(origin).name != "conftest.py" and origin not in trusted_files:
                seen.append(f"{tid} was made to {raw} from {origin}, not from a test file")
    for hook, path, new in rec.hooks:
        what = "an import hook (sys.meta_path)" if hook == "sys.meta_path" else f"hook {hook}"
        if new:
            seen.append(f"{what} implemented from {path}, a file written during the test run")
        elif path in touched:
            seen.append(f"{what} implemented from {path}, a file the patch added or changed")
    if junit_bytes is not None and rec.junit_sha256 and hashlib.sha256(junit_bytes).hexdigest() != rec.junit_sha256:
        seen.append("the JUnit report was rewritten after pytest wrote it")
    if own is not None:
        listed = [t for t in listed if t not in subfailed]  # logged PASSED by pytest itself, failed in fact
        forged = [t for t in listed if own.get(t) not in PASSING and _logged_passing(log, t)]
        if forged:
            seen.append(f"the log prints PASSED for {forged[:5]}; the run's own record says otherwise")
        for t in listed:
            mine = own.get(t) or "not run"
            if logged is not None and logged.get(t) in PASSING and mine not in PASSING:
                seen.append(f"the log reports {t} {logged[t]}; the run's own record says {mine}")
            if junit is not None and junit.get(t) in PASSING and mine not in PASSING:
                seen.append(f"the JUnit report passes {t}; the run's own record says {mine}")
    return list(dict.fromkeys(seen))


def _logged_passing(log: str, test_id: str) -> bool:
    """A pytest status line (``PASSED <id>`` / ``XFAIL <id>``, either order) for the id anywhere in the log."""
    for status in PASSING:
        for form in (f"{status} {test_id}", f"{test_id} {status}"):
            i = log.find(form)
            while i != -1:
                before = log[i - 1] if i else "\n"
                after = log[i + len(form) : i + len(form) + 3]
                if before == "\n" and (after[:1] in ("", "\n", "\r") or after == " - "):
                    return True
                i = log.find(form, i + 1)
    return False


def _is_listed(node_id: str, listed: list[str]) -> bool:
    return any(t == node_id or t.endswith("/" + node_id) for t in listed)
