# ruff: noqa
# pyright: basic
"""swe-gym grading guard: a pytest plugin the grader loads first (``-p``), before any conftest or test module.

This file is *data* for the app: it is copied into the grading sandbox and imported by the task's own Python (any
3.x, any pytest >= 3), never by the server. Stdlib + pytest only; no f-strings or annotations.

What it does, from inside the test process the code under test shares:
- reads the record key from the file ``$SWE_GYM_GUARD/key`` and deletes it at import, before the code under test can
  run, and opens ``$SWE_GYM_GUARD/record`` (append): the channel;
- writes one line per test phase with the *raw* call result (did the test function raise, and what) next to the
  outcome pytest's report ended with, and one per logged report (what the reporters saw, subtests included);
- at the end (pytest_unconfigure) checks that pytest's reporting machinery is still the one it saw at import (report
  classes and functions, the runner, skipping, the terminal and JUnit reporters, pluggy's call loop) and that every
  hook implementation comes from an installed plugin, a conftest.py present before the run, or was registered
  before the repository was imported; then writes an ``end`` line. A run that never writes ``end`` did not reach
  pytest's own end (``os._exit``, a signal, a hang).
Every line carries an HMAC-SHA256 over the previous line's MAC and its own payload: a line the code under test
writes, rewrites or removes breaks the chain. Code in the same process can still, in principle, find the key in
this module's memory: see the grader's threat model for what that leaves open.
"""

import hashlib
import hmac
import inspect
import json
import os
import sys
import time

import pytest

_DIR = os.environ.pop("SWE_GYM_GUARD", "")
_KEY = b""
if _DIR:
    try:
        with open(os.path.join(_DIR, "key"), "rb") as _f:
            _KEY = _f.read().strip()
        os.unlink(os.path.join(_DIR, "key"))
    except OSError:
        _KEY = b""  # a second pytest process of the same run (xdist worker, a second invocation): unkeyed
