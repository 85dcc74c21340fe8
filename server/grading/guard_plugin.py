# ruff: noqa
# pyright: basic
"""swe-gym grading guard: a pytest plugin the grader loads first (``-p``), before any conftest or test module.

This file is *data* for the app: it is copied into the grading sandbox and imported by the task's own Python (any
3.x, any pytest >= 3), never by the server. Stdlib + pytest only; no f-strings or annotations.

What it does, from inside the test process the code under test shares (the launcher, ``guard_launch.py``, imports it
before pytest and before any file of the tree can be imported):
- writes every record line to ``$SWE_GYM_GUARD_FD``, a pipe whose other end is the launcher's collector, a separate
  process that holds the record's key (this process never has it) and chains each line into the record as it
  arrives: a line once written cannot be taken back or rewritten;
- one line per test phase with the *raw* call result (did the test function raise, and what) next to the outcome
  pytest's report ended with, and one per logged report (what the reporters saw, subtests included);
- at the end (pytest_unconfigure) checks that pytest's reporting machinery is still the one it saw at import (report
  classes and functions, the runner, skipping, the terminal and JUnit reporters, pluggy's call loop) and that every
  hook implementation comes from an installed plugin, a conftest.py present before the run, or was registered
  before the repository was imported; then writes an ``end`` line. A run that never writes ``end`` did not reach
  pytest's own end (``os._exit``, a signal, a hang).
- the runtime record (see ``runtime_record.py`` on the server side): a ``sys.addaudithook`` hook, added at import
  (audit hooks cannot be removed), writes one ``rt`` line per distinct event from code outside the guard, the
  standard library and the installed packages: code objects replaced or read, trace/profile functions, frame and
  garbage-collector access, ctypes, opening the tree's Python files, code compiled under another file's name, thread
  and process starts (threads through wrappers: no audit event before 3.12), and compared operands of asserts
  (pytest's rewriter, unittest's assertEqual) whose type from the tree equals a fresh ``object()``;
- before each test runs, and at the end, checks that its function and code object, every name of ``builtins``
  (``AssertionError`` included) and the objects it watches (pytest's outcome exceptions among them) are still the
  ones seen before the tree was imported (a ``problem`` line otherwise).
"""

import builtins
import hashlib
import inspect
import json
import os
import sys
import threading
import time
import unittest

import pytest

try:
    import _thread
except ImportError:  # Python 2 names: never here, but keep the guard importable
    _thread = None

__unittest = True  # unittest and pytest leave the guard's wrapper frames out of assertion tracebacks

_FD = None
_raw_fd = os.environ.pop("SWE_GYM_GUARD_FD", "")
if _raw_fd.isdigit():
    _FD = int(_raw_fd)  # the pipe's write end: the launcher's collector holds the other end (and the key)
_GUARD_DIR = os.path.dirname(os.path.realpath(__spec__.origin)) if __spec__ and __spec__.origin else ""
_SEQ = [0]
_PID = os.getpid()
_CWD = os.path.realpath(os.getcwd())
_T0 = time.time()
_dumps = json.dumps
_sha256 = hashlib.sha256
_write = os.write
_getpid = os.getpid
_LOCK = threading.RLock()  # the runtime record writes from any thread


