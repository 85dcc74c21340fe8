"""Confine one command without namespaces: rlimits, no_new_privs, Landlock, a seccomp filter, a subreaper.

Run by the `landlock` sandbox backend as a standalone script with the server's interpreter
(`python -I -S confine.py CONFIG_JSON -- ARGV...`): stdlib only, no project imports, so it starts fast and
needs nothing of the app. The process tree it makes:

    launcher (this script: unconfined, PR_SET_CHILD_SUBREAPER, watches the deadline, supervises connect())
      └── child: rlimits, capabilities dropped, PR_SET_NO_NEW_PRIVS, Landlock domain, seccomp filter → exec ARGV

The launcher stays outside the Landlock domain, so nothing in the sandbox can signal or ptrace it (Landlock scopes
signals and ptrace to the domain). Every orphan of the sandbox (a `setsid` + double-fork included) is reparented
to it; when the command exits, at the deadline, on SIGTERM/SIGINT/SIGHUP or when its own parent (the server) dies,
it SIGKILLs every live descendant it can find in /proc, round after round until none is left, then exits.

CONFIG_JSON keys: ro / rw / dev (paths: read-only+exec / read-write / read-write device files), ports (TCP ports on
127.0.0.1 the sandbox may connect to), deadline (epoch seconds), rlimits ({"cpu", "as", "nofile", "fsize"}),
parent (the pid whose death ends everything), partial (run even when the kernel's Landlock ABI lacks scoping),
probe (print a JSON report of what the kernel gives, then run ARGV confined), ptys (a number of pty pairs to hand
the command, see below).

Ptys: the domain cannot make one (/dev/ptmx's peer is /dev/pts/N, which Landlock refuses, and granting /dev/pts would
open the host's own terminals). With `ptys: N` the child opens N pairs itself (openpty: /dev/ptmx, unlockpt, the peer
with O_NOCTTY) before it applies Landlock, and hands them to ARGV as inherited descriptors named in PTYS_ENV
("master:slave,..."); the ruleset is the same as without them, and the launcher itself never holds them (they
close when the command's processes are gone). Without `ptys` the variable is removed and no pty is inherited.
The seccomp filter refuses TIOCSETD (changing a tty's line discipline: the kernel's n_gsm / n_hdlc / ... code, a
known attack surface, that a terminal never needs).

Network: Landlock filters TCP by port only, not by address (a host anywhere on an allowed port would pass). So
`connect()` is not left to Landlock: the seccomp filter hands every connect() to the launcher (a seccomp user
notification), which reads the address from the caller's memory, allows only 127.0.0.1 (or ::ffff:127.0.0.1) on an
allowed port, makes the connection itself from its own copy of the address and installs the connected socket at
the caller's descriptor number (SECCOMP_IOCTL_NOTIF_ADDFD). The kernel never re-reads the caller's memory, so there
is no check-then-use race. Landlock's TCP rules (ABI >= 4) stay as a second fence: bind is refused, connect only to
the allowed ports. Sockets other than TCP over IPv4/IPv6 are refused by seccomp (EACCES), except socketpair(AF_UNIX),
which runtimes use for child-process pipes; bind and listen are refused; sendto/sendmsg with MSG_FASTOPEN (an
implicit connect) are refused; io_uring (which would bypass seccomp) and namespace creation are refused.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time

# -- Landlock ------------------------------------------------------------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # all 64-bit arches
LANDLOCK_CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # the only ones a file rule takes
RO = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
RW = RO | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG | FS_MAKE_FIFO | FS_MAKE_SYM
RW |= FS_REFER | FS_TRUNCATE
DEV = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV
FULL_ABI = 6  # signal + abstract unix socket scoping: below it the sandbox could signal the server

# -- seccomp -------------------------------------------------------------------------------------------------------
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
RET_KILL_PROCESS, RET_USER_NOTIF, RET_ALLOW = 0x80000000, 0x7FC00000, 0x7FFF0000


def ret_errno(e: int) -> int:
    return 0x00050000 | e


IOCTL_NOTIF_RECV, IOCTL_NOTIF_SEND = 0xC0502100, 0xC0182101  # _IOWR('!', 0|1, struct seccomp_notif{,_resp})
IOCTL_NOTIF_ID_VALID, IOCTL_NOTIF_ADDFD = 0x40082102, 0x40182103  # _IOW('!', 2, u64), _IOW('!', 3, ..._addfd)
NOTIF_SIZE = 80
ADDFD_FLAG_SETFD = 1
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
TIOCSETD = 0x5423  # the same number on x86_64 and aarch64
PTYS_ENV = "SWE_GYM_PTYS"
MAX_PTYS = 16
AF_UNIX, AF_INET, AF_INET6, SOCK_STREAM, IPPROTO_TCP = 1, 2, 10, 1, 6
MSG_FASTOPEN = 0x20000000
CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

SYSCALLS = {  # per architecture: what the filter names (seccomp is per syscall number)
    "x86_64": dict(
        audit_arch=0xC000003E, seccomp=317, ioctl=16, socket=41, connect=42, sendto=44, sendmsg=46, bind=49, listen=50,
        socketpair=53, clone=56, sendmmsg=307, clone3=435, io_uring=(425, 426, 427), x32=True,
        eperm=(272, 308, 321, 298, 323, 246, 320, 175, 313, 176, 250, 248, 249, 165, 166, 155, 161, 304, 428, 429,
               430, 431, 432, 442, 29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, 240, 241, 242, 243, 244, 245),
    ),  # eperm: unshare setns bpf perf_event_open userfaultfd kexec_* *_module keyctl add_key request_key mount
    # umount2 pivot_root chroot open_by_handle_at open_tree move_mount fs{open,config,mount} mount_setattr,
    # SysV IPC (shm*, sem*, msg*) and POSIX message queues (mq_*): channels between processes of one uid
    "aarch64": dict(
        audit_arch=0xC00000B7, seccomp=277, socket=198, connect=203, sendto=206, sendmsg=211, bind=200, listen=201,
        socketpair=199, ioctl=29, clone=220, sendmmsg=269, clone3=435, io_uring=(425, 426, 427), x32=False,
        eperm=(97, 268, 280, 241, 282, 104, 294, 105, 273, 106, 219, 217, 218, 40, 39, 41, 51, 265, 428, 429, 430,
               431, 432, 442, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197, 180, 181, 182, 183, 184,
               185),
    ),
}  # fmt: skip

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl.restype = ctypes.c_int


class ConfineError(RuntimeError):
    pass


def _syscall(nr: int, *args) -> int:
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]  # ints as longs; pointers as they are
    r = libc.syscall(ctypes.c_long(nr), *conv)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def _prctl(option: int, arg2: int = 0, arg3: int = 0) -> int:
    zero = ctypes.c_ulong(0)
    r = libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), ctypes.c_ulong(arg3), zero, zero)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl({option}): {os.strerror(e)}")
    return r


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    try:
        return _syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.c_void_p(None), 0, LANDLOCK_CREATE_RULESET_VERSION)
    except OSError:
        return 0


def level(abi: int) -> str:
    if abi <= 0:
        return "none"
    return "fs+net+scopes" if abi >= FULL_ABI else "fs+net" if abi >= 4 else "fs"


def missing(abi: int) -> list[str]:
    out = []
    if abi < 4:
        out.append("TCP bind/connect rules (ABI 4; connect() stays supervised by seccomp)")
    if abi < FULL_ABI:
        out.append("signal and abstract-unix-socket scoping (ABI 6): the sandbox could signal the server")
    return out


def fs_handled(abi: int) -> int:
    bits = (1 << 13) - 1
    if abi >= 2:
        bits |= FS_REFER
    if abi >= 3:
        bits |= FS_TRUNCATE
    if abi >= 5:
        bits |= FS_IOCTL_DEV
    return bits


def apply_landlock(abi: int, ro: list[str], rw: list[str], dev: list[str], ports: list[int]) -> None:
    handled = fs_handled(abi)
    if abi >= FULL_ABI:
        attr = struct.pack("<QQQ", handled, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    elif abi >= 4:
        attr = struct.pack("<QQ", handled, NET_BIND_TCP | NET_CONNECT_TCP)
    else:
        attr = struct.pack("<Q", handled)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _syscall(SYS_LANDLOCK_CREATE_RULESET, buf, len(attr), 0)
    try:
        for paths, access in ((ro, RO), (rw, RW), (dev, DEV)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    rights = access & handled
                    if not os.path.isdir(f"/proc/self/fd/{fd}"):
                        rights &= FILE_RIGHTS
                    rule = ctypes.create_string_buffer(struct.pack("<Qi", rights, fd), 12)
                    _syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0)
                finally:
                    os.close(fd)
        if abi >= 4:
            for port in ports:
                rule = ctypes.create_string_buffer(struct.pack("<QQ", NET_CONNECT_TCP, port), 16)
                _syscall(SYS_LANDLOCK_ADD_RULE, ruleset, RULE_NET_PORT, rule, 0)
        _syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)


# -- the seccomp filter, as classic BPF ----------------------------------------------------------------------------
LD_ABS, JEQ, JGE, JSET, AND, RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
OFF_NR, OFF_ARCH = 0, 4


def off_arg(i: int) -> int:  # the low 32 bits of args[i] (little-endian)
    return 16 + 8 * i


class Bpf:
    """A tiny assembler: jumps name labels; `assemble` resolves them to the 8-bit relative offsets BPF takes."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []

    def ld(self, off: int) -> None:
        self.ops.append((LD_ABS, off, None, None))

    def and_(self, k: int) -> None:
        self.ops.append((AND, k, None, None))

    def ret(self, k: int) -> None:
        self.ops.append((RET, k, None, None))

    def jump(self, code: int, k: int, true: str | None, false: str | None = None) -> None:
        self.ops.append((code, k, true, false))  # None: fall through

    def label(self, name: str) -> None:
        self.ops.append(("label", name, None, None))

    def assemble(self) -> bytes:
        where, n = {}, 0
        for op in self.ops:
            if op[0] == "label":
                where[op[1]] = n
            else:
                n += 1
        out, i = [], 0
        for code, k, true, false in self.ops:
            if code == "label":
                continue
            jt = where[true] - i - 1 if true else 0
            jf = where[false] - i - 1 if false else 0
            if not (0 <= jt <= 255 and 0 <= jf <= 255):
                raise ConfineError("seccomp filter too long for its jumps")
            out.append(struct.pack("<HBBI", code, jt, jf, k))
            i += 1
        return b"".join(out)


