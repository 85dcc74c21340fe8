from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hf_emulator.fixture import hf_emulator  # noqa: F401  (the HF Jobs emulator, session scope)

from swe_gym_env.core import procs
from swe_gym_env.core.assets import task_runtime_dir, tokenizer_dir
from swe_gym_env.server.agents.harnesses.opencode import OpenCodeHarness
from swe_gym_env.server.agents.harnesses.pi import PiHarness

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parent.parent
BASE_IMAGE = os.environ.get("SWE_GYM_DOCKER_IMAGE", "swe-gym-env/base:bookworm")  # made by scripts/setup_docker.sh
# one tag per checkout: two checkouts testing on one docker daemon never run each other's Space image
SPACE_IMAGE = f"swe-gym-env/space:test-{hashlib.sha256(str(REPO).encode()).hexdigest()[:10]}"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, … under pytest-xdist; "" in a serial run

# -- in parallel (pytest-xdist, `--dist loadgroup`) --------------------------------------------------------------
# Tests that use one of these fixtures share a heavy resource: each group runs on one worker, so what the fixture
# starts is started once per run and never twice at a time (the first match names the group).
# A test marked `xdist_group("vllm")` (a real vLLM on CPU: ~3.6 GB, both cores while it starts) keeps its mark.
GROUPS: tuple[tuple[frozenset[str], str], ...] = (
    # the HF Jobs emulator (session scope): tests assert on every job it lists and on the containers it leaves
    (frozenset({"hf_emulator"}), "hf-emulator"),
    (frozenset({"browser"}), "chromium"),  # Debian's Chromium under Playwright (module scope)
)
# Any other test that uses a module-scoped fixture of its own module (a server stack, an agent run) runs on that
# module's worker, so the fixture is set up once; the other tests go to whichever worker is free.


def _xdist_group(item: pytest.Item) -> str | None:
    if item.get_closest_marker("xdist_group"):
        return None  # the test's own group
    names = set(getattr(item, "fixturenames", ()))
    for fixtures, group in GROUPS:
        if names & fixtures:
            return group
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    module = getattr(getattr(item, "module", None), "__name__", None)
    for name in names:
        for fd in defs.get(name, ()):
            if fd.scope in ("module", "package", "session") and getattr(fd.func, "__module__", None) == module:
                return f"module:{item.path.name}"
    return None


# -- the longest work first ---------------------------------------------------------------------------------------
# xdist hands out work units (a group, or one test) in the order the workers collected them; by default it sorts them
# by test count, which sends a group of a few long tests last and leaves one worker running it alone at the end. Each
# worker sorts its collection by the recorded wall time of each unit instead, longest first, and the controller keeps
# that order (--no-loadscope-reorder). The times: tests/durations.json (`--durations-from`), written by a run with
# `--record-durations tests/durations.json`; a test not in it counts as UNKNOWN_S.
DURATIONS = REPO / "tests" / "durations.json"
UNKNOWN_S = 1.0  # the file keeps tests of 1 s or more


def _unit(item: pytest.Item) -> str:
    """The scheduling unit xdist's loadgroup makes of a test: its groups (named as xdist names them), or the test."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "@" + "_".join(sorted(names)) if names else item.nodeid


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        tests = json.loads(path.read_text())["tests"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {str(k): float(v) for k, v in tests.items()} if isinstance(tests, dict) else {}


def longest_first(items: list[pytest.Item], nodeids: list[str], durations: dict[str, float]) -> None:
    """Sort `items` (whose plain node ids are `nodeids`, in the same order) by their unit's total recorded time,
    longest first; a unit's tests stay together and in their order."""
    units = [_unit(item) for item in items]
    cost: dict[str, float] = {}
    for unit, nodeid in zip(units, nodeids, strict=True):
        cost[unit] = cost.get(unit, 0.0) + durations.get(nodeid, UNKNOWN_S)
    first_seen = {unit: i for i, unit in reversed(list(enumerate(units)))}
    order = sorted(range(len(items)), key=lambda i: (-cost[units[i]], first_seen[units[i]], i))
    items[:] = [items[i] for i in order]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    # before every other hook, xdist's own among them (it turns the marks into the scheduling unit)
    for item in items:
        if group := _xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
    nodeids = {id(item): item.nodeid for item in items}  # xdist appends "@group" to a grouped test's id
    result = yield
    # after every other hook (pytest's own fixture reordering among them): the order xdist will hand work out in
    if WORKER:
        durations = recorded_durations(Path(config.getoption("durations_from")))
        longest_first(items, [nodeids[id(item)] for item in items], durations)
    return result


