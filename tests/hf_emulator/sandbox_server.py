"""Stand-in for HF's `sbx-server` (sandbox-server protocol 3), injected into each emulated HF Job container.

Speaks the wire contract `huggingface_hub/_sandbox.py` (2.4) drives: `/health`, and under `/v1` (a dedicated job)
or `/v1/sandboxes/<local_id>` (a pool host's sandbox): `exec` (NDJSON events), `processes`, `files/*`, `proxy/<port>`;
plus the pool routes `/v1/sandboxes` (list/create), `/v1/sandboxes/<id>` (delete), `/v1/sandboxes/<id>/token`.
Configured like the real binary, from the job env: `SBX_TOKEN` (secret, the derived sandbox token), `SBX_IDLE_TIMEOUT`,
`SBX_HOST_MODE`, `SBX_CAPACITY`; the emulator adds `HFEMU_PORT` (TLS listen port on 127.0.0.1) and `HFEMU_TLS_DIR`.
A pool sandbox is a uid (20000+n) with its own home and tmp dir; its commands run through this file re-executed as
`--confine SPEC` (drop to the uid, `no_new_privs`, a Landlock ruleset: read/execute everywhere, write only its dirs,
no TCP bind). Standalone and stdlib-only, Python >= 3.8: it runs inside arbitrary job images. Logs go to stdout.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import struct
import sys

PROTOCOL = 3
VERSION = "0.7.0-hfemu"
MAX_JSON_BYTES = 16 * 1024 * 1024
MAX_WRITE_BYTES = 64 * 1024 * 1024
PING_SECS = 15.0
EXIT_DRAIN_SECS = 1.0  # after the command exits, how long its pipes may stay open (a detached child holding them)
KEEP_FINISHED = 100
LIST_PAGE = 1000
MAX_COUNT = 256
UID_BASE = 20000
SANDBOX_ROOT = "/.hfemu-sandboxes"
ID_CHARS = set("0123456789abcdefghijklmnopqrstuvwxyz_-")


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} sbx-server: {msg}", flush=True)


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# -- Landlock (facts: linux/landlock.h; syscalls 444-446 on every 64-bit arch) --------------------------------------
LL_CREATE, LL_ADD_RULE, LL_RESTRICT = 444, 445, 446
FS_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read_file, read_dir
FS_DEV = (1 << 1) | (1 << 2)  # write_file, read_file (+ truncate/ioctl_dev when handled)
FILE_ONLY = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 14) | (1 << 15)  # the rights a rule on a non-directory may take
NET_BIND_TCP, SCOPE_ABSTRACT_UNIX = 1 << 0, 1 << 0
PR_SET_NO_NEW_PRIVS = 38
DEV_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts")


def _syscall(nr: int, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def landlock_abi() -> int:
    try:
        return _syscall(LL_CREATE, ctypes.c_void_p(None), 0, 1)
    except OSError:
        return 0


def landlock_ruleset(abi: int, writable: list[str]) -> int:
    """A ruleset fd: read/execute everywhere, write only under `writable` (+ a few device files), no TCP bind."""
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    if abi >= 6:
        attr = struct.pack("<QQQ", handled, NET_BIND_TCP, SCOPE_ABSTRACT_UNIX)
    elif abi >= 4:
        attr = struct.pack("<QQ", handled, NET_BIND_TCP)
    else:
        attr = struct.pack("<Q", handled)
    ruleset = _syscall(LL_CREATE, ctypes.create_string_buffer(attr, len(attr)), len(attr), 0)
    rules = [("/", FS_READ)] + [(p, handled) for p in writable] + [(p, FS_DEV | (3 << 14)) for p in DEV_FILES]
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            rights &= handled if stat.S_ISDIR(os.fstat(fd).st_mode) else handled & FILE_ONLY
            rule = struct.pack("<Qi", rights, fd)
            _syscall(LL_ADD_RULE, ruleset, 1, ctypes.create_string_buffer(rule, len(rule)), 0)
        finally:
            os.close(fd)
    return ruleset


def confine_main(spec_json: str) -> None:
    """`--confine SPEC`: become the sandbox's uid under its Landlock ruleset, then exec the command."""
    spec = json.loads(spec_json)
    abi = landlock_abi()
    ruleset = landlock_ruleset(abi, spec["writable"]) if abi > 0 else -1
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if ruleset >= 0:
        _syscall(LL_RESTRICT, ruleset, 0)
        os.close(ruleset)
    argv = spec["argv"]
    try:
        os.chdir(spec["cwd"])
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write(f"sbx: cannot run {argv[0]!r} in {spec['cwd']!r}: {e.strerror}\n")
        os._exit(127 if e.errno == errno.ENOENT else 126)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--confine":
    confine_main(sys.argv[2])  # a command's wrapper: never returns, and skips the server's imports (~0.3 s)