def build_filter(arch: dict, notify_connect: bool) -> bytes:
    p = Bpf()
    _dispatch(p, arch)
    _check_arguments(p, notify_connect)
    _verdicts(p)
    return p.assemble()


def _dispatch(p: Bpf, arch: dict) -> None:
    """The ABI check, then the syscall number: refused at once, allowed, or on to the label that reads its
    arguments."""
    p.ld(OFF_ARCH)
    p.jump(JEQ, arch["audit_arch"], None, "kill")  # another ABI (i386 via int 0x80) would bypass the numbers below
    p.ld(OFF_NR)
    if arch["x32"]:
        p.jump(JGE, 0x40000000, "enosys")
    for nr in (*arch["io_uring"], arch["clone3"]):  # io_uring bypasses seccomp; clone3's flags cannot be read
        p.jump(JEQ, nr, "enosys")
    for nr in arch["eperm"]:
        p.jump(JEQ, nr, "eperm")
    for name in ("clone", "ioctl", "socket", "socketpair", "connect"):
        p.jump(JEQ, arch[name], name)
    p.jump(JEQ, arch["bind"], "eacces")
    p.jump(JEQ, arch["listen"], "eacces")
    p.jump(JEQ, arch["sendto"], "flags3")
    p.jump(JEQ, arch["sendmmsg"], "flags3")
    p.jump(JEQ, arch["sendmsg"], "flags2")
    p.ret(RET_ALLOW)