def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder shared by every worker of this test run (and only this run): the parent of the workers' basetemps
    under xdist, the basetemp in a serial run."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if WORKER else base


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[], Any]) -> Any:
    """`make()` once per test run however many xdist workers ask: the first runs it under a file lock, the others
    wait for it and get its outcome (its JSON value, or the same skip or failure) from a file in `run_dir`."""
    folder = run_dir(tmp_path_factory) / "once"
    outcome_file = folder / f"{name}.json"
    with procs.file_lock(folder / f"{name}.lock"):
        if outcome_file.is_file():
            outcome = json.loads(outcome_file.read_text())
        else:
            try:
                value = make()
            except pytest.skip.Exception as e:
                outcome_file.write_text(json.dumps({"skip": str(e.msg)}))
                raise
            except (Exception, pytest.fail.Exception) as e:
                why = f"{name} failed once for this run (in {WORKER or 'the only worker'}): {type(e).__name__}: {e}"
                outcome_file.write_text(json.dumps({"fail": why[-6000:]}))
                raise
            outcome_file.write_text(json.dumps({"value": value}))
            return value
    if "skip" in outcome:
        pytest.skip(outcome["skip"])
    if "fail" in outcome:
        pytest.fail(outcome["fail"], pytrace=False)
    return outcome["value"]


_OWN_DATA_DIR: list[str] = []