# The server's imports, after the wrapper's early exit on purpose.
import codecs  # noqa: E402
import hmac  # noqa: E402
import http.client  # noqa: E402
import posixpath  # noqa: E402
import secrets  # noqa: E402
import selectors  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402
from urllib.parse import parse_qs, unquote, urlsplit  # noqa: E402


# -- file operations -------------------------------------------------------------------------------------------------
class Files:
    """The files API over one root: a pool sandbox's home (paths lexically rooted there, no symlink followed on any
    component, new files owned by its uid) or, for a dedicated job, the whole container filesystem."""

    def __init__(self, home: str | None, uid: int = 0) -> None:
        self.home = home
        self.uid = uid
        self.nofollow = os.O_NOFOLLOW if home is not None else 0

    def _parts(self, path: str) -> list[str]:
        if not path or "\0" in path:
            raise ApiError(400, "a non-empty path without NUL bytes is required")
        if self.home is None and not path.startswith("/"):
            path = os.path.join(os.getcwd(), path)
        return [p for p in posixpath.normpath("/" + path).split("/") if p]

    def shown(self, parts: list[str]) -> str:
        return "/" + "/".join(parts)

    def _open_dir(self, parts: list[str], create: bool) -> int:
        """An fd on the directory `parts` under the root, walked one component at a time.

        With `create`, a missing component is made like `mkdir -p` does, and race-free: requests run concurrently
        (the SDK writes a large file as parallel ranged PUTs, each creating the parents), so a component another
        request made between our open and our mkdir is simply opened. Whoever made it, it is opened the same way
        (O_NOFOLLOW in a pool home), so a symlink or a file planted there is still refused."""
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | self.nofollow
        fd = os.open(self.home or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError as exists:  # made concurrently, or a dangling symlink (dedicated)
                        try:
                            nxt = os.open(part, flags, dir_fd=fd)
                        except FileNotFoundError:
                            raise exists from None  # a dangling symlink: what mkdir said, as before
                    else:
                        if self.home is not None:  # only what we made: never chown another's entry
                            os.chown(part, self.uid, self.uid, dir_fd=fd, follow_symlinks=False)
                        nxt = os.open(part, flags, dir_fd=fd)
                os.close(fd)
                fd = nxt
            return fd
        except BaseException:
            os.close(fd)
            raise

    def locate(self, path: str, create_parents: bool = False) -> tuple[int, str, list[str]]:
        """(fd of the parent directory, final name or '.', parts): the caller closes the fd."""
        parts = self._parts(path)
        if not parts:
            return self._open_dir([], False), ".", parts
        return self._open_dir(parts[:-1], create_parents), parts[-1], parts

    def entry(self, dir_fd: int, name: str, parts: list[str]) -> dict:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
        return {
            "name": parts[-1] if parts else "/",
            "path": self.shown(parts),
            "type": kind,
            "size": st.st_size,
            "mtime_ms": int(st.st_mtime * 1000),
            "mode": format(stat.S_IMODE(st.st_mode), "04o"),
        }

    def stat(self, path: str) -> dict:
        fd, name, parts = self.locate(path)
        try:
            return self.entry(fd, name, parts)
        finally:
            os.close(fd)

    def open_read(self, path: str) -> int:
        fd, name, _ = self.locate(path)
        try:
            f = os.open(name, os.O_RDONLY | os.O_CLOEXEC | self.nofollow, dir_fd=fd)
        finally:
            os.close(fd)
        if stat.S_ISDIR(os.fstat(f).st_mode):
            os.close(f)
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        return f

    def open_write(self, path: str, offset: int | None, mode: int | None) -> int:
        fd, name, _ = self.locate(path, create_parents=True)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | self.nofollow | (os.O_TRUNC if offset is None else 0)
            f = os.open(name, flags, 0o644 if mode is None else mode, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            if self.home is not None:
                os.fchown(f, self.uid, self.uid)
            if mode is not None:
                os.fchmod(f, mode)
        except BaseException:
            os.close(f)
            raise
        return f

    def list(self, path: str, after: str | None) -> dict:
        fd, name, parts = self.locate(path)
        try:
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | self.nofollow, dir_fd=fd)
        finally:
            os.close(fd)
        try:
            names = sorted(n for n in os.listdir(d) if after is None or n > after)
            page = names[:LIST_PAGE]
            entries = []
            for n in page:
                try:
                    entries.append(self.entry(d, n, [*parts, n]))
                except FileNotFoundError:
                    continue  # removed while listing
        finally:
            os.close(d)
        return {"entries": entries, "next": page[-1] if len(names) > LIST_PAGE else None}

    def mkdir(self, path: str) -> None:
        parts = self._parts(path)
        if parts:
            os.close(self._open_dir(parts, create=True))

    def delete(self, path: str, recursive: bool) -> None:
        fd, name, parts = self.locate(path)
        try:
            if not parts:
                raise ApiError(400, "refusing to delete the root")
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
            elif recursive:
                _rmtree_at(fd, name)
            else:
                os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)