_FD = None
if _DIR:
    try:
        _FD = os.open(os.path.join(_DIR, "record"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        _FD = None
_PREV = [""]
_SEQ = [0]
_PID = os.getpid()
_CWD = os.path.realpath(os.getcwd())
_T0 = time.time()
_hmac_new = hmac.new
_sha256 = hashlib.sha256
_dumps = json.dumps
_write = os.write


def _emit(kind, **fields):
    if _FD is None:
        return
    fields["k"] = kind
    fields["pid"] = _PID
    fields["seq"] = _SEQ[0]
    _SEQ[0] += 1
    payload = _dumps(fields, sort_keys=True, separators=(",", ":"))
    mac = _hmac_new(_KEY, (_PREV[0] + payload).encode("utf-8"), _sha256).hexdigest() if _KEY else ""
    _PREV[0] = mac
    line = _dumps({"p": payload, "mac": mac}, separators=(",", ":")) + "\n"
    try:
        _write(_FD, line.encode("utf-8"))
    except OSError:
        pass


def _resolve(path):
    obj = None
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = __import__(".".join(parts[:i]), fromlist=["_"])
        except Exception:
            continue
        for attr in parts[i:]:
            # class attributes through __dict__ so properties and staticmethods compare as themselves
            d = getattr(obj, "__dict__", {})
            if attr in d:
                obj = d[attr]
            else:
                obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


# What decides and reports an outcome. Missing names (older or newer pytest) are skipped.
_WATCHED = [
    "_pytest.reports.TestReport",
    "_pytest.reports.TestReport.from_item_and_call",
    "_pytest.reports.TestReport.__init__",
    "_pytest.reports.BaseReport",
    "_pytest.reports.BaseReport.passed",
    "_pytest.reports.BaseReport.failed",
    "_pytest.reports.BaseReport.skipped",
    "_pytest.runner.call_and_report",
    "_pytest.runner.call_runtest_hook",
    "_pytest.runner.runtestprotocol",
    "_pytest.runner.pytest_runtest_makereport",
    "_pytest.runner.pytest_runtest_protocol",
    "_pytest.runner.CallInfo",
    "_pytest.runner.CallInfo.from_call",
    "_pytest.skipping.pytest_runtest_makereport",
    "_pytest.skipping.pytest_runtest_setup",
    "_pytest.skipping.pytest_runtest_call",
    "_pytest.skipping.pytest_report_teststatus",
    "_pytest.skipping.evaluate_skip_marks",
    "_pytest.skipping.evaluate_xfail_marks",
    "_pytest.terminal.TerminalReporter",
    "_pytest.terminal.TerminalReporter.pytest_runtest_logreport",
    "_pytest.terminal.TerminalReporter.short_test_summary",
    "_pytest.terminal.TerminalReporter.summary_stats",
    "_pytest.terminal._get_line_with_reprcrash_message",
    "_pytest.junitxml.LogXML",
    "_pytest.junitxml.LogXML.pytest_runtest_logreport",
    "_pytest.junitxml.LogXML.pytest_sessionfinish",
    "_pytest.junitxml._NodeReporter.append_pass",
    "_pytest.junitxml._NodeReporter.append_failure",
    "_pytest.python.pytest_pyfunc_call",
    "_pytest.python.Function.runtest",
    "_pytest.unittest.TestCaseFunction.runtest",
    "_pytest.unittest.pytest_runtest_makereport",
    "_pytest.outcomes.skip",
    "_pytest.outcomes.xfail",
    "_pytest.outcomes.fail",
    "_pytest.outcomes.exit",
    "_pytest.main.pytest_runtestloop",
    "_pytest.main.wrap_session",
    "_pytest.main.Session.perform_collect",
    "_pytest.assertion.rewrite.rewrite_asserts",
    "_pytest.assertion.rewrite.AssertionRewriter.run",
    "_pytest.assertion.rewrite.AssertionRewritingHook",
    "_pytest.assertion.rewrite.AssertionRewritingHook.find_spec",
    "_pytest.assertion.rewrite.AssertionRewritingHook.exec_module",
    "_pytest.assertion.rewrite._rewrite_test",
    "pytest.skip",
    "pytest.xfail",
    "pytest.fail",
    "pluggy._callers._multicall",
    "pluggy.callers._multicall",
    "pluggy._manager.PluginManager._hookexec",
    "pluggy.manager.PluginManager._hookexec",
    "pluggy._hooks.HookCaller.__call__",
    "pluggy._hooks._HookCaller.__call__",
    "pluggy.hooks._HookCaller.__call__",
]
_SEEN = {}
for _name in _WATCHED:
    _obj = _resolve(_name)
    if _obj is not None:
        _SEEN[_name] = _obj
_SKIPPED = _resolve("_pytest.outcomes.Skipped") or type("NoSkip", (Exception,), {})
_XFAILED = _resolve("_pytest.outcomes.XFailed") or type("NoXFail", (Exception,), {})
_PM = []  # the plugin manager, its hook relay and hook callers as first seen
_BASELINE = []  # plugins registered before the repository's conftests (and so its code) were loaded
_CONFTESTS = {}  # conftest.py files present when the run started: relative path -> sha256
_META_PATH = list(sys.meta_path)  # import finders present when the run started


def _hash_file(path):
    try:
        with open(path, "rb") as f:
            return _sha256(f.read()).hexdigest()
    except OSError:
        return ""


def _scan_conftests():
    skip = {".git", "node_modules", ".tox", ".venv", "venv", "__pycache__", ".eggs"}
    n = 0
    for root, dirs, files in os.walk(_CWD):
        dirs[:] = [d for d in dirs if d not in skip]
        n += len(files)
        if n > 200000:
            break
        if "conftest.py" in files:
            p = os.path.join(root, "conftest.py")
            _CONFTESTS[os.path.relpath(p, _CWD)] = _hash_file(p)


_scan_conftests()
_emit("start", py=sys.version.split()[0], pytest=getattr(pytest, "__version__", "?"), cwd=_CWD, keyed=bool(_KEY))


def _rel(path):
    if not path:
        return ""
    try:
        real = os.path.realpath(path)
    except Exception:
        return path
    if real == _CWD or real.startswith(_CWD + os.sep):
        return os.path.relpath(real, _CWD)
    return "/" + real.lstrip("/")  # outside the work tree: absolute


def _origin(excinfo):
    """The innermost frame outside pytest and pluggy that raised (who called pytest.skip / xfail)."""
    try:
        tb = excinfo.tb
    except Exception:
        return ""
    files = []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for f in reversed(files):
        if "/_pytest/" in f or "/pluggy/" in f or f.endswith("/pytest.py") or "/pytest/__init__" in f:
            continue
        return _rel(f)
    return ""


def _raw(call):
    excinfo = getattr(call, "excinfo", None)
    if excinfo is None:
        return "ok", ""
    try:
        exc = excinfo.value
    except Exception:
        return "exc:?", ""
    if isinstance(exc, _XFAILED):
        return "xfail", _origin(excinfo)
    if isinstance(exc, _SKIPPED):
        return "skip", _origin(excinfo)
    return "exc:" + type(exc).__name__, ""


def pytest_addhooks(pluginmanager):
    if not _PM:
        _PM.append(pluginmanager)
        _PM.append(pluginmanager.hook)
        _PM.append(getattr(pluginmanager, "_inner_hookexec", None))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if not _BASELINE:
        pm = early_config.pluginmanager
        _BASELINE.append(set(id(p) for p in pm.get_plugins()))
        _BASELINE.append(list(pm.get_plugins()))  # keep them alive: ids stay unique
        hooks = {}
        for name in dir(pm.hook):
            if name.startswith("pytest_"):
                hooks[name] = getattr(pm.hook, name)
        _BASELINE.append(hooks)
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    raw, origin = _raw(call)
    outcome = yield
    try:
        rep = outcome.get_result()
        out = getattr(rep, "outcome", "?")
        xf = hasattr(rep, "wasxfail")
    except Exception as e:
        out, xf = "raised:" + type(e).__name__, False
    _emit("call", id=item.nodeid, when=call.when, raw=raw, origin=origin, out=out, xf=xf)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_logreport(report):
    yield
    sub = type(report).__name__ == "SubtestReport" or hasattr(report, "context")
    _emit(
        "log",
        id=getattr(report, "nodeid", "?"),
        when=getattr(report, "when", "?"),
        out=getattr(report, "outcome", "?"),
        xf=hasattr(report, "wasxfail"),
        sub=bool(sub),
    )


def _source_of(obj):
    """The file a module (or a class's module) was loaded from; '' when it has none."""
    try:
        return inspect.getfile(obj) or ""
    except (TypeError, OSError):
        return ""


def _impl_source(impl):
    fn = getattr(impl, "function", None)
    code = getattr(fn, "__code__", None)
    return getattr(code, "co_filename", "") or _source_of(getattr(impl, "plugin", None))


def _new_since_start(path):
    """Missing now, or written after the run started (the code under test made it)."""
    try:
        return os.stat(path).st_mtime >= _T0
    except OSError:
        return True


def _audit(config):
    """(problems, hooks): what is wrong for certain, and every hook implementation registered after the baseline
    that is not a conftest.py present at the start: (hook, file relative to the work tree or absolute, new)."""
    problems = []
    hooks = []
    for name, obj in sorted(_SEEN.items()):
        if _resolve(name) is not obj:
            problems.append("replaced " + name)
    pm = config.pluginmanager
    if _PM:
        if pm is not _PM[0] or pm.hook is not _PM[1]:
            problems.append("replaced the plugin manager or its hook relay")
        if getattr(pm, "_inner_hookexec", None) is not _PM[2]:
            problems.append("replaced the plugin manager's hook executor")
    if len(_BASELINE) != 3:
        problems.append("pytest_load_initial_conftests never reached the guard")
        return problems, hooks
    baseline = _BASELINE[0]
    for name, caller in sorted(_BASELINE[2].items()):
        if getattr(pm.hook, name, None) is not caller:
            problems.append("replaced hook caller " + name)
    for name in sorted(dir(pm.hook)):
        if not name.startswith("pytest_"):
            continue
        try:
            impls = getattr(pm.hook, name).get_hookimpls()
        except Exception:
            continue
        for impl in impls:
            if id(getattr(impl, "plugin", None)) in baseline:
                continue
            src = _impl_source(impl)
            rel = _rel(src)
            if os.path.basename(src) == "conftest.py" and not rel.startswith("/"):
                if rel in _CONFTESTS and _CONFTESTS[rel] == _hash_file(src):
                    continue
                problems.append("conftest %s appeared or changed during the run (%s)" % (rel, name))
                continue
            new = _new_since_start(src) if src else True
            if rel.startswith("/") and not new:
                continue  # an installed plugin (site-packages, stdlib) that was there before the run
            hooks.append([name, rel or "?", new])
    for finder in sys.meta_path:
        if any(finder is f for f in _META_PATH):
            continue
        module = sys.modules.get(getattr(type(finder), "__module__", ""), None)
        src = _source_of(module)
        rel = _rel(src)
        new = _new_since_start(src) if src else True
        if rel.startswith("/") and not new:
            continue  # an installed package's import hook (six, setuptools, an editable install's finder)
        hooks.append(["sys.meta_path", rel or "?", new])
    return problems, hooks


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    problems, hooks = _audit(config)
    _emit("audit", problems=sorted(set(problems))[:20], hooks=hooks[:200])
    xml = getattr(getattr(config, "option", None), "xmlpath", None)
    _emit("end", junit=_hash_file(xml) if xml else "")
