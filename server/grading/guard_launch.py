# ruff: noqa
# pyright: basic
"""swe-gym grading launcher: how pytest is started in a grading sandbox, so that nothing in the tree configures it
and nothing the test process does can rewrite what it recorded.

This file is *data* for the app: it is copied into the grading sandbox (``<guard>/swe_gym_launch.py``) and run by the
task's own Python (any 3.x), never imported by the server. Stdlib only; no f-strings or annotations.

Three modes, all started by the grading script (``script.py``):

``resolve GUARD -- ARGS``
    Run at base_commit, before a byte of the model patch is in the tree. Writes ``GUARD/setup.json``: the rootdir,
    the configuration file and the conftest cut-off pytest itself determines for ``ARGS`` at base_commit (a copy of the
    file goes to ``GUARD/cfg/``), and the ``pytest11`` entry points the environment installs. The test run reads its
    settings from that copy only (``-c``), never from a file of the patch.

``run GUARD MODE -- ARGS`` (the collector)
    Reads the record key from ``GUARD/key`` and deletes it, makes itself non-dumpable (no process of the same user can
    read its memory or trace it), then starts the test process as a *fresh* interpreter (``child`` below: it never has
    the key) with the write end of a pipe. Every line the guard plugin writes arrives here the moment it is written and
    is appended to ``GUARD/record`` with a sequence number and an HMAC chain under the key the test process never
    held: rewriting the record after the fact cannot produce a valid chain. When the test process exits, an ``exit``
    line ends the chain (what is in the pipe by then is read first; nothing after it is).

``child GUARD MODE -- ARGS`` (the test process)
    Imports the guard plugin, pytest and pluggy before any file of the tree can be imported: the tree's folder is not
    on ``sys.path`` yet (MODE ``module``, the task ran ``python -m pytest``: it goes in after the standard library,
    never before it). pytest's entry-point autoloading loads exactly the base_commit's list, by name, as pluggy would;
    then pytest runs with the guard registered first and ``-c <pinned copy> --rootdir <base rootdir> --confcutdir
    <base cut-off>``.
"""

import hashlib
import hmac
import json
import os
import select
import shutil
import subprocess
import sys
import threading

LINE_LIMIT = 1024 * 1024
RECORD_LIMIT = 15 * 1024 * 1024


def _split(argv):
    """(GUARD, MODE or None, ARGS) from ``GUARD [MODE] -- ARGS``."""
    i = argv.index("--")
    head, args = argv[:i], argv[i + 1 :]
    return head[0], (head[1] if len(head) > 1 else None), args


# -- resolve -------------------------------------------------------------------------------------------------------
def _option_values(args, names):
    """Every value of ``names`` in pytest's argv, in order."""
    out = []
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                out.append(args[i + 1])
            elif n.startswith("--") and a.startswith(n + "="):
                out.append(a[len(n) + 1 :])
            elif not n.startswith("--") and a.startswith(n) and len(a) > len(n):
                out.append(a[len(n) :])
    return out


def _option_value(args, names):
    """The last value of ``names`` in pytest's argv (``-c F``, ``-cF``, ``--rootdir=D``), else None."""
    values = _option_values(args, names)
    return values[-1] if values else None


def _determine_setup(args):
    """(rootdir, inifile or None) as this pytest determines them for ``args`` in the working directory."""
    import inspect
    from pathlib import Path

    from _pytest.config import findpaths

    fn = findpaths.determine_setup
    params = inspect.signature(fn).parameters
    inifile = _option_value(args, ["-c", "--config-file", "--inifile"])
    rootdir_arg = _option_value(args, ["--rootdir"])
    kwargs = {}
    if "inifile" in params:
        kwargs["inifile"] = inifile
    if "args" in params:
        kwargs["args"] = [str(a) for a in args]
    if "rootdir_cmd_arg" in params:
        kwargs["rootdir_cmd_arg"] = rootdir_arg
    if "invocation_dir" in params:
        kwargs["invocation_dir"] = Path.cwd()
    if "config" in params:
        kwargs["config"] = None
    if "override_ini" in params:  # pytest >= 9: -o values can name the config
        kwargs["override_ini"] = _option_values(args, ["-o", "--override-ini"]) or None
    got = fn(**kwargs)
    rootdir, inipath = got[0], got[1]
    return str(rootdir), (str(inipath) if inipath else None)