def _rmtree_at(parent_fd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        for child in os.listdir(fd):
            if stat.S_ISDIR(os.stat(child, dir_fd=fd, follow_symlinks=False).st_mode):
                _rmtree_at(fd, child)
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


# -- where commands run ----------------------------------------------------------------------------------------------
class Proc:
    def __init__(self, popen: subprocess.Popen, cmd: object) -> None:
        self.id = "p_" + secrets.token_hex(8)
        self.popen = popen
        self.cmd = cmd
        self.started_at_ms = int(time.time() * 1000)

    def view(self) -> dict:
        rc = self.popen.poll()
        return {
            "id": self.id,
            "pid": self.popen.pid,
            "cmd": self.cmd,
            "tag": None,
            "started_at_ms": self.started_at_ms,
            "running": rc is None,
            "exit_code": rc,
        }


CHILDREN: dict[int, subprocess.Popen] = {}  # every command we started, so the orphan reaper leaves them alone
CHILDREN_LOCK = threading.Lock()


def _popen(argv: list[str], env: dict, cwd: str, pipes: dict) -> subprocess.Popen:
    try:
        with CHILDREN_LOCK:
            p = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True, close_fds=True, **pipes)
            CHILDREN[p.pid] = p
        return p
    except ValueError as e:  # a NUL byte in argv or env
        raise ApiError(400, f"invalid command or environment: {e}") from None


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Space:
    """One place commands run: the dedicated job (as root, in the server's cwd) or one pool sandbox (its uid)."""

    def __init__(self, base_env: dict, *, local_id: str | None = None, uid: int = 0, env: dict | None = None,
                 idle_timeout: float | None = None, confine_script: str = "") -> None:  # fmt: skip
        self.local_id = local_id
        self.uid = uid
        self.token = secrets.token_hex(32)
        self.idle_timeout = idle_timeout
        self.confine_script = confine_script
        self.procs: dict[str, Proc] = {}
        self.lock = threading.Lock()
        self.last_activity = time.monotonic()
        self.created_at_ms = int(time.time() * 1000)
        self.env = dict(base_env)
        if local_id is None:
            self.home, self.tmp = None, None
            self.cwd = os.getcwd()
        else:
            self.home = posixpath.join(SANDBOX_ROOT, local_id)
            self.tmp = f"/tmp/sbx-{local_id}"
            self.cwd = self.home
            for d in (self.home, self.tmp, posixpath.join(self.tmp, "proxy")):
                os.mkdir(d, 0o700)
                os.chown(d, uid, uid)
            self.env.update(HOME=self.home, TMPDIR=self.tmp, USER=f"sbx{uid}", SBX_PROXY_DIR=self.tmp + "/proxy")
        self.env.update({str(k): str(v) for k, v in (env or {}).items()})
        self.files = Files(self.home, uid)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def busy(self) -> bool:
        with self.lock:
            return any(p.popen.poll() is None for p in self.procs.values())

    def argv(self, body: dict) -> list[str]:
        cmd, shell = body.get("cmd"), body.get("shell")
        if isinstance(cmd, str) and shell is not False:
            return ["/bin/sh", "-c", cmd]
        if isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd) and shell is not True:
            return list(cmd)
        raise ApiError(400, "`cmd` must be a shell string (shell unset/true) or an argv list (shell unset/false)")

    def spawn(self, body: dict, **pipes: object) -> subprocess.Popen:
        argv = self.argv(body)
        extra = body.get("env") or {}
        if not isinstance(extra, dict):
            raise ApiError(400, "`env` must be an object")
        env = dict(self.env)
        env.update({str(k): str(v) for k, v in extra.items()})
        cwd = body.get("cwd") or self.cwd
        if not isinstance(cwd, str):
            raise ApiError(400, "`cwd` must be a string")
        if self.home is not None and not cwd.startswith("/"):
            cwd = posixpath.join(self.home, cwd)
        if not os.path.isdir(cwd):
            raise ApiError(400, f"cwd {cwd!r} is not a directory")
        if self.local_id is not None:
            spec = json.dumps({"uid": self.uid, "argv": argv, "cwd": cwd, "writable": [self.home, self.tmp]})
            return _popen([sys.executable, "-I", "-S", self.confine_script, "--confine", spec], env, "/", pipes)
        try:
            return _popen(argv, env, cwd, pipes)
        except OSError as e:  # like the confined path and a shell: report it as the command's own failure
            code = "127" if e.errno == errno.ENOENT else "126"
            why = ["/bin/sh", "-c", 'echo "sbx: cannot run $0: $1" >&2; exit $2', argv[0], e.strerror, code]
            return _popen(why, env, cwd, pipes)

    def start_background(self, body: dict) -> dict:
        p = self.spawn(body, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = Proc(p, body.get("cmd"))
        with self.lock:
            self.procs[proc.id] = proc
            done = [k for k, v in self.procs.items() if v.popen.poll() is not None]
            for k in done[: max(0, len(done) - KEEP_FINISHED)]:
                del self.procs[k]
        log(f"{self.name()}: background {proc.id} pid {p.pid}")
        return {"id": proc.id, "pid": p.pid, "tag": None}

    def kill_process(self, proc_id: str) -> bool:
        with self.lock:
            proc = self.procs.get(proc_id)
        if proc is None:
            raise ApiError(404, f"no process {proc_id!r}")
        if proc.popen.poll() is not None:
            return False
        _killpg(proc.popen.pid, signal.SIGTERM)
        try:
            proc.popen.wait(2.0)
        except subprocess.TimeoutExpired:
            _killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(5.0)
        return True

    def name(self) -> str:
        return "job" if self.local_id is None else f"sandbox {self.local_id} (uid {self.uid})"

    def destroy(self) -> None:
        """Kill everything the sandbox's uid runs, then remove its directories."""
        for _ in range(20):
            pids = _pids_of_uid(self.uid)
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        with self.lock:
            for proc in self.procs.values():
                _killpg(proc.popen.pid, signal.SIGKILL)
                try:
                    proc.popen.wait(2.0)
                except subprocess.TimeoutExpired:
                    pass
        for d in (self.home, self.tmp):
            if d:
                shutil.rmtree(d, ignore_errors=True)


def _pids_of_uid(uid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            out.append(int(entry))
                        break
        except OSError:
            continue
    return out


# -- the server ------------------------------------------------------------------------------------------------------
class State:
    def __init__(self) -> None:
        env = os.environ
        self.token = env.get("SBX_TOKEN", "")
        if not self.token:
            raise SystemExit("sbx-server: SBX_TOKEN is not set; refusing to serve unauthenticated")
        idle = env.get("SBX_IDLE_TIMEOUT")
        self.idle_timeout = float(idle) if idle else None
        self.host_mode = env.get("SBX_HOST_MODE") == "1"
        self.capacity = int(env.get("SBX_CAPACITY", "50"))
        self.base_env = {k: v for k, v in env.items() if not k.startswith(("SBX_", "HFEMU_"))}
        self.lock = threading.Lock()
        self.sandboxes: dict[str, Space] = {}
        self.next_uid = UID_BASE
        self.started = time.monotonic()
        self.empty_since = time.monotonic()
        self.job = None if self.host_mode else Space(self.base_env)
        self.confine_script = ""
        self.landlock = landlock_abi()
        if self.host_mode:
            os.makedirs(SANDBOX_ROOT, exist_ok=True)
            os.chmod(SANDBOX_ROOT, 0o711)
            self.confine_script = posixpath.join(SANDBOX_ROOT, ".confine.py")
            shutil.copyfile(os.path.abspath(__file__), self.confine_script)
            os.chmod(self.confine_script, 0o644)

    def activity(self) -> None:
        if self.job is not None:
            self.job.touch()

    def create(self, body: dict) -> dict:
        count = body.get("count", 1)
        idle = body.get("idle_timeout_secs")
        env = body.get("env") or {}
        if not isinstance(count, int) or not 1 <= count <= MAX_COUNT or not isinstance(env, dict):
            raise ApiError(400, f"`count` must be an integer in 1..{MAX_COUNT} and `env` an object")
        if idle is not None and not isinstance(idle, (int, float)):
            raise ApiError(400, "`idle_timeout_secs` must be a number")
        made = []
        with self.lock:
            room = max(0, self.capacity - len(self.sandboxes))
            for _ in range(min(count, room)):
                local_id = secrets.token_hex(6)
                space = Space(self.base_env, local_id=local_id, uid=self.next_uid, env=env, idle_timeout=idle,
                              confine_script=self.confine_script)  # fmt: skip
                self.next_uid += 1
                self.sandboxes[local_id] = space
                made.append({"id": local_id, "token": space.token})
                log(f"created {space.name()}")
        return {"sandboxes": made, "rejected": count - len(made)}

    def delete(self, local_id: str) -> None:
        with self.lock:
            space = self.sandboxes.pop(local_id, None)
            if not self.sandboxes:
                self.empty_since = time.monotonic()
        if space is None:
            raise ApiError(404, f"no sandbox {local_id!r}")
        space.destroy()
        log(f"deleted {space.name()}")

    def watchdog(self, server: ThreadingHTTPServer) -> None:
        while True:
            time.sleep(0.5)
            _reap_orphans()
            for space in [self.job, *self.sandboxes.values()]:
                if space is not None and space.busy():
                    space.touch()  # a running background process is activity: the idle clock starts when it ends
            now = time.monotonic()
            if self.job is not None and self.idle_timeout is not None:
                if now - self.job.last_activity > self.idle_timeout:
                    return shutdown(self, server, f"idle for {self.idle_timeout:g}s")
            for local_id, space in list(self.sandboxes.items()):
                if space.idle_timeout is not None and now - space.last_activity > space.idle_timeout:
                    log(f"evicting idle {space.name()}")
                    try:
                        self.delete(local_id)
                    except ApiError:
                        pass
            if self.host_mode and self.idle_timeout is not None and not self.sandboxes:
                if now - self.empty_since > self.idle_timeout:
                    return shutdown(self, server, f"host empty for {self.idle_timeout:g}s")


def _reap_orphans() -> None:
    """We are PID 1 of the job container: reap zombies that are not our own tracked children."""
    if os.getpid() != 1:
        return
    with CHILDREN_LOCK:
        for pid in [pid for pid, p in CHILDREN.items() if p.returncode is not None]:
            del CHILDREN[pid]
        tracked = set(CHILDREN)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in tracked:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z" and fields[1] == "1":
                os.waitpid(int(entry), os.WNOHANG)
        except (OSError, IndexError):
            continue


def shutdown(state: State, server: ThreadingHTTPServer, why: str) -> None:
    log(f"shutting down: {why}")
    for space in [state.job, *state.sandboxes.values()]:
        if space is not None:
            with space.lock:
                for proc in space.procs.values():
                    _killpg(proc.popen.pid, signal.SIGKILL)
    for local_id in list(state.sandboxes):
        try:
            state.delete(local_id)
        except ApiError:
            pass
    threading.Thread(target=server.shutdown, daemon=True).start()


# -- HTTP --------------------------------------------------------------------------------------------------------------
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer",
               "host", "content-length", "authorization", "x-sandbox-token"}  # fmt: skip


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=60)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        sock.connect(self.unix_path)
        self.sock = sock