def _check_arguments(p: Bpf, notify_connect: bool) -> None:
    """The labels that read a syscall's arguments: no new namespaces, no line discipline, TCP and unix sockets only,
    connect() supervised (or refused), no TCP Fast Open."""
    p.label("clone")
    p.ld(off_arg(0))
    p.jump(JSET, CLONE_NEW, "eperm")
    p.ret(RET_ALLOW)
    p.label("ioctl")
    p.ld(off_arg(1))
    p.jump(JEQ, TIOCSETD, "eperm", "allow")
    p.label("socket")
    p.ld(off_arg(0))
    p.jump(JEQ, AF_INET, "inet")
    p.jump(JEQ, AF_INET6, "inet", "eacces")
    p.label("inet")
    p.ld(off_arg(1))
    p.and_(0xF)  # SOCK_TYPE_MASK: the rest are SOCK_NONBLOCK / SOCK_CLOEXEC
    p.jump(JEQ, SOCK_STREAM, None, "eacces")
    p.ld(off_arg(2))
    p.jump(JEQ, 0, "allow")
    p.jump(JEQ, IPPROTO_TCP, "allow", "eacces")  # not MPTCP or SCTP
    p.label("socketpair")
    p.ld(off_arg(0))
    p.jump(JEQ, AF_UNIX, "allow", "eacces")
    p.label("connect")
    p.ret(RET_USER_NOTIF if notify_connect else ret_errno(errno.EACCES))
    for label, arg in (("flags3", 3), ("flags2", 2)):  # sendto / sendmmsg: flags in arg 3; sendmsg: in arg 2
        p.label(label)
        p.ld(off_arg(arg))
        p.jump(JSET, MSG_FASTOPEN, "eacces", "allow")