def _entry_points():
    """[(name, module, attr)] of every ``pytest11`` entry point the environment installs, in pluggy's order."""
    out = []
    seen = set()
    try:
        import importlib.metadata as md
    except ImportError:
        md = None
    if md is not None:
        for dist in list(md.distributions()):
            for ep in getattr(dist, "entry_points", []):
                if ep.group != "pytest11" or ep.name in seen:
                    continue
                seen.add(ep.name)
                module, _, attr = ep.value.partition(":")
                out.append([ep.name, module.strip(), attr.strip()])
        return out
    try:
        import pkg_resources  # type: ignore[import-not-found]  # Python < 3.8 only
    except ImportError:
        return out
    for ep in pkg_resources.iter_entry_points("pytest11"):
        if ep.name not in seen:
            seen.add(ep.name)
            out.append([ep.name, ep.module_name, ".".join(ep.attrs or ())])
    return out


def resolve(guard, mode, args):
    """Exit 0 with ``setup.json`` written, or 3 naming what could not be determined (grading stops: infra, loud)."""
    if mode == "module":
        _tree_after_stdlib()
    cfg = os.path.join(guard, "cfg")
    os.makedirs(cfg, exist_ok=True)
    try:
        rootdir, ini = _determine_setup(args)
        plugins = _entry_points()
    except Exception as e:
        sys.stderr.write("swe-gym: pytest's setup at base_commit: %s: %s\n" % (type(e).__name__, e))
        return 3
    setup = {"rootdir": rootdir, "confcutdir": os.path.dirname(ini) if ini else rootdir, "plugins": plugins}
    if ini:
        setup["ini"] = os.path.join(cfg, os.path.basename(ini))
        shutil.copyfile(ini, setup["ini"])
    else:  # no configuration at base_commit: none at grading either (an empty one, pinned)
        setup["ini"] = os.path.join(cfg, "pytest.ini")
        with open(setup["ini"], "w") as f:
            f.write("[pytest]\n")
    with open(os.path.join(guard, "setup.json"), "w") as f:
        json.dump(setup, f)
    return 0