def _int_param(q: dict, name: str) -> int | None:
    raw = q.get(name, [None])[0]
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"`{name}` must be an integer") from None
    if value < 0:
        raise ApiError(400, f"`{name}` must be >= 0")
    return value


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sbx-server-hfemu/" + VERSION
    timeout = 300  # an idle keep-alive connection is dropped after this
    state: State

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_GET

    # -- plumbing
    def dispatch(self) -> None:
        self.streaming = False
        self.body_read = False
        url = urlsplit(self.path)
        self.query = parse_qs(url.query, keep_blank_values=True)
        status = 500
        try:
            status = self.route(self.command, unquote(url.path), url.query)
        except ApiError as e:
            status = e.status
            self.fail(e.status, e.message)
        except FileNotFoundError as e:
            status = 404
            self.fail(404, f"no such file or directory: {e.filename or ''}".rstrip(": "))
        except (NotADirectoryError, IsADirectoryError) as e:
            status = 400
            self.fail(400, e.strerror or str(e))
        except FileExistsError as e:
            status = 409
            self.fail(409, e.strerror or str(e))
        except PermissionError as e:
            status = 403
            self.fail(403, e.strerror or str(e))
        except OSError as e:
            if e.errno == errno.ELOOP:
                status = 400
                self.fail(400, "the file API refuses symlinks")
            elif e.errno == errno.ENOTEMPTY:
                status = 409
                self.fail(409, "directory not empty (pass recursive)")
            elif isinstance(e, (BrokenPipeError, ConnectionResetError, ssl.SSLError, TimeoutError)):
                self.close_connection = True
            else:
                log(f"{self.command} {url.path}: {e!r}")
                self.fail(500, f"internal error: {e}")
        except Exception as e:
            log(f"{self.command} {url.path}: {e!r}")
            self.fail(500, f"internal error: {e}")
        if url.path != "/health":
            log(f"{self.command} {url.path} -> {status}")

    def fail(self, status: int, message: str) -> None:
        if self.streaming:
            self.close_connection = True
            return
        if not self.body_read:
            # Consume an unread body (up to the JSON bound) so closing cannot reset the answer away; past it, close.
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                n = -1
            if 0 <= n <= MAX_JSON_BYTES and "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                self.rfile.read(n)
                self.body_read = True
            else:
                self.close_connection = True
        self.send_json(status, {"error": message})

    def send_json(self, status: int, obj: object) -> int:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        return status

    def body_length(self, limit: int) -> int:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise ApiError(411, "chunked request bodies are not supported; send Content-Length")
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise ApiError(400, "bad Content-Length") from None
        if n < 0 or n > limit:
            raise ApiError(413, f"request body of {n} bytes exceeds the {limit}-byte limit")
        return n

    def read_body(self, limit: int) -> bytes:
        n = self.body_length(limit)
        data = self.rfile.read(n) if n else b""
        if len(data) != n:
            raise ApiError(400, "request body shorter than Content-Length")
        self.body_read = True
        return data

    def read_json(self) -> dict:
        raw = self.read_body(MAX_JSON_BYTES)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise ApiError(400, "request body is not JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body

    def start_stream(self, status: int, ctype: str, headers: list | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        for k, v in headers or []:
            self.send_header(k, v)
        self.end_headers()
        self.streaming = True

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.streaming = False

    def require_token(self, *allowed: str) -> str:
        got = self.headers.get("X-Sandbox-Token") or ""
        if not got:
            raise ApiError(401, "missing X-Sandbox-Token")
        for token in allowed:
            if token and hmac.compare_digest(got.encode(), token.encode()):
                return token
        raise ApiError(403, "invalid sandbox token")

    # -- routes
    def route(self, method: str, path: str, query: str) -> int:
        st = self.state
        if path == "/health":
            body = {"status": "ok", "protocol": PROTOCOL, "version": VERSION,
                    "mode": "pool" if st.host_mode else "dedicated"}  # fmt: skip
            if st.host_mode:
                body.update(capacity=st.capacity, sandboxes=len(st.sandboxes), landlock_abi=st.landlock)
            return self.send_json(200, body)
        if not path.startswith("/v1/"):
            raise ApiError(404, f"no route {method} {path}")
        rest = path[len("/v1/") :]
        if rest == "sandboxes" or rest.startswith("sandboxes/"):
            if not st.host_mode:
                raise ApiError(404, "this is a dedicated sandbox, not a pool host")
            return self.pool_route(method, rest.split("/", 2)[1:], query)
        if st.host_mode or st.job is None:
            raise ApiError(404, "this is a pool host: address a sandbox under /v1/sandboxes/<id>/")
        self.require_token(st.token)
        st.job.touch()
        return self.resource(st.job, method, rest, query)

    def pool_route(self, method: str, parts: list[str], query: str) -> int:
        st = self.state
        if not parts:
            self.require_token(st.token)
            if method == "GET":
                with st.lock:
                    items = [{"id": k, "uid": s.uid, "created_at_ms": s.created_at_ms} for k, s in st.sandboxes.items()]
                return self.send_json(200, items)
            if method == "POST":
                return self.send_json(200, st.create(self.read_json()))
            raise ApiError(405, f"{method} not allowed on /v1/sandboxes")
        local_id = parts[0]
        if not local_id or not set(local_id) <= ID_CHARS:
            raise ApiError(400, "malformed sandbox id")
        space = st.sandboxes.get(local_id)
        if space is None:
            if not self.headers.get("X-Sandbox-Token"):
                raise ApiError(401, "missing X-Sandbox-Token")
            raise ApiError(404, f"no sandbox {local_id!r} on this host")
        if len(parts) == 1:
            self.require_token(st.token, space.token)
            if method != "DELETE":
                raise ApiError(405, f"{method} not allowed on a sandbox")
            st.delete(local_id)
            return self.send_json(200, {"deleted": True})
        if parts[1] == "token":
            self.require_token(st.token)
            return self.send_json(200, {"token": space.token})
        self.require_token(st.token, space.token)
        space.touch()
        return self.resource(space, method, parts[1], query)

    def resource(self, space: Space, method: str, rest: str, query: str) -> int:
        q = self.query
        path = q.get("path", [""])[0]
        key = (method, rest)
        if key == ("POST", "exec"):
            return self.exec_stream(space, self.read_json())
        if key == ("GET", "processes"):
            with space.lock:
                procs = [p.view() for p in space.procs.values()]
            return self.send_json(200, procs)
        if key == ("POST", "processes"):
            return self.send_json(200, space.start_background(self.read_json()))
        if method == "DELETE" and rest.startswith("processes/"):
            return self.send_json(200, {"killed": space.kill_process(rest[len("processes/") :])})
        if key == ("GET", "files/read"):
            return self.file_read(space, path, _int_param(q, "offset") or 0, _int_param(q, "length"))
        if key == ("PUT", "files/write"):
            return self.file_write(space, path, q)
        if key == ("GET", "files/stat"):
            return self.send_json(200, space.files.stat(path))
        if key == ("GET", "files/list"):
            return self.send_json(200, space.files.list(path, q.get("after", [None])[0]))
        if key == ("DELETE", "files/delete"):
            space.files.delete(path, q.get("recursive", [""])[0] in ("1", "true"))
            return self.send_json(200, {"deleted": True})
        if key == ("POST", "files/mkdir"):
            space.files.mkdir(path)
            return self.send_json(200, {"created": True})
        if rest.startswith("proxy/"):
            port, _, inner = rest[len("proxy/") :].partition("/")
            return self.proxy(space, port, inner, query)
        raise ApiError(404, f"no route {method} {rest}")

    # -- files
    def file_read(self, space: Space, path: str, offset: int, length: int | None) -> int:
        fd = space.files.open_read(path)
        try:
            size = os.fstat(fd).st_size
            n = max(0, size - offset) if length is None else max(0, min(length, size - offset))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.streaming = True
            pos, end = offset, offset + n
            while pos < end:
                data = os.pread(fd, min(1024 * 1024, end - pos), pos)
                if not data:  # the file shrank under us: the client sees a short body and says so
                    self.close_connection = True
                    break
                self.wfile.write(data)
                pos += len(data)
            self.streaming = False
        finally:
            os.close(fd)
        return 200

    def file_write(self, space: Space, path: str, q: dict) -> int:
        offset = _int_param(q, "offset")
        truncate_to = _int_param(q, "truncate_to")
        raw_mode = q.get("mode", [None])[0]
        try:
            mode = int(raw_mode, 8) if raw_mode else None
        except ValueError:
            raise ApiError(400, "`mode` must be octal, e.g. 755") from None
        if mode is not None and not 0 <= mode <= 0o7777:
            raise ApiError(400, "`mode` out of range")
        n = self.body_length(MAX_WRITE_BYTES)
        fd = space.files.open_write(path, offset, mode)
        try:
            pos, left = offset or 0, n
            while left:
                data = self.rfile.read(min(1024 * 1024, left))
                if not data:
                    raise ApiError(400, "request body shorter than Content-Length")
                os.pwrite(fd, data, pos)
                pos += len(data)
                left -= len(data)
            self.body_read = True
            if truncate_to is not None:
                os.ftruncate(fd, truncate_to)
        finally:
            os.close(fd)
        return self.send_json(200, {"written": n})

    # -- exec
    def exec_stream(self, space: Space, body: dict) -> int:
        timeout, stdin = body.get("timeout"), body.get("stdin")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ApiError(400, "`timeout` must be a positive number of seconds")
        if stdin is not None and not isinstance(stdin, str):
            raise ApiError(400, "`stdin` must be a string")
        pipe = subprocess.PIPE
        p = space.spawn(body, stdin=pipe if stdin is not None else subprocess.DEVNULL, stdout=pipe, stderr=pipe)
        started = time.monotonic()
        try:
            self.start_stream(200, "application/x-ndjson")
            if stdin is not None:
                threading.Thread(target=_feed, args=(p.stdin, stdin.encode()), daemon=True).start()
            timed_out = self.pump(p, started, timeout)
            rc = p.wait()
            event = {"event": "exit", "exit_code": rc if rc >= 0 else None, "signal": -rc if rc < 0 else None,
                     "timed_out": timed_out, "duration_ms": int((time.monotonic() - started) * 1000)}  # fmt: skip
            self.chunk(json.dumps(event).encode() + b"\n")
            self.end_stream()
        except BaseException:
            _killpg(p.pid, signal.SIGKILL)  # the caller is gone: so is its foreground command
            p.wait()
            raise
        finally:
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        return 200

    def pump(self, p: subprocess.Popen, started: float, timeout: float | None) -> bool:
        sel = selectors.DefaultSelector()
        decoders = {}
        for name, f in (("stdout", p.stdout), ("stderr", p.stderr)):
            sel.register(f, selectors.EVENT_READ, name)  # type: ignore[arg-type]
            decoders[name] = codecs.getincrementaldecoder("utf-8")("replace")
        last_sent, exited_at, timed_out = time.monotonic(), None, False
        try:
            while sel.get_map():
                for key, _ in sel.select(0.25):
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        text = decoders[key.data].decode(b"", final=True)
                    else:
                        text = decoders[key.data].decode(data)
                    if text:
                        self.chunk(json.dumps({"event": key.data, "data": text}).encode() + b"\n")
                        last_sent = time.monotonic()
                now = time.monotonic()
                if exited_at is None and p.poll() is not None:
                    exited_at = now
                if exited_at is not None and now - exited_at > EXIT_DRAIN_SECS:
                    break  # a detached descendant holds the pipes open; the command itself is done
                if timeout is not None and not timed_out and now - started > timeout:
                    _killpg(p.pid, signal.SIGKILL)
                    timed_out = True
                if now - last_sent > PING_SECS:
                    self.chunk(b'{"event": "ping"}\n')
                    last_sent = now
        finally:
            sel.close()
        return timed_out

    # -- port proxy
    def proxy(self, space: Space, port: str, inner: str, query: str) -> int:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ApiError(400, "bad port")
        if self.headers.get("Upgrade"):
            raise ApiError(501, "this emulated sandbox server does not proxy protocol upgrades (WebSocket)")
        body = self.read_body(MAX_WRITE_BYTES)
        if space.tmp is None:
            conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
        else:
            conn = UnixHTTPConnection(f"{space.tmp}/proxy/{int(port)}.sock")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
        try:
            conn.request(self.command, "/" + inner + ("?" + query if query else ""), body=body, headers=headers)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            raise ApiError(502, f"nothing answers on sandbox port {port}: {e.strerror or e}") from None
        try:
            keep = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_HEADERS]
            self.start_stream(resp.status, resp.getheader("Content-Type") or "application/octet-stream",
                              [(k, v) for k, v in keep if k.lower() != "content-type"])  # fmt: skip
            while True:
                data = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not data:
                    break
                self.chunk(data)
            self.end_stream()
        finally:
            conn.close()
        return resp.status


def _feed(f: object, data: bytes) -> None:
    try:
        f.write(data)  # type: ignore[attr-defined]
        f.close()  # type: ignore[attr-defined]
    except (BrokenPipeError, OSError):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], ctx: ssl.SSLContext) -> None:
        super().__init__(addr, Handler)
        self.ctx = ctx

    def finish_request(self, request, client_address) -> None:  # type: ignore[override]
        """The TLS handshake happens here, in the connection's thread, so a slow client cannot stall accept()."""
        request.settimeout(30)
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            log(f"TLS handshake with {client_address[0]} failed: {e}")
            return
        try:
            tls.settimeout(Handler.timeout)
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()

    def handle_error(self, request, client_address) -> None:  # type: ignore[override]
        log(f"connection from {client_address[0]} ended with {sys.exc_info()[1]!r}")


