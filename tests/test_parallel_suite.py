"""The suite's own parallel machinery (tests/conftest.py, tests/helpers.py): a port another test took fails loudly
and names it; under pytest-xdist a `once_per_run` thing is made once for every worker, an `alone` test runs with no
other test beside it, and the budget names the worker count and the time per test file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import longest_first

from swe_gym_env.core import procs

from helpers import check_listener, listener_pids

TESTS = Path(__file__).resolve().parent
SERVE_200 = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_a_port_taken_by_another_server_fails_loudly_naming_it():
    port = procs.free_port()
    squatter = subprocess.Popen([sys.executable, "-c", SERVE_200, str(port)])
    late = None
    try:
        procs.wait_healthy(f"http://127.0.0.1:{port}/health", squatter, 60)
        assert listener_pids(port) == {squatter.pid}
        check_listener(squatter, port)  # its own port: fine
        late = subprocess.Popen([sys.executable, "-c", SERVE_200, str(port)], stderr=subprocess.DEVNULL)
        assert procs.healthy(f"http://127.0.0.1:{port}/health")  # a health check alone would pass
        with pytest.raises(RuntimeError, match=rf"port collision: port {port} is held by pid {squatter.pid} \("):
            check_listener(late, port)
        assert late.poll() is not None  # stopped
    finally:
        for p in (squatter, late):
            if p is not None:
                procs.stop(p)


INNER_PLUGIN = """
import json, os, time
from pathlib import Path
import pytest
from conftest import once_per_run

def note(**kw):
    with Path(os.environ["H1_LOG"]).open("a") as f:
        f.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "t": time.time(), **kw}) + "\\n")

def make():
    note(made=1)
    time.sleep(1)
    return {"built": os.environ.get("PYTEST_XDIST_WORKER")}

@pytest.fixture(scope="session")  # here, not in the test module: a module's own fixture would group its tests
def thing(tmp_path_factory):
    return once_per_run(tmp_path_factory, "thing", make)
"""

RUN_TESTS = """
import time
import pytest
from inner_plugin import note

@pytest.mark.parametrize("i", range(8))
def test_busy(i, thing):
    note(test=f"busy{i}", start=time.time()); time.sleep(0.5); note(test=f"busy{i}", end=time.time(), got=thing)

@pytest.mark.alone
def test_alone(thing):
    note(test="alone", start=time.time()); time.sleep(1); note(test="alone", end=time.time(), got=thing)
"""

GROUP_TESTS = """
import time
import pytest
from inner_plugin import note

@pytest.fixture(scope="module")  # the module's own: its tests are one group (tests/conftest.py)
def server():
    return "up"

@pytest.mark.parametrize("i", range(4))
def test_module_group(i, server):
    note(test=f"module{i}"); time.sleep(0.3)