# -- run: the collector --------------------------------------------------------------------------------------------
def _no_dump():
    """PR_SET_DUMPABLE 0: a process of the same user can neither ptrace this one nor read its /proc/<pid>/mem."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE = 4
    except Exception:
        return False


class _Chain:
    def __init__(self, path, key):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.key = key
        self.prev = ""
        self.n = 0
        self.size = 0

    def add(self, payload):
        mac = hmac.new(self.key, (self.prev + str(self.n) + "\n" + payload).encode("utf-8"), hashlib.sha256)
        self.prev = mac.hexdigest()
        line = json.dumps({"n": self.n, "p": payload, "mac": self.prev}, separators=(",", ":")) + "\n"
        self.n += 1
        data = line.encode("utf-8")
        self.size += len(data)
        try:
            os.write(self.fd, data)
        except OSError:
            pass

    def note(self, kind, **fields):
        fields["k"] = kind
        self.add(json.dumps(fields, sort_keys=True, separators=(",", ":")))


def run(guard, mode, args):
    key_path = os.path.join(guard, "key")
    with open(key_path, "rb") as f:
        key = f.read().strip()
    os.unlink(key_path)
    dumpable_off = _no_dump()
    chain = _Chain(os.path.join(guard, "record"), key)
    key = None
    chain.note("collector", no_dump=dumpable_off, py=sys.version.split()[0])
    r, w = os.pipe()
    env = dict(os.environ)
    env["SWE_GYM_GUARD_FD"] = str(w)
    env.pop("PYTEST_PLUGINS", None)
    env.pop("PYTEST_ADDOPTS", None)
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # the interpreter's own flags
    argv = [sys.executable] + flags + [os.path.abspath(sys.argv[0]), "child", guard, mode, "--"] + list(args)
    child = subprocess.Popen(argv, pass_fds=(w,), env=env)
    os.close(w)
    done = threading.Event()

    def wait():
        child.wait()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    import time

    buf = b""
    drain_until = None  # once the test process exited: what is already in the pipe, then the chain ends
    while True:
        if done.is_set() and drain_until is None:
            drain_until = time.time() + 0.5
        timeout = 0.2 if drain_until is None else drain_until - time.time()
        if timeout <= 0:
            break
        ready, _, _ = select.select([r], [], [], timeout)
        if not ready:
            continue
        data = os.read(r, 65536)
        if not data:
            done.wait()
            break
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            chain.add(line.decode("utf-8", "replace"))
        if len(buf) > LINE_LIMIT:
            chain.note("overlong", size=len(buf))
            buf = b""
        if chain.size > RECORD_LIMIT:
            chain.note("overflow")
            break
    if buf:
        chain.add(buf.decode("utf-8", "replace"))
    rc = child.wait()
    chain.note("exit", rc=rc)
    return rc if rc >= 0 else 128 - rc


# -- child: the test process ---------------------------------------------------------------------------------------
def _tree_after_stdlib():
    """``python -m pytest`` puts the working directory first on sys.path; here it goes in after the standard
    library (before the installed packages, as the tree's own package would be found first)."""
    here = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", here)]
    for i, p in enumerate(sys.path):
        if "site-packages" in p or "dist-packages" in p:
            sys.path.insert(i, here)
            return
    sys.path.append(here)


def _pin_autoload(plugins):
    """pluggy's entry-point loading, limited to the base_commit's list (by name, blocked names skipped)."""
    import pluggy

    def load_setuptools_entrypoints(self, group, name=None):
        if group != "pytest11":
            return 0
        count = 0
        for ep_name, module, attr in plugins:
            if (name is not None and ep_name != name) or self.get_plugin(ep_name) or self.is_blocked(ep_name):
                continue
            plugin = __import__(module, fromlist=["_"])
            for part in [a for a in attr.split(".") if a]:
                plugin = getattr(plugin, part)
            self.register(plugin, name=ep_name)
            count += 1
        return count

    pluggy.PluginManager.load_setuptools_entrypoints = load_setuptools_entrypoints


def child(guard, mode, args):
    here = os.path.dirname(os.path.abspath(sys.argv[0]))  # this script's folder: the guard's
    import swe_gym_guard  # type: ignore[import-not-found]  # the guard plugin beside this file (SWE_GYM_GUARD_FD)
    import pytest
    import _pytest.config
    import pluggy  # noqa: F401

    with open(os.path.join(guard, "setup.json")) as f:
        setup = json.load(f)
    _pin_autoload(setup.get("plugins") or [])
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # nothing more from the guard folder
    if mode == "module":
        _tree_after_stdlib()
    argv = ["-c", setup["ini"], "--rootdir", setup["rootdir"], "--confcutdir", setup["confcutdir"]] + list(args)
    sys.argv = [os.path.join(os.path.dirname(pytest.__spec__.origin), "__main__.py") if mode == "module" else "pytest"]
    sys.argv += argv
    # the guard goes in as an object, registered before pytest reads a single option (as -p would, and without
    # pytest's warning that an already imported module cannot be rewritten: an error under filterwarnings=error)
    code = pytest.main(argv, plugins=[swe_gym_guard])
    try:
        sys.stdout.flush()
    except Exception:
        pass
    return int(code)


def launch(argv):
    if not argv or argv[0] not in ("resolve", "run", "child"):
        sys.stderr.write("usage: swe_gym_launch.py resolve|run|child GUARD [MODE] -- ARGS\n")
        return 2
    guard, mode, args = _split(argv[1:])
    if argv[0] == "resolve":
        return resolve(guard, mode, args)
    if argv[0] == "run":
        return run(guard, mode, args)
    return child(guard, mode, args)


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