def _verdicts(p: Bpf) -> None:
    """The labels every jump ends at."""
    p.label("allow")
    p.ret(RET_ALLOW)
    for label, err in (("eacces", errno.EACCES), ("eperm", errno.EPERM), ("enosys", errno.ENOSYS)):
        p.label(label)
        p.ret(ret_errno(err))
    p.label("kill")
    p.ret(RET_KILL_PROCESS)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_filter(arch: dict, notify_connect: bool) -> int | None:
    """Install the filter on this thread; returns the notification listener fd when connect() is supervised."""
    code = build_filter(arch, notify_connect)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER if notify_connect else 0
    fd = _syscall(arch["seccomp"], SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(prog))
    return fd if notify_connect else None


# -- the confined child ----------------------------------------------------------------------------------------------
def drop_capabilities() -> None:
    """As root: empty the bounding, ambient, effective, permitted and inheritable sets (uid 0 keeps no power)."""
    if os.geteuid() != 0:
        return
    for cap in range(64):
        try:
            _prctl(PR_CAPBSET_DROP, cap)
        except OSError as e:  # EINVAL: past the last capability this kernel knows; EPERM: no CAP_SETPCAP (then
            if e.errno in (errno.EINVAL, errno.EPERM):  # the empty permitted set below + no_new_privs still hold)
                break
            raise
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} words, all zero
    if libc.capset(header, data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")


def set_limit(res: int, value: int) -> None:
    """Soft = hard = `value`, or the current hard limit where that is lower (raising it needs privilege)."""
    hard = resource.getrlimit(res)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(res, (value, value))


def confine_self(cfg: dict, abi: int, arch: dict) -> int | None:
    limits = cfg.get("rlimits") or {}
    for name, res in (("cpu", resource.RLIMIT_CPU), ("as", resource.RLIMIT_AS), ("nofile", resource.RLIMIT_NOFILE),
                      ("fsize", resource.RLIMIT_FSIZE)):  # fmt: skip
        if limits.get(name):
            set_limit(res, int(limits[name]))
    set_limit(resource.RLIMIT_CORE, 0)
    drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    apply_landlock(abi, cfg.get("ro", []), cfg.get("rw", []), cfg.get("dev", []), cfg.get("ports", []))
    return install_filter(arch, bool(cfg.get("ports")))


def self_test(cfg: dict) -> dict[str, str]:
    """Confined, before exec (probe mode): what each kind of access gives, as an errno name or "ok"."""

    def attempt(fn) -> str:
        try:
            fn()
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno or 0, str(e.errno))

    probe = cfg["probe"]
    return {
        "connect allowed port": attempt(lambda: socket.create_connection(("127.0.0.1", probe["port"]), 5).close()),
        "connect other port": attempt(lambda: socket.create_connection(("127.0.0.1", probe["decoy"]), 5).close()),
        "udp socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()),
        "read outside": attempt(lambda: os.listdir(probe["deny"])),
        "signal launcher": attempt(lambda: os.kill(os.getppid(), 0)),
        "write inside": attempt(lambda: open(os.path.join(cfg["rw"][0], "probe"), "w").close()),
    }