def _emit(kind, **fields):
    """One record line, written to the collector's pipe at once (it leaves this process as it is written)."""
    if _FD is None or _getpid() != _PID:  # a forked child of the test process never writes
        return
    with _LOCK:
        fields["k"] = kind
        fields["pid"] = _PID
        fields["seq"] = _SEQ[0]
        _SEQ[0] += 1
        data = (_dumps(fields, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            while data:
                data = data[_write(_FD, data) :]
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


# -- the runtime record ------------------------------------------------------------------------------------------
_realpath = os.path.realpath
_SEP = os.sep


def _lib_prefixes():
    dirs = set()
    for name in ("prefix", "base_prefix", "exec_prefix", "base_exec_prefix"):
        d = getattr(sys, name, "")
        if d:
            dirs.add(d)
    try:
        import sysconfig

        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            d = sysconfig.get_paths().get(key)
            if d:
                dirs.add(d)
    except Exception:
        pass
    try:
        import site

        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except Exception:
        pass
    out = set()
    for d in dirs:
        try:
            r = _realpath(d)
        except Exception:
            continue
        if r and r != _SEP:
            out.add(r.rstrip(_SEP) + _SEP)
    return tuple(sorted(out))


_LIB = _lib_prefixes()
_CWD_SEP = _CWD.rstrip(_SEP) + _SEP
_KINDS = {}  # co_filename -> (kind, shown name): guard, lib, tree, out (a file outside the tree), pseudo (<string>)
_NEW = {}  # shown name -> written after the run started


def _kind(filename):
    k = _KINDS.get(filename)
    if k is not None:
        return k
    if not filename:
        k = ("lib", "")
    elif filename[0] == "<":
        k = ("lib", filename) if filename.startswith("<frozen") else ("pseudo", filename)
    else:
        path = filename if os.path.isabs(filename) else os.path.join(_CWD, filename)
        try:
            real = _realpath(path)
        except Exception:
            real = path
        if _GUARD_DIR and real.startswith(_GUARD_DIR + _SEP):
            k = ("guard", real)
        elif "site-packages" + _SEP in real or "dist-packages" + _SEP in real:
            k = ("lib", real)
        elif real.startswith(_CWD_SEP):
            k = ("tree", real[len(_CWD_SEP) :])
        elif real.startswith(_LIB):
            k = ("lib", real)
        else:
            k = ("out", real)
    if len(_KINDS) < 100000:
        _KINDS[filename] = k
    return k


def _is_new(kind, name):
    if name not in _NEW:
        _NEW[name] = _new_since_start(os.path.join(_CWD, name) if kind == "tree" else name)
    return _NEW[name]


_HAS_FRAMES = hasattr(sys, "_getframe")


def _getframe(depth):
    return sys._getframe(depth + 1)


_get_ident = getattr(_thread, "get_ident", None) or (lambda: 0)
_BUSY = set()  # threads inside the hook (its own frame and attribute reads raise events too)


def _hold():
    """This thread's id, now inside the hook (None: it is already: the guard's own frame and attribute reads)."""
    tid = _get_ident()
    if tid in _BUSY:
        return None
    _BUSY.add(tid)
    return tid


_RT_SEEN = set()
_RT_LIMIT = [2000]
# modules that fetch frames on behalf of their caller (their caller is who asked); any other library frame asking
# for a frame does so for itself (logging, typing, collections.namedtuple, enum ...)
_FRAME_AGENTS = ("inspect.py", "traceback.py", "dis.py")
# library frames that run callbacks: a sensitive event whose whole stack is library code, under one of these, came
# from a callback someone queued (a thread's target, a weakref finalizer, an event-loop callback)
_DISPATCHERS = ("threading.py", "weakref.py", "sched.py", "thread.py", "events.py", "base_events.py")


def _note(ev, on, kind, name):
    key = (ev, on, name)
    if key in _RT_SEEN or _RT_LIMIT[0] <= 0:
        return
    _RT_SEEN.add(key)
    _RT_LIMIT[0] -= 1
    new = kind in ("tree", "out") and _is_new(kind, name)
    _emit("rt", ev=ev, on=on, src=name if kind != "out" else "/" + name.lstrip("/"), new=new)


def _who(frame, mode):
    """(kind, name) of the code responsible for an event raised below ``frame``; None: library code's own doing.
    mode "any": the innermost frame outside the guard and the libraries; "frame": past inspect/traceback, the frame
    that asked, if it is not a library's; "direct": the innermost frame outside the guard, if not a library's;
    "ctypes": past ctypes and the import system, if not a library's."""
    first_lib = ""
    while frame is not None:
        code = frame.f_code
        kind, name = _kind(code.co_filename)
        if kind == "guard":
            frame = frame.f_back
            continue
        if kind == "lib":
            if mode == "frame" and name.endswith(_FRAME_AGENTS):
                frame = frame.f_back
                continue
            if mode == "ctypes" and (_SEP + "ctypes" + _SEP in name or name.startswith("<frozen")):
                frame = frame.f_back
                continue
            if mode != "any":
                return None
            first_lib = first_lib or name
            frame = frame.f_back
            continue
        return kind, name
    if mode == "any" and first_lib.endswith(_DISPATCHERS):
        return "pseudo", "<callback from " + os.path.basename(first_lib) + ">"
    return None


def _innermost(frame):
    """The file of the innermost frame outside the guard."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if _kind(filename)[0] != "guard":
            return filename
        frame = frame.f_back
    return ""


def _pyc_source(rel):
    """tests/__pycache__/test_x.cpython-311-pytest-9.0.pyc -> tests/test_x.py (what the bytecode was made of)."""
    if rel.endswith(".pyc"):
        head, _, tail = rel.rpartition("/")
        if head == "__pycache__" or head.endswith("/__pycache__"):
            head = head[: -len("__pycache__")].rstrip("/")
            tail = tail.split(".", 1)[0] + ".py"
            return head + "/" + tail if head else tail
        return rel[:-1]
    return rel


_PROCESS_EVENTS = {
    "subprocess.Popen": "subprocess.Popen",
    "os.system": "os.system",
    "os.exec": "os.exec",
    "os.posix_spawn": "os.posix_spawn",
    "os.spawn": "os.spawn",
    "os.fork": "os.fork",
    "os.forkpty": "os.forkpty",
    "pty.spawn": "pty.spawn",
    "_thread.start_new_thread": "thread.start",  # Python >= 3.12
    "_thread.start_joinable_thread": "thread.start",  # Python >= 3.13
}
_ANY_EVENTS = {
    "sys.settrace": "sys.settrace",
    "sys.setprofile": "sys.setprofile",
    "gc.get_referrers": "gc.get_referrers",
    "gc.get_referents": "gc.get_referents",
    "gc.get_objects": "gc.get_objects",
}
_ANY_EVENTS.update(_PROCESS_EVENTS)
_FRAME_EVENTS = {"sys._getframe": "sys._getframe", "sys._current_frames": "sys._current_frames"}
_SET_ATTRS = ("__code__", "__defaults__", "__kwdefaults__")
_EVENTS = (
    set(_ANY_EVENTS)
    | set(_FRAME_EVENTS)
    | set(["object.__setattr__", "object.__getattr__", "open", "compile", "code.__new__"])
)


def _code_file(fn):
    code = getattr(fn, "__code__", None)
    return getattr(code, "co_filename", "") if code is not None else ""


def _shown(filename):
    kind, name = _kind(filename)
    if kind == "tree" or kind == "pseudo":
        return name
    return "/" + name.lstrip("/") if name else ""


def _event(ev, args):
    """What the hook records of one event (None: nothing); runs with the hook's reentrancy guard held."""
    frame = _getframe(2)
    if ev in _ANY_EVENTS:
        return _any_event(ev, frame)
    if ev in _FRAME_EVENTS:
        who = _who(frame, "frame")
        return who and (ev, "", who)
    if ev.startswith("ctypes."):
        who = _who(frame, "ctypes")
        return who and (ev, "", who)
    if ev == "object.__setattr__":
        if len(args) < 2 or args[1] not in _SET_ATTRS:
            return None
        who = _who(frame, "any")
        return who and ("set " + args[1], _shown(_code_file(args[0])), who)
    if ev == "object.__getattr__":
        return _getattr_event(args, frame)
    if ev == "open":
        return _open_event(args, frame)
    if ev == "compile" or ev == "code.__new__":
        return _compile_event(ev, args, frame)
    return None


def _any_event(ev, frame):
    """An event recorded whoever raised it, outside the libraries (threading's bootstrap setting a new thread's trace
    or profile function: for whose function it is)."""
    if ev in ("sys.settrace", "sys.setprofile") and _innermost(frame).endswith(_SEP + "threading.py"):
        # threading.settrace's function, set in a new thread by threading's bootstrap: whose function it is
        hook = getattr(threading, "_trace_hook" if ev == "sys.settrace" else "_profile_hook", None)
        who = _kind(_code_file(hook)) if hook is not None else None
        if who is None or who[0] in ("lib", "guard"):
            return None
    else:
        who = _who(frame, "any")
    return who and (_ANY_EVENTS[ev], "", who)


def _getattr_event(args, frame):
    """A read of a tree function's ``__code__`` or of a traceback's frame."""
    if len(args) < 2:
        return None
    if args[1] == "__code__":
        kind, name = _kind(_code_file(args[0]))
        if kind != "tree":
            return None
        who = _who(frame, "frame")
        return who and ("read __code__", name, who)
    if args[1] == "tb_frame":
        who = _who(frame, "direct")
        return who and ("tb_frame", "", who)
    return None


def _open_event(args, frame):
    """An open of one of the tree's Python (or bytecode) files, other than by the import system."""
    path = args[0] if args else None
    if isinstance(path, bytes):
        path = path.decode("utf-8", "replace")
    if not isinstance(path, str) or not path.endswith((".py", ".pyc")):
        return None
    if _innermost(frame).startswith("<frozen importlib"):
        return None  # the import system loading a module (an import from the tree is not a read of it)
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    if not _realpath(path).startswith(_CWD_SEP):
        return None
    who = _who(frame, "any")
    return who and ("open", _pyc_source(_realpath(path)[len(_CWD_SEP) :]), who)


def _compile_event(ev, args, frame):
    """Code compiled (or a code object made) under the name of a file that is not the caller's."""
    claimed = args[1] if len(args) > 1 else None
    if isinstance(claimed, bytes):
        claimed = claimed.decode("utf-8", "replace")
    if not isinstance(claimed, str) or not claimed or claimed[0] == "<":
        return None
    who = _who(frame, "direct")
    if who is None or _kind(claimed) == who:
        return None
    return who and ("compile as" if ev == "compile" else "code as", _shown(claimed), who)


def _audit_hook(ev, args):
    if ev not in _EVENTS and not ev.startswith("ctypes."):
        return
    if ev == "object.__getattr__" and (len(args) < 2 or args[1] not in ("__code__", "tb_frame")):
        return
    if ev == "object.__setattr__" and (len(args) < 2 or args[1] not in _SET_ATTRS):
        return
    tid = _hold()
    if tid is None:
        return
    try:
        got = _event(ev, args)
        if got:
            label, on, who = got
            _note(label, on, who[0], who[1])
    except Exception:
        pass
    finally:
        _BUSY.discard(tid)


def _note_here(label):
    """Record ``label`` for the code calling a guard wrapper (thread starts, threading's trace setters)."""
    if not _HAS_FRAMES:
        return
    tid = _hold()
    if tid is None:
        return
    try:
        who = _who(_getframe(2), "any")
        if who:
            _note(label, "", who[0], who[1])
    except Exception:
        pass
    finally:
        _BUSY.discard(tid)


def _wrap(owner, attr, label):
    orig = getattr(owner, attr, None)
    if orig is None or getattr(orig, "_swe_gym_guard", False):
        return

    def wrapper(*args, **kwargs):
        _note_here(label)
        return orig(*args, **kwargs)

    wrapper.__name__ = getattr(orig, "__name__", attr)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper._swe_gym_guard = True
    setattr(owner, attr, wrapper)


_AUDIT = _FD is not None and hasattr(sys, "addaudithook") and _HAS_FRAMES
if _AUDIT:
    if sys.version_info < (3, 12):  # no audit event for a thread start before 3.12
        if _thread is not None:
            _wrap(_thread, "start_new_thread", "thread.start")
        _wrap(threading, "_start_new_thread", "thread.start")
    _wrap(threading, "settrace", "threading.settrace")
    _wrap(threading, "setprofile", "threading.setprofile")
    sys.addaudithook(_audit_hook)


# -- comparisons that hold for anything (best effort) ------------------------------------------------------------
_EQ_ORIGIN = {}  # type -> (kind, name) of its __eq__ / __ne__ code (or its module's file)


def _eq_origin(tp):
    got = _EQ_ORIGIN.get(tp)
    if got is not None:
        return got
    filename = ""
    for meth in ("__eq__", "__ne__"):
        filename = _code_file(getattr(tp, meth, None))
        if filename:
            break
    if not filename:
        mod = sys.modules.get(getattr(tp, "__module__", "") or "")
        filename = _source_of(mod) if mod is not None else ""
    got = _kind(filename) if filename else ("lib", "")
    if len(_EQ_ORIGIN) < 10000:
        _EQ_ORIGIN[tp] = got
    return got


def _eq_check(obj):
    """Record ``always-equal <type>`` when ``obj``, of a type whose comparison code is the tree's (or outside every
    library), equals a fresh ``object()`` or is not unequal to it (unittest.mock.ANY and kin are the stdlib's)."""
    if not _AUDIT:
        return
    tp = type(obj)
    kind, name = _eq_origin(tp)
    if kind in ("lib", "guard"):
        return
    tid = _hold()
    if tid is None:
        return
    try:
        sentinel = object()
        try:
            same = bool(obj == sentinel)
        except Exception:
            same = False
        try:
            differs = bool(obj != sentinel)
        except Exception:
            differs = True
        if same or not differs:
            _note("always-equal", getattr(tp, "__qualname__", "") or getattr(tp, "__name__", "?"), kind, name)
    except Exception:
        pass
    finally:
        _BUSY.discard(tid)


def _compared(left, right):
    """Called by rewritten test modules after each ``==`` / ``!=`` of an assert, with both operands."""
    _eq_check(left)
    _eq_check(right)


def _patch_rewriter():
    """After each ``a == b`` / ``a != b`` pytest's rewriter makes of an assert (operands already in temporaries or
    plain names: reloading them has no side effect), a call ``@pytest_ar._swe_gym_compared(a, b)``. (The pass hook
    would see passing asserts too, but its explanation code snapshots ``locals()``: it keeps objects alive and breaks
    weakref tests.)"""
    import ast

    try:
        import _pytest.assertion.rewrite as rewrite
    except Exception:
        return
    cls = getattr(rewrite, "AssertionRewriter", None)
    orig = getattr(cls, "visit_Compare", None)
    if orig is None or getattr(orig, "_swe_gym_guard", False) or not hasattr(cls, "helper"):
        return

    def visit_Compare(self, comp):
        stmts = getattr(self, "statements", None)
        before = len(stmts) if isinstance(stmts, list) else 0
        out = orig(self, comp)
        try:
            if stmts is not None and self.statements is stmts:
                added = []
                for st in stmts[before:]:
                    added.append(st)
                    v = getattr(st, "value", None)
                    if (
                        isinstance(st, ast.Assign)
                        and isinstance(v, ast.Compare)
                        and len(v.ops) == 1
                        and isinstance(v.ops[0], (ast.Eq, ast.NotEq))
                        and isinstance(v.left, ast.Name)
                        and isinstance(v.comparators[0], ast.Name)
                    ):
                        call = self.helper(
                            "_swe_gym_compared",
                            ast.Name(v.left.id, ast.Load()),
                            ast.Name(v.comparators[0].id, ast.Load()),
                        )
                        added.append(ast.copy_location(ast.Expr(call), st))
                stmts[before:] = added
        except Exception:
            pass
        return out

    visit_Compare._swe_gym_guard = True
    setattr(rewrite, "_swe_gym_compared", _compared)
    setattr(cls, "visit_Compare", visit_Compare)
    # pytest caches rewritten modules as __pycache__/*-pytest-*.pyc, keyed only by the source's mtime and size. Code
    # rewritten here calls a name only a guarded process has, and a cache written by a plain run (the agent's own, in
    # the same tree) lacks the calls: share that cache in neither direction.
    setattr(rewrite, "_read_pyc", _no_cached_pyc)
    setattr(rewrite, "_write_pyc", _no_pyc_written)


def _no_cached_pyc(*args, **kwargs):
    return None


def _no_pyc_written(*args, **kwargs):
    return False


if _AUDIT:
    _patch_rewriter()


def _wrap_assert(name):
    orig = unittest.TestCase.__dict__.get(name)
    if orig is None:
        return

    def wrapper(self, first, second, *args, **kwargs):
        _eq_check(first)
        _eq_check(second)
        return orig(self, first, second, *args, **kwargs)

    wrapper.__name__ = name
    wrapper.__qualname__ = getattr(orig, "__qualname__", name)
    wrapper.__doc__ = orig.__doc__
    wrapper._swe_gym_guard = True
    setattr(unittest.TestCase, name, wrapper)


if _AUDIT:
    _wrap_assert("assertEqual")
    _wrap_assert("assertNotEqual")


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
    "_pytest.outcomes.Skipped",
    "_pytest.outcomes.XFailed",
    "_pytest.outcomes.Failed",
    "_pytest.outcomes.Exit",
    "_pytest.outcomes.OutcomeException",
    "_pytest.outcomes.OutcomeException.__init__",
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
    # what the tests' own checks call: an expected exception, an approximate value, a warning
    "pytest.raises",
    "pytest.approx",
    "pytest.warns",
    "pytest.deprecated_call",
    "_pytest.python_api.raises",
    "_pytest.python_api.approx",
    "_pytest.raises.raises",
    "_pytest.raises.RaisesExc",
    "_pytest.recwarn.warns",
    "_pytest.recwarn.WarningsChecker",
    "_pytest.assertion.util.assertrepr_compare",
    "_pytest.assertion.rewrite._call_reprcompare",
    "pluggy._callers._multicall",
    "pluggy.callers._multicall",
    "pluggy._manager.PluginManager._hookexec",
    "pluggy.manager.PluginManager._hookexec",
    "pluggy._hooks.HookCaller.__call__",
    "pluggy._hooks._HookCaller.__call__",
    "pluggy.hooks._HookCaller.__call__",
    # unittest's machinery (tests of unittest.TestCase classes run through it) and the guard's own wrappers
    "unittest.case.TestCase.run",
    "unittest.case.TestCase.__call__",
    "unittest.case.TestCase.debug",
    "unittest.case.TestCase.skipTest",
    "unittest.case.TestCase.fail",
    "unittest.case.TestCase.subTest",
    "unittest.case.TestCase._callTestMethod",
    "unittest.case.TestCase._callSetUp",
    "unittest.case.TestCase._callTearDown",
    "unittest.case.TestCase._getAssertEqualityFunc",
    "unittest.case.TestCase._baseAssertEqual",
    "unittest.case.TestCase.failureException",
    "unittest.case.SkipTest",
    "unittest.case._Outcome",
    "unittest.case.skip",
    "unittest.case.skipIf",
    "unittest.case.skipUnless",
    "unittest.case.expectedFailure",
    "_pytest.unittest.TestCaseFunction",
    "_pytest.unittest.TestCaseFunction.addSuccess",
    "_pytest.unittest.TestCaseFunction.addFailure",
    "_pytest.unittest.TestCaseFunction.addError",
    "_pytest.unittest.TestCaseFunction.addSkip",
    "_pytest.unittest.TestCaseFunction.addExpectedFailure",
    "_pytest.unittest.TestCaseFunction.addUnexpectedSuccess",
    "_pytest.unittest.TestCaseFunction.stopTest",
    "_pytest.assertion.rewrite.AssertionRewriter.visit_Compare",
    "_pytest.assertion.rewrite._swe_gym_compared",
    "_pytest.assertion.rewrite._read_pyc",
    "_pytest.assertion.rewrite._write_pyc",
    "threading._start_new_thread",
    "_thread.start_new_thread",
    "threading.settrace",
    "threading.setprofile",
]
_WATCHED += ["unittest.case.TestCase." + _n for _n in sorted(unittest.TestCase.__dict__) if _n.startswith("assert")]
_SEEN = {}
for _name in _WATCHED:
    _obj = _resolve(_name)
    if _obj is not None:
        _SEEN[_name] = _obj
_OWNERS = []  # (name, owner, attribute, object): checked before every test (a swap undone by the end is still seen)
for _name, _obj in sorted(_SEEN.items()):
    _head, _, _attr = _name.rpartition(".")
    _owner = _resolve(_head) if _head else None
    if _owner is not None and _attr:
        _OWNERS.append((_name, _owner, _attr, _obj))


# every name of builtins as the tree found it (what assertions and the runner rely on: AssertionError, isinstance,
# __import__, ...); ``_`` is the interactive/gettext slot and may be set honestly
_BUILTINS = [(n, o) for n, o in sorted(builtins.__dict__.items()) if n != "_"]


def _check_builtins():
    d = builtins.__dict__
    for name, obj in _BUILTINS:
        if d.get(name, _BUILTINS) is not obj:
            _problem("replaced builtins." + name)


def _current(owner, attr):
    d = getattr(owner, "__dict__", {})
    return d[attr] if attr in d else getattr(owner, attr, None)


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
_emit(
    "start",
    py=sys.version.split()[0],
    pytest=getattr(pytest, "__version__", "?"),
    cwd=_CWD,
    audit=_AUDIT,
)


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


_PROBLEMS = set()


def _problem(what):
    if what not in _PROBLEMS and len(_PROBLEMS) < 50:
        _PROBLEMS.add(what)
        _emit("problem", what=what)


_FUNCS = {}  # node id -> (function, code object) as collected


def _test_function(item):
    """The function a test item runs, as its class or the collected item holds it now; None when it has none."""
    try:
        cls = getattr(item, "cls", None)
        name = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
        if cls is not None:
            fn = cls.__dict__.get(name) if name in getattr(cls, "__dict__", {}) else getattr(cls, name, None)
        else:
            fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)
        if fn is None or not hasattr(fn, "__code__"):
            return None
        return fn, fn.__code__
    except Exception:
        return None


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_collection_finish(session):
    yield
    for item in getattr(session, "items", []):
        got = _test_function(item)
        if got is not None:
            _FUNCS[item.nodeid] = got