@pytest.mark.xdist_group("g")
@pytest.mark.parametrize("i", range(4))
def test_marked_group(i):
    note(test=f"marked{i}"); time.sleep(0.3)

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    note(test=f"free{i}"); time.sleep(0.3)
"""


def run_inner(tmp_path: Path, tests: str, workers: int, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """`tests` (as test_inner.py) under a real pytest-xdist run with this suite's conftest; its output and the tests'
    log rows."""
    (tmp_path / "test_inner.py").write_text(tests)
    (tmp_path / "inner_plugin.py").write_text(INNER_PLUGIN)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "H1_LOG": str(log), "PYTHONPATH": f"{TESTS}{os.pathsep}{tmp_path}"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_TESTRUNUID", None)
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "conftest",
        "-p",
        "inner_plugin",
        "-n",
        str(workers),
        "--dist",
        "loadgroup",
    ]
    argv += args
    argv += ["-p", "no:cacheprovider"]
    argv += ["--basetemp", str(tmp_path / "base"), "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_inner.py")]
    out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    return out, [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow
def test_once_per_run_alone_and_the_budget_under_xdist(tmp_path):
    recorded = tmp_path / "durations.json"
    out, rows = run_inner(tmp_path, RUN_TESTS, 3, "--record-durations", str(recorded))
    made = [r for r in rows if r.get("made")]
    assert len(made) == 1, rows  # once, for every worker
    got = {json.dumps(r["got"]) for r in rows if "got" in r}
    assert got == {json.dumps({"built": made[0]["worker"]})}
    assert len({r["worker"] for r in rows if "test" in r}) > 1  # the workers did share the tests
    spans: dict[str, dict] = {}
    for r in rows:
        if "test" in r:
            spans.setdefault(r["test"], {}).update({k: r[k] for k in ("start", "end") if k in r})
    alone = spans.pop("alone")
    beside = [n for n, s in spans.items() if s["start"] < alone["end"] and s["end"] > alone["start"]]
    assert beside == [], (alone, spans)
    assert "budget: 3 worker(s)" in out.stdout, out.stdout[-3000:]
    assert "test_inner.py" in out.stdout.split("budget: 3 worker(s)")[1], out.stdout[-3000:]
    assert "per worker: busy s, and idle s at the end" in out.stdout, out.stdout[-3000:]
    kept = json.loads(recorded.read_text())["tests"]
    assert kept["test_inner.py::test_alone"] >= 1.0  # sleeps 1 s
    assert min(kept.values()) >= 1.0, kept
    # a busy test takes 0.5 s (those waiting for `thing` to be made take longer): some are under what the file keeps
    assert sum("busy" in k for k in kept) < 8, kept


ORDER_TESTS = """
import json, os
from pathlib import Path
import pytest

def note(test):
    with Path(os.environ["H1_LOG"]).open("a") as f:
        f.write(json.dumps({"test": test}) + "\\n")

@pytest.mark.parametrize("i", range(8))
def test_busy(i):
    note(f"busy{i}")

def test_alone():
    note("alone")
"""


@pytest.mark.slow
def test_a_parallel_run_hands_out_the_longest_work_first(tmp_path):
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"tests": {"test_inner.py::test_busy[5]": 50, "test_inner.py::test_alone": 20}}))
    # one worker: it runs the units in the order xdist hands them out
    _, rows = run_inner(tmp_path, ORDER_TESTS, 1, "--durations-from", str(times))
    assert [r["test"] for r in rows] == ["busy5", "alone", *(f"busy{i}" for i in (0, 1, 2, 3, 4, 6, 7))], rows


@pytest.mark.slow
def test_a_group_keeps_to_one_worker(tmp_path):
    """A module's own fixture, or an xdist_group mark, keeps its tests on one worker; the rest spread. (With pytest
    9.2 and pytest-xdist 3.8 the groups were silently ignored: pytest-xdist#1386, hence the pin in pyproject.toml.)"""
    _, rows = run_inner(tmp_path, GROUP_TESTS, 3)
    workers: dict[str, set[str]] = {}
    for r in rows:
        workers.setdefault(r["test"].rstrip("0123456789"), set()).add(r["worker"])
    assert len(rows) == 16, rows
    assert len(workers["module"]) == 1 and len(workers["marked"]) == 1, workers
    assert len(workers["free"]) > 1, workers


class FakeItem:
    def __init__(self, nodeid: str, group: str | None = None) -> None:
        self.nodeid, self.group = nodeid, group

    def iter_markers(self, name: str):
        return [pytest.mark.xdist_group(self.group).mark] if name == "xdist_group" and self.group else []


def test_longest_first_sorts_units_by_their_summed_time_and_keeps_each_unit_together_in_order():
    items = [FakeItem("a"), FakeItem("g1", "g"), FakeItem("b"), FakeItem("g2", "g"), FakeItem("c"), FakeItem("d")]
    times = {"a": 5.0, "g1": 3.0, "g2": 3.0, "c": 30.0}  # g: 6 s in all; b and d unknown (1 s each)
    longest_first(items, [i.nodeid for i in items], times)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["c", "g1", "g2", "a", "b", "d"]