def main(argv: list[str]) -> None:
    state = State()
    port = int(os.environ.get("HFEMU_PORT") or os.environ.get("SBX_PORT") or 49983)
    tls_dir = os.environ.get("HFEMU_TLS_DIR", "/.hfemu/tls")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(tls_dir, "cert.pem"), os.path.join(tls_dir, "key.pem"))
    Handler.state = state
    server = Server(("127.0.0.1", port), ctx)
    signal.signal(signal.SIGTERM, lambda *_: shutdown(state, server, "SIGTERM"))
    # the emulator's `expire` fault: the idle timeout fires now (the same exit as a real idle shutdown)
    signal.signal(signal.SIGUSR1, lambda *_: shutdown(state, server, f"idle for {state.idle_timeout}s (expired)"))
    threading.Thread(target=state.watchdog, args=(server,), daemon=True).start()
    mode = f"pool host (capacity {state.capacity})" if state.host_mode else "dedicated"
    log(f"protocol {PROTOCOL} {mode} on https://127.0.0.1:{port}, idle timeout {state.idle_timeout}, "
        f"landlock ABI {state.landlock}, job {os.environ.get('HFEMU_JOB_ID', '?')}")  # fmt: skip
    server.serve_forever(poll_interval=0.5)
    server.server_close()
    log("stopped")


if __name__ == "__main__":
    main(sys.argv)