def _check_before(item):
    """The test's function and code object are the ones collected; the watched objects are the ones seen first."""
    seen = _FUNCS.get(item.nodeid)
    if seen is not None:
        now = _test_function(item)
        if now is None or now[0] is not seen[0]:
            _problem("the test function of %s was replaced before it ran" % item.nodeid)
        elif now[1] is not seen[1]:
            _problem("the code object of %s was replaced before it ran" % item.nodeid)
    for name, owner, attr, obj in _OWNERS:
        try:
            if _current(owner, attr) is not obj:
                _problem("replaced " + name)
        except Exception:
            _problem("replaced " + name)
    _check_builtins()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    _check_before(item)
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    raw, origin = _raw(call)
    outcome = yield
    sub = False
    try:
        rep = outcome.get_result()
        out = getattr(rep, "outcome", "?")
        xf = hasattr(rep, "wasxfail")
        sub = type(rep).__name__ == "SubtestReport" or hasattr(rep, "context")
    except Exception as e:
        out, xf = "raised:" + type(e).__name__, False
    _emit("call", id=item.nodeid, when=call.when, raw=raw, origin=origin, out=out, xf=xf, sub=sub)


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
    d = builtins.__dict__
    for name, obj in _BUILTINS:
        if d.get(name, _BUILTINS) is not obj:
            problems.append("replaced builtins." + name)
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