def _per_worker_data_dir(config: pytest.Config) -> None:
    """Servers a test starts without SWE_GYM_DATA_DIR would share the cache dir's capture store and results (and a
    server starting marks every open session there abandoned): each test process gets its own data dir. Not xdist's
    controller: its workers would inherit its dir."""
    if os.environ.get("SWE_GYM_DATA_DIR") or (not WORKER and getattr(config.option, "numprocesses", None)):
        return
    os.environ["SWE_GYM_DATA_DIR"] = tempfile.mkdtemp(prefix=f"swe-gym-test-data-{WORKER or 'serial'}-")
    _OWN_DATA_DIR.append(os.environ["SWE_GYM_DATA_DIR"])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test's wall time (setup + call + teardown, tests of 1 s or more) to PATH as JSON: the order "
        "in which the next parallel run hands work out (tests/durations.json)",
    )
    parser.addoption(
        "--durations-from",
        metavar="PATH",
        default=str(DURATIONS),
        help="the recorded wall times a parallel run orders its work by, longest first (default: %(default)s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    _per_worker_data_dir(config)
    if hasattr(config.option, "loadscopereorder"):  # xdist: keep the order the workers collected (longest first)
        config.option.loadscopereorder = False
    config.addinivalue_line(
        "markers",
        "alone: a timing budget; under xdist the test waits for the tests running on other workers to end, and none "
        "starts until it is done",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under xdist every test (its fixtures' setup and teardown included) holds a shared lock; a test marked `alone`
    holds it exclusively. A turnstile in front keeps a waiting `alone` test from being starved by the others."""
    if not WORKER:
        return (yield)
    folder = Path(item.config.option.basetemp).parent / "alone"  # xdist gives each worker <run's basetemp>/popen-gwN
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "turnstile", "a+") as turnstile, open(folder / "tests", "a+") as tests:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(tests, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _OWN_DATA_DIR:
        shutil.rmtree(path, ignore_errors=True)


# -- the budget in the open: workers, wall time per test file ----------------------------------------------------
class _Budget:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.files: dict[str, list[float]] = {}  # file → [busy seconds, tests, first start, last stop]
        self.workers: dict[str, list[float]] = {}  # worker → [busy seconds, last stop]
        self.tests: dict[str, float] = {}  # node id (without xdist's "@group") → setup + call + teardown seconds

    def add(self, report: pytest.TestReport) -> None:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        node = getattr(report, "node", None)  # the worker that ran it (on xdist's controller)
        if node is not None:
            worker = self.workers.setdefault(str(getattr(getattr(node, "gateway", None), "id", node)), [0.0, 0.0])
            worker[0] += report.duration
            worker[1] = max(worker[1], stop or 0.0)
        nodeid = report.nodeid
        if nodeid.rfind("@") > nodeid.rfind("]"):  # xdist's loadgroup names a grouped test "<id>@<group>"
            nodeid = nodeid[: nodeid.rfind("@")]
        self.tests[nodeid] = self.tests.get(nodeid, 0.0) + report.duration
        path = nodeid.split("::", 1)[0]
        row = self.files.setdefault(path, [0.0, 0, float("inf"), 0.0])
        row[0] += report.duration
        row[1] += report.when == "call" or (report.when == "setup" and report.outcome != "passed")
        if start is not None and stop is not None:
            row[2], row[3] = min(row[2], start), max(row[3], stop)


BUDGET = _Budget()


def pytest_sessionstart(session: pytest.Session) -> None:
    BUDGET.__init__()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not WORKER:  # serial, or xdist's controller (every worker's reports reach it)
        BUDGET.add(report)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if WORKER:
        return
    budget = BUDGET
    n = getattr(config.option, "numprocesses", None)
    workers = len(budget.workers) or (1 if not n else n)
    wall = time.monotonic() - budget.t0
    tr = terminalreporter
    tr.write_sep("=", f"budget: {workers} worker(s), {wall / 60:.1f} min wall, per test file (top 15)")
    head = f"{'busy s':>8} {'span s':>8} {'tests':>5}  file"
    tr.write_line(f"{head}  (busy: setup + call + teardown, summed; span: first start to last end)")
    rows = sorted(budget.files.items(), key=lambda kv: -kv[1][0])
    for path, (busy, count, first, last) in rows[:15]:
        span = f"{last - first:8.1f}" if last >= first else f"{'-':>8}"
        tr.write_line(f"{busy:8.1f} {span} {int(count):5d}  {path}")
    total = sum(r[0] for r in budget.files.values())
    tr.write_line(f"{total:8.1f} {'':>8} {'':>5}  all {len(rows)} files (busy / wall = {total / max(wall, 1e-9):.2f})")
    if budget.workers:  # the tail: when each worker ran out of work
        t_end = max(stop for _, stop in budget.workers.values())
        tr.write_line("per worker: busy s, and idle s at the end (the last worker's end is the run's)")
        for name, (busy, stop) in sorted(budget.workers.items()):
            tr.write_line(f"{busy:8.1f} {t_end - stop:8.1f}        {name}")
    if path := config.getoption("record_durations", None):
        kept = {k: round(v, 1) for k, v in sorted(budget.tests.items()) if v >= UNKNOWN_S}
        Path(path).write_text(json.dumps({"unknown_s": UNKNOWN_S, "tests": kept}, indent=0) + "\n")
        tr.write_line(f"durations of {len(kept)} tests (≥ {UNKNOWN_S:g} s) written to {path}")


def require(ok: bool, why: str) -> None:
    """Skip locally when a real dependency is missing; in CI a missing service is a failure, not a skip."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"required for this test and missing in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def need_tokenizer() -> None:
    require((tokenizer_dir() / "tokenizer.json").is_file(), "tokenizer not prepared: run `swe-gym-env setup`")


@pytest.fixture
def need_sandbox() -> None:
    require(shutil.which("bwrap") is not None, "bubblewrap missing: apt-get install bubblewrap")
    require((task_runtime_dir() / ".ready").is_file(), "task runtime not prepared: run `swe-gym-env setup`")


@pytest.fixture
def need_pi(need_sandbox, need_tokenizer) -> None:
    require(shutil.which("node") is not None, "node missing")
    require(PiHarness().cli_js(PiHarness().install_dir()).is_file(), "Pi not installed: run `swe-gym-env setup`")


@pytest.fixture
def need_opencode(need_sandbox, need_tokenizer) -> None:
    h = OpenCodeHarness()
    require(h.binary(h.install_dir()).is_file(), "OpenCode not installed: run `swe-gym-env setup --harness opencode`")
    require(shutil.which("rg") is not None, "ripgrep missing: apt-get install ripgrep (OpenCode needs rg)")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def need_docker(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A docker daemon with the default sandbox image; started by scripts/setup_docker.sh when we may (root). Once
    per run: the first worker checks (and starts it), the others get its answer."""
    once_per_run(tmp_path_factory, "docker", _docker_up)


def _docker_up() -> None:
    from swe_gym_env.server.sandbox.docker import preflight

    ok, why = preflight(wait_s=300)  # a daemon busy with another worker's build answers late, not never
    if (not ok or "MISSING" in why) and os.geteuid() == 0:
        script = REPO / "scripts" / "setup_docker.sh"
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=1200)
        ok, why = preflight(wait_s=300) if r.returncode == 0 else (False, f"setup_docker.sh failed: {r.stderr[-500:]}")
    require(ok and "MISSING" not in why, f"docker sandbox unavailable: {why}")


def docker_has(image: str) -> bool:
    """Whether the docker daemon has ``image`` locally. A daemon busy with other workers' builds and containers on a
    2-core machine once took over 30 s to answer an inspect: wait up to 5 min; one that does not answer by then raises
    (a hung daemon is a failure, not a missing image)."""
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=300).returncode == 0


def docker_ready() -> bool:
    """A docker CLI and daemon with the local base image the Space image builds from."""
    return shutil.which("docker") is not None and docker_has(BASE_IMAGE)


@pytest.fixture(scope="session")
def space_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Space image (the repo's Dockerfile), built once per test run (it takes minutes) for every test that runs
    it, on whichever worker: tests/test_space*.py (health, uid, tools, the deployed Space) and
    tests/test_sandbox_landlock.py (sandboxes inside it)."""
    return once_per_run(tmp_path_factory, "space-image", _build_space_image)


def _build_space_image() -> str:
    require(docker_ready(), f"no docker daemon with {BASE_IMAGE}: run `bash scripts/setup_docker.sh`")
    argv = ["docker", "build", "--network", "host", "--build-arg", f"BASE={BASE_IMAGE}", "-t", SPACE_IMAGE]
    extra_ca = "".join(p.read_text() for p in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")))
    if extra_ca:  # this machine's TLS-intercepting egress proxy: the build must trust its CA to reach PyPI and npm
        argv += ["--build-arg", f"EXTRA_CA_CERT={extra_ca}"]
    before = _image_id(SPACE_IMAGE)
    build = subprocess.run([*argv, str(REPO)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    if before and before != _image_id(SPACE_IMAGE):  # the last run's image, now untagged: ~6 GB a run otherwise
        subprocess.run(["docker", "rmi", before], capture_output=True, timeout=300)  # its layers the new one uses stay
    return SPACE_IMAGE


def _image_id(tag: str) -> str:
    argv = ["docker", "image", "inspect", "--format", "{{.Id}}", tag]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else ""


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by Playwright (tests/test_ui.py, tests/test_space_deployed.py)."""
    require(CHROMIUM.exists(), "chromium missing: run scripts/setup_ui.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()