def open_ptys(n: int) -> str:
    """`n` pty pairs, opened here (outside the Landlock domain about to be applied) and left open across exec:
    "master:slave,..." for PTYS_ENV. Each slave is opened O_NOCTTY (openpty), so none is this process's terminal."""
    if not 0 <= n <= MAX_PTYS:
        raise ConfineError(f"ptys: {n} is not in 0..{MAX_PTYS}")
    pairs = []
    for _ in range(n):
        master, slave = os.openpty()
        os.set_inheritable(master, True)
        os.set_inheritable(slave, True)
        pairs.append(f"{master}:{slave}")
    return ",".join(pairs)


def child(cfg: dict, abi: int, arch: dict, argv: list[str], chan: socket.socket | None) -> None:
    """Runs in the forked child: never returns."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE/SIGXFSZ; exec keeps ignored signals ignored
        path = _which(argv[0])  # before confining: searching PATH imports modules the sandbox cannot read
        os.environ.pop(PTYS_ENV, None)  # only ever what this launcher opened
        if ptys := open_ptys(int(cfg.get("ptys") or 0)):  # before Landlock: the domain could not open them
            os.environ[PTYS_ENV] = ptys
        listener = confine_self(cfg, abi, arch)
        if chan is not None:
            if listener is not None:
                socket.send_fds(chan, [b"L"], [listener])
                os.close(listener)  # never inherited: a sandbox holding its own listener could answer for itself
            chan.close()
        if cfg.get("probe"):
            os.write(1, (json.dumps(self_test(cfg)) + "\n").encode())
        os.execv(path, argv)
    except BaseException as e:  # whatever broke, the command must not run unconfined
        try:
            os.write(2, f"confine: {type(e).__name__}: {e}\n".encode())
        finally:
            os._exit(126)


def _which(name: str) -> str:
    if "/" in name:
        return name
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"):
        if d and os.access(os.path.join(d, name), os.X_OK):
            return os.path.join(d, name)
    raise FileNotFoundError(f"{name} not found on PATH")


# -- the launcher: connect() supervisor ----------------------------------------------------------------------------
def _ioctl(fd: int, request: int, buf: bytearray | bytes) -> int | bytes:
    """A mutable buffer is filled in place (RECV); a bytes one is only sent (SEND, ID_VALID, ADDFD)."""
    return fcntl.ioctl(fd, request, buf, True) if isinstance(buf, bytearray) else fcntl.ioctl(fd, request, buf)


class Supervisor:
    """Answers the sandbox's connect() calls: only 127.0.0.1:<allowed port>, connected here and handed over."""

    def __init__(self, listener: int, ports: list[int]) -> None:
        self.listener = listener
        self.ports = set(ports)

    def _read(self, pid: int, addr: int, size: int) -> bytes:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, size, addr)
        finally:
            os.close(fd)

    def _target(self, raw: bytes) -> tuple[int, tuple] | None:
        """(family, address) when the sockaddr names an allowed destination, else None."""
        if len(raw) < 2:
            return None
        family = struct.unpack_from("<H", raw)[0]
        if family == AF_INET and len(raw) >= 8:
            port = struct.unpack_from(">H", raw, 2)[0]
            if raw[4:8] == b"\x7f\x00\x00\x01" and port in self.ports:
                return AF_INET, ("127.0.0.1", port)
        if family == AF_INET6 and len(raw) >= 24:
            port = struct.unpack_from(">H", raw, 2)[0]
            if raw[8:24] == b"\x00" * 10 + b"\xff\xff\x7f\x00\x00\x01" and port in self.ports:
                return AF_INET6, ("::ffff:127.0.0.1", port)
        return None

    def _respond(self, nid: int, error: int) -> None:
        try:
            _ioctl(self.listener, IOCTL_NOTIF_SEND, struct.pack("<QqiI", nid, 0, -error, 0))
        except OSError:  # the caller died meanwhile
            pass

    def handle(self) -> None:
        buf = bytearray(NOTIF_SIZE)
        try:
            _ioctl(self.listener, IOCTL_NOTIF_RECV, buf)
        except OSError:
            return
        nid, pid = struct.unpack_from("<QI", buf, 0)
        args = struct.unpack_from("<6Q", buf, 32)
        fd, addr, size = args[0] & 0xFFFFFFFF, args[1], args[2] & 0xFFFFFFFF
        try:
            raw = self._read(pid, addr, min(size, 128))
            _ioctl(self.listener, IOCTL_NOTIF_ID_VALID, struct.pack("<Q", nid))  # pid still the one that asked
        except OSError:
            return self._respond(nid, errno.EACCES)
        target = self._target(raw)
        if target is None:
            return self._respond(nid, errno.EACCES)
        family, address = target
        try:
            flags = int(_fdinfo(pid, fd).get("flags", "0"), 8)
            if not os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                return self._respond(nid, errno.ENOTSOCK)
        except (OSError, ValueError):
            return self._respond(nid, errno.EBADF)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(5)
            try:
                sock.connect(address)
            except OSError as e:
                return self._respond(nid, e.errno or errno.ECONNREFUSED)
            sock.setblocking(not flags & os.O_NONBLOCK)
            addfd = struct.pack("<QIIII", nid, ADDFD_FLAG_SETFD, sock.fileno(), fd, flags & os.O_CLOEXEC)
            try:
                _ioctl(self.listener, IOCTL_NOTIF_ADDFD, addfd)
            except OSError:
                return self._respond(nid, errno.EACCES)
            self._respond(nid, 0)
        finally:
            sock.close()


def _fdinfo(pid: int, fd: int) -> dict[str, str]:
    with open(f"/proc/{pid}/fdinfo/{fd}") as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


# -- the launcher: reaping -------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc/<pid>/task/*/children (CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def descendants(root: int) -> list[int]:
    """Descendants of `root`, walking /proc/<pid>/task/*/children (a snapshot: `kill_all` loops until none is
    left); without that file (an old kernel config), by the parent links of every process in /proc."""
    if not os.path.exists(f"/proc/{root}/task/{root}/children"):
        return _descendants_by_scan(root)
    out, todo = [], [root]
    while todo:
        for pid in _children(todo.pop()):
            out.append(pid)
            todo.append(pid)
    return out


def _descendants_by_scan(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def reap() -> tuple[list[tuple[int, int]], bool]:
    """Collect exited children: (pid, status) each, and whether any child is left."""
    done = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done, False
        if pid == 0:
            return done, True
        done.append((pid, status))


def kill_all() -> None:
    """SIGKILL every descendant until this process has no child left. A subreaper inherits every orphan below it,
    so once it has no children at all, nothing it started is alive (a setsid'd or double-forked one included)."""
    me = os.getpid()
    for _ in range(2000):
        if not reap()[1]:
            return
        for pid in descendants(me):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.002)


def status_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status)


def _refusal(cfg: dict, arch: dict | None, abi: int) -> int | None:
    """Print the probe's report where asked; 126 (said on stderr) when this machine cannot confine the command."""
    if cfg.get("probe"):
        report = {"abi": abi, "level": level(abi), "missing": missing(abi), "arch": os.uname().machine}
        print(json.dumps(report), flush=True)
    if arch is None:
        print(f"confine: no seccomp syscall table for {os.uname().machine}", file=sys.stderr)
        return 126
    if abi <= 0:
        print("confine: Landlock is not available in this kernel (missing or disabled at boot)", file=sys.stderr)
        return 126
    if abi < FULL_ABI and not cfg.get("partial"):
        print(f"confine: Landlock ABI {abi} lacks {'; '.join(missing(abi))}", file=sys.stderr)
        return 126
    return None


def _catch_signals() -> tuple[int, dict]:
    """SIGTERM / SIGINT / SIGHUP recorded in the returned dict's "why"; every signal (SIGCHLD too) makes the returned
    fd readable."""
    stop = {"why": None}

    def on_signal(signum, _frame) -> None:
        stop["why"] = signum

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD writes to the wakeup fd
    return wake_r, stop


def _probe_listeners(cfg: dict) -> list[socket.socket]:
    """Listeners for the child's self-test, named in ``cfg``: one it may reach, one it may not."""
    listening = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = [sock.getsockname()[1] for sock in listening]
    cfg["probe"] = {"port": ports[0], "decoy": ports[1], "deny": os.path.dirname(os.path.abspath(cfg["rw"][0]))}
    cfg["ports"] = [ports[0]]
    return listening


def _fork_child(cfg: dict, abi: int, arch: dict, command: list[str]) -> tuple[int, Supervisor | None]:
    """Fork the confined child: its pid, and the supervisor of its connect() calls where it may reach ports."""
    ours, theirs = socket.socketpair() if cfg.get("ports") else (None, None)
    pid = os.fork()
    if pid == 0:
        if ours is not None:
            ours.close()
        child(cfg, abi, arch, command, theirs)
    if ours is None or theirs is None:
        return pid, None
    theirs.close()
    ours.settimeout(30)
    try:
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
    except OSError:
        fds = []
    ours.close()
    return pid, Supervisor(fds[0], cfg["ports"]) if fds else None


def _wait_child(pid: int, wake_r: int, stop: dict, supervisor: Supervisor | None, deadline: float) -> int:
    """Serve the supervisor until the child exits (its exit code), a signal stops this launcher (128 + it) or the
    deadline passes (137)."""
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    if supervisor is not None:
        poller.register(supervisor.listener, select.POLLIN)
    while True:
        for pid_done, status in reap()[0]:
            if pid_done == pid:
                return status_code(status)
        if stop["why"] is not None:
            return 128 + stop["why"]
        left = deadline - time.time()
        if left <= 0:
            print("confine: the sandbox's deadline passed: killed", file=sys.stderr, flush=True)
            return 137
        for fd, events in poller.poll(min(left, 1.0) * 1000):
            if fd == wake_r:
                os.read(wake_r, 4096)
            elif supervisor is not None and fd == supervisor.listener:
                if events & select.POLLIN:
                    supervisor.handle()
                elif events & (select.POLLHUP | select.POLLERR):
                    poller.unregister(fd)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: confine.py CONFIG_JSON -- ARGV...", file=sys.stderr)
        return 2
    cfg, command = json.loads(argv[0]), argv[2:]
    arch = SYSCALLS.get(os.uname().machine)
    abi = landlock_abi()
    if (refused := _refusal(cfg, arch, abi)) is not None:
        return refused
    assert arch is not None  # _refusal said so otherwise
    wake_r, stop = _catch_signals()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if cfg.get("parent") and os.getppid() != int(cfg["parent"]):  # the server died before PDEATHSIG was set
        return 143
    listening = _probe_listeners(cfg) if cfg.get("probe") else []
    pid, supervisor = _fork_child(cfg, abi, arch, command)
    deadline = float(cfg.get("deadline") or time.time() + 86400 * 365)
    code = _wait_child(pid, wake_r, stop, supervisor, deadline)
    kill_all()
    for sock in listening:  # open until the child is gone
        sock.close()
    return code


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # no interpreter teardown: it only costs time
