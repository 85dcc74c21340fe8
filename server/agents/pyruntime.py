"""A relocatable CPython for Python agents' bundles: the agent brings its own interpreter, like Pi brings Node.

A task image's Python is the task's (its version differs from task to task, its packages are what is tested), so a
Python agent must never run on it. The runtime is this host's CPython 3.11 (`source_python`: by default Debian
bookworm's `/usr/bin/python3.11`) copied with its standard library, its `lib-dynload` and **every shared library it
and the agent's packages load, the dynamic loader and the C library included**, so it runs in any x86-64 Linux image
whatever its C library (older glibc, as SWE-Gym's Ubuntu 22.04 images have, or none):

    <bundle>/python/lib/ld-linux-x86-64.so.2 --library-path <bundle>/python/lib <bundle>/python/bin/python3.11 -I

The loader is called directly, so nothing of the image's C library is used and no `LD_LIBRARY_PATH` reaches the
agent's own commands (they run with the image's libraries, as the image expects). `-I` (isolated: no `PYTHON*`
variables, no user site, no current directory on `sys.path`) and `bin/python3.11._pth` (CPython >= 3.11 honours it
on POSIX) pin `sys.path` to the runtime's standard library and the bundle's `site/`, so the agent's packages and the
task's never meet. The agent's packages are installed by the runtime's own pip (a pinned wheel, run from the wheel)
into `site/` (`pip install --target`, `--no-deps` from a full pin list, binary wheels only); every module is compiled
with `--invalidation-mode unchecked-hash`, so the read-only bundle starts without compiling and without writing
`__pycache__` (copies change mtimes; hash-based .pyc files do not care).

A second source, for agents that need a newer Python than the host's (OpenHands' SDK: >= 3.12): Debian's CPython of
another suite (`DebianPython`: trixie's 3.13), from that suite's packages (`apt-get download` with a private apt
configuration: the host's keyring checks the suite's signed index, which checks every .deb), unpacked with
`dpkg-deb -x`, never installed. Its binary needs that suite's C library (glibc 2.41 for trixie), so the libraries it
and the agent's packages load are listed by that suite's own loader (`ld.so --list`), not the host's `ldd`, and taken
from the unpacked packages; the rest is the same layout, run the same way (`python_command(root, version)`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from swe_gym_env.core.settings import setting
from swe_gym_env.server.agents.base import AgentError

FORMAT = 1  # how the runtime is laid out and pruned: a change here rebuilds the bundles that carry one
SOURCE_ENV = "SWE_GYM_AGENT_PYTHON"
DEFAULT_SOURCE = "/usr/bin/python3.11"
VERSION = "3.11"  # the pinned wheels are cp311
RUNTIME = "python"  # the runtime's directory in the bundle
SITE = "site"  # the agent's packages, beside it
LOADER = "ld-linux-x86-64.so.2"
BIN = f"bin/python{VERSION}"
# pip, run from its wheel by the runtime itself; fetched with the host's pip (`pip download`), sha256-checked
PIP = ("pip", "25.3", "9655943313a94722b7774661c21049070f6bbb0a1516bf02f7c8d5d9201514cd")
# never loaded by an agent: left out of the runtime
DROP = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__", "site-packages"}
    | {"dist-packages", "EXTERNALLY-MANAGED", f"config-{VERSION}-x86_64-linux-gnu"}
)
_LDD_LINE = re.compile(r"^\s*(?:\S+\s+=>\s+)?(/\S+)\s+\(0x")


def binary(version: str = VERSION) -> str:
    """The interpreter's path inside the runtime directory."""
    return f"bin/python{version}"


def python_command(root: str, version: str = VERSION) -> str:
    """The shell words that start the bundle's Python isolated, the bundle at ``root``."""
    py = f"{root}/{RUNTIME}"
    return f"{py}/lib/{LOADER} --library-path {py}/lib {py}/{binary(version)} -I -X utf8"


def source_python() -> str:
    """The interpreter the runtime is copied from: $SWE_GYM_AGENT_PYTHON, else Debian's python3.11, else the first
    python3.11 on PATH (python:3.11-slim's /usr/local/bin/python3.11, the Space image's base), else this one."""
    configured = setting("agent_python")  # SOURCE_ENV
    found = str(configured) if configured else (DEFAULT_SOURCE if os.path.isfile(DEFAULT_SOURCE) else None)
    return found or shutil.which(f"python{VERSION}") or sys.executable


def recipe() -> list[str]:
    """What the runtime is built from (in the bundle's recipe: a changed source or pip pin rebuilds it)."""
    return [f"runtime {FORMAT}", f"python {source_python()} {VERSION}", f"pip {PIP[1]} {PIP[2]}", f"loader {LOADER}"]


def _run(argv: list[str], what: str, timeout: float = 900, cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AgentError("install", f"{what} failed: {e}") from e
    if r.returncode != 0:
        said = (r.stdout.strip() + "\n" + r.stderr.strip()).strip()
        raise AgentError("install", f"{what} failed (exit {r.returncode}): {said[-600:]}")
    return r.stdout


def _layout(source: str, version: str = VERSION, start: tuple[str, ...] = ()) -> dict:
    """Where ``source``'s standard library is (``start``: the words before it that run it, e.g. its own loader)."""
    probe = (
        "import json, sys, sysconfig; print(json.dumps({'version': '%d.%d' % sys.version_info[:2], "
        "'stdlib': sysconfig.get_path('stdlib'), 'executable': sys.executable}))"
    )
    argv = [*start, source, "-I", "-S", "-c", probe]
    out = json.loads(_run(argv, f"`{source}` (the agent runtime's source)", 60))
    if out["version"] != version:
        raise AgentError("install", f"{source} is Python {out['version']}; the agent runtime needs {version}")
    return out


def _drop(version: str) -> frozenset[str]:
    return (
        DROP
        if version == VERSION
        else (DROP - {f"config-{VERSION}-x86_64-linux-gnu"}) | {f"config-{version}-x86_64-linux-gnu"}
    )


def _copy_stdlib(src: Path, dst: Path, drop: frozenset[str] = DROP) -> None:
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in drop)
        rel = Path(root).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in names:
            if name not in drop and not name.endswith((".pyc", ".exe")) and not name.startswith("_tkinter"):
                shutil.copyfile(Path(root) / name, dst / rel / name)


def _libraries(objects: list[Path], lister: tuple[str, ...] = ()) -> set[Path]:
    """Every shared library (and the loader) the ELF ``objects`` load, as ldd resolves them here, or as the loader
    command ``lister`` (`<ld.so> --library-path <dirs> --list`, one object a call) resolves them."""
    found: set[Path] = set()
    batches = [[o] for o in objects] if lister else [objects[i : i + 64] for i in range(0, len(objects), 64)]
    for batch in batches:
        argv = [*lister, *map(str, batch)] if lister else ["ldd", *map(str, batch)]
        r = subprocess.run(argv, capture_output=True, text=True)
        for line in r.stdout.splitlines():
            m = _LDD_LINE.match(line)
            if m:
                found.add(Path(m.group(1)))
    return found


def ship_libraries(
    runtime: Path,
    *trees: Path,
    version: str = VERSION,
    lister: tuple[str, ...] = (),
    binaries: tuple[Path, ...] = (),
) -> int:
    """Copy into ``runtime/lib`` every library the interpreter, the extension modules under ``trees`` and the
    executables ``binaries`` load that they do not carry themselves (manylinux wheels carry theirs in
    `<pkg>.libs/`); the number copied. ``lister``: the loader command that resolves them (default: this host's ldd)."""
    objects = [runtime / binary(version), *binaries]
    objects += [p for t in (runtime, *trees) for p in sorted(t.rglob("*.so*")) if p.is_file()]
    lib, carried = runtime / "lib", {p.name for t in trees for p in t.rglob("*.so*")}
    n = 0
    for path in sorted(_libraries(objects, lister)):
        name = LOADER if LOADER in path.name else path.name
        if (lib / name).exists() or name in carried:
            continue
        shutil.copyfile(path.resolve(), lib / name)
        (lib / name).chmod(0o755)
        n += 1
    if not (lib / LOADER).is_file() or not (lib / "libc.so.6").is_file():
        raise AgentError("install", f"the agent runtime has no {LOADER} / libc.so.6 of its own (ldd found none)")
    return n


def build_runtime(dest: Path, log=print) -> Path:
    """The runtime (without the agent's packages) at ``dest/python``, ``dest/site`` empty beside it."""
    source = source_python()
    layout = _layout(source)
    runtime = dest / RUNTIME
    for old in (runtime, dest / SITE):  # a rebuild starts empty (pip --target skips what is already there)
        shutil.rmtree(old, ignore_errors=True)
    (runtime / "bin").mkdir(parents=True)
    log(f"agent runtime: Python {VERSION} from {layout['executable']} ({layout['stdlib']})")
    shutil.copyfile(Path(layout["executable"]).resolve(), runtime / BIN)
    (runtime / BIN).chmod(0o755)
    _copy_stdlib(Path(layout["stdlib"]), runtime / "lib" / f"python{VERSION}")
    (dest / SITE).mkdir(parents=True)
    # sys.path, exactly: the standard library, its extension modules, the agent's packages (relative to the binary)
    pth = f"../lib/python{VERSION}\n../lib/python{VERSION}/lib-dynload\n../../{SITE}\nimport site\n"
    (runtime / f"{BIN}._pth").write_text(pth)
    ship_libraries(runtime)
    return runtime


def build_debian_runtime(dest: Path, source: DebianPython, downloads: Path, log=print) -> Path:
    """As `build_runtime`, from ``source``'s packages (fetched into ``downloads``, unpacked, never installed)."""
    root = fetch_debian(source, downloads, log)
    libdirs = source.library_path(root)
    start = (str(root / source.loader), "--library-path", libdirs)
    layout = _layout(str(root / "usr" / "bin" / f"python{source.version}"), source.version, start)
    runtime = dest / RUNTIME
    for old in (runtime, dest / SITE):
        shutil.rmtree(old, ignore_errors=True)
    (runtime / "bin").mkdir(parents=True)
    log(f"agent runtime: Python {source.version} from Debian {source.suite} ({', '.join(source.versions(root))})")
    bin_ = runtime / binary(source.version)
    shutil.copyfile(root / "usr" / "bin" / f"python{source.version}", bin_)
    bin_.chmod(0o755)
    # its stdlib as its own interpreter reports it (the probe ran from the unpacked tree: paths under `root`)
    _copy_stdlib(Path(layout["stdlib"]), runtime / "lib" / f"python{source.version}", _drop(source.version))
    (dest / SITE).mkdir(parents=True)
    v = source.version
    (runtime / f"{binary(v)}._pth").write_text(
        f"../lib/python{v}\n../lib/python{v}/lib-dynload\n../../{SITE}\nimport site\n"
    )
    ship_libraries(runtime, version=v, lister=debian_lister(runtime, source, downloads))
    return runtime


def host_pip(args: list[str]) -> None:
    """`pip <args>` by this host's pip: the agent runtime's source Python's, else this process's (whichever has one;
    its index settings apply)."""
    why = ""
    for python in dict.fromkeys((source_python(), sys.executable)):
        try:
            _run([python, "-m", "pip", *args], f"`{python} -m pip {' '.join(args[:1] + args[-1:])}`")
            return
        except AgentError as e:
            why = str(e)
    raise AgentError("install", why)


def fetch_pip(downloads: Path, log=print) -> Path:
    """The pinned pip wheel, fetched once with the host's pip (its index settings apply) and sha256-checked."""
    name, version, sha = PIP
    wheel = downloads / f"{name}-{version}-py3-none-any.whl"
    if wheel.is_file() and hashlib.sha256(wheel.read_bytes()).hexdigest() == sha:
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    log(f"fetching {name}=={version} (the agent runtime's pip)")
    host_pip(["download", "--no-deps", "--only-binary", ":all:", "-d", str(downloads), f"{name}=={version}"])
    got = hashlib.sha256(wheel.read_bytes()).hexdigest() if wheel.is_file() else "nothing"
    if got != sha:
        raise AgentError("install", f"{wheel.name}: sha256 {got[:16]}… is not the pinned {sha[:16]}…")
    return wheel


def sdist_wheels(pins: tuple[str, ...], sdists: tuple[str, ...], downloads: Path, log=print) -> Path | None:
    """Wheels of the pinned ``sdists`` (pure-Python packages the index has no wheel of), built once by this host's
    pip (`host_pip`) from their sdist into ``downloads/wheels`` (the agent runtime cannot run a build: its bare
    interpreter needs its own loader); the directory, None when there are none."""
    if not sdists:
        return None
    out = downloads / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    for pin in (p for p in pins if p.split("==")[0].lower() in {s.lower() for s in sdists}):
        name, version = pin.split("==")
        if any(out.glob(f"{name.replace('-', '_')}-{version}-py3-none-any.whl")):
            continue
        log(f"building a wheel of {pin} from its sdist")
        host_pip(["wheel", "-q", "--disable-pip-version-check", "--no-deps", "--no-binary", name, "-w", str(out), pin])
    return out


def pip_install(
    dest: Path, pins: tuple[str, ...], downloads: Path, log=print, version: str = VERSION, sdists: tuple[str, ...] = ()
) -> None:
    """The pinned packages (a full list: no resolution) into ``dest/site`` by the runtime's own pip, binary wheels only
    (the ``sdists``: from wheels built here, `sdist_wheels`)."""
    wheel = fetch_pip(downloads, log)
    built = sdist_wheels(pins, sdists, downloads, log)
    links = ["--find-links", str(built)] if built else []
    argv = [*python_command(str(dest), version).split(), f"{wheel}/pip", "install", "--target", str(dest / SITE)]
    argv += ["--no-deps", "--only-binary", ":all:", *links, "--no-compile", "--disable-pip-version-check", "--no-input"]
    _run([*argv, "-q", *pins], f"`pip install --target {dest / SITE}` ({len(pins)} pinned packages)", 1800)
    shutil.rmtree(dest / SITE / "bin", ignore_errors=True)  # console scripts: their shebangs name this host's paths


def compile_all(dest: Path, version: str = VERSION) -> None:
    """Every module as a hash-checked .pyc that is never rechecked (a read-only bundle starts without compiling).
    Its workers are processes started from `sys.executable`, the bare interpreter, which only the runtime's own
    loader can start where its C library is newer than the host's (the Debian source): those compile in one."""
    jobs = "-j0" if version == VERSION else "-j1"
    argv = [*python_command(str(dest), version).split(), "-m", "compileall", "-q", jobs, "--invalidation-mode"]
    _run([*argv, "unchecked-hash", str(dest / RUNTIME / "lib" / f"python{version}"), str(dest / SITE)], "compileall")


def self_test(dest: Path, imports: str, version: str = VERSION) -> str:
    """Run the built runtime here: it starts, isolated, and imports ``imports``; its sys.path."""
    code = f"import sys, {imports}; print(sys.flags.isolated, sys.path)"
    argv = [*python_command(str(dest), version).split(), "-c", code]
    return _run(argv, "the agent runtime's self-test", 120).strip()


# -- the second source: Debian's CPython of another suite, from its packages ----------------------------------------
DEBIAN_MIRROR_ENV = "SWE_GYM_DEBIAN_MIRROR"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"  # bookworm's debian-archive-keyring has trixie's keys


@dataclass(frozen=True)
class DebianPython:
    """Debian's CPython ``version`` from ``suite``: the interpreter's packages and the libraries its extension
    modules load (the C library and its loader among them). Only the packages' names are pinned: Debian keeps one
    version of each in a suite (a security update replaces it), so the versions fetched are logged and kept beside
    the unpacked tree (`versions`), and the suite's signed index is what vouches for them."""

    version: str
    suite: str
    packages: tuple[str, ...]
    loader: str = f"usr/lib/x86_64-linux-gnu/{LOADER}"
    libdirs: tuple[str, ...] = ("usr/lib/x86_64-linux-gnu",)
    name: str = ""  # its own download folder's name where its packages differ from the suite's usual set

    @property
    def folder(self) -> str:
        return f"debian-{self.name or self.suite}"

    def recipe(self) -> list[str]:
        return [
            f"runtime {FORMAT}",
            f"debian {self.suite} python {self.version}",
            *self.packages,
            f"pip {PIP[1]} {PIP[2]}",
            f"loader {LOADER}",
        ]

    def library_path(self, root: Path) -> str:
        return ":".join(str(root / d) for d in self.libdirs)

    def versions(self, root: Path) -> list[str]:
        f = root / "DEBS"
        return f.read_text().split() if f.is_file() else []


TRIXIE_PYTHON = DebianPython(
    "3.13",
    "trixie",
    tuple(
        """python3.13-minimal libpython3.13-minimal libpython3.13-stdlib libc6 libgcc-s1 libssl3t64 libsqlite3-0
        libffi8 libexpat1 zlib1g libbz2-1.0 liblzma5 libzstd1 libncursesw6 libtinfo6 libreadline8t64 libuuid1
        libdb5.3t64 libstdc++6 media-types netbase""".split()
    ),
)


def _apt(conf: Path, *args: str, cwd: Path | None = None) -> str:
    env_argv = ["env", f"APT_CONFIG={conf}", "apt-get", "-q", *args]
    return _run(env_argv, f"`apt-get {' '.join(args[:2])}` (Debian packages for the agent runtime)", 900, cwd)


def fetch_debian(source: DebianPython, downloads: Path, log=print) -> Path:
    """``source``'s packages, fetched with a private apt configuration (this host's apt sources are untouched)
    and unpacked into ``downloads/debian-<suite>/root``; that root. Several agents share one suite's folder, and
    `setup --harness all` builds them side by side: one fetch at a time (a file lock: threads and processes alike),
    and a root already unpacked for the same packages and mirror is used as it is."""
    base = downloads / source.folder
    base.mkdir(parents=True, exist_ok=True)
    want = json.dumps([source.suite, source.version, sorted(source.packages), setting("debian_mirror")])
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = base / "root" / "SOURCE"
        if done.is_file() and done.read_text() == want:
            return base / "root"
        root = _fetch_debian(source, downloads, log)
        done.write_text(want)
        return root


def _fetch_debian(source: DebianPython, downloads: Path, log=print) -> Path:
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise AgentError(
            "install",
            f"Python {source.version} for the agent runtime comes from Debian packages: "
            "this host has no apt-get / dpkg-deb",
        )
    if not Path(DEBIAN_KEYRING).is_file():
        raise AgentError("install", f"{DEBIAN_KEYRING} is missing: apt-get install debian-archive-keyring")
    base = downloads / source.folder
    etc, state, cache, debs = base / "etc", base / "state", base / "cache", base / "debs"
    for d in (
        etc / "apt.conf.d",
        etc / "preferences.d",
        etc / "sources.list.d",
        state / "lists" / "partial",
        cache / "archives" / "partial",
        debs,
    ):
        d.mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    mirror = setting("debian_mirror")  # DEBIAN_MIRROR_ENV, default DEBIAN_MIRROR
    (etc / "sources.list").write_text(f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {source.suite} main\n")
    conf = base / "apt.conf"
    conf.write_text(
        f'Dir::Etc "{etc}";\nDir::State "{state}";\nDir::State::status "{state / "status"}";\n'
        f'Dir::Cache "{cache}";\nAPT::Architecture "amd64";\nAPT::Sandbox::User "root";\n'
    )
    log(f"fetching Debian {source.suite}'s Python {source.version} ({len(source.packages)} packages)")
    _apt(conf, "update")
    for old in debs.glob("*.deb"):
        old.unlink()
    _apt(conf, "download", *source.packages, cwd=debs)
    root = base / "root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    got = sorted(debs.glob("*.deb"))
    for deb in got:
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
    for link in [p for p in root.rglob("*") if p.is_symlink()]:  # absolute links point into the unpacked tree
        target = os.readlink(link)
        if target.startswith("/"):
            link.unlink()
            link.symlink_to(os.path.relpath(root / target.lstrip("/"), link.parent))
    (root / "DEBS").write_text("\n".join(d.name.removesuffix("_amd64.deb").removesuffix("_all.deb") for d in got))
    if not (root / source.loader).is_file() or not (root / "usr" / "bin" / f"python{source.version}").is_file():
        raise AgentError(
            "install", f"Debian {source.suite}'s packages hold no {source.loader} / python{source.version}"
        )
    return root


def debian_lister(runtime: Path, source: DebianPython, downloads: Path) -> tuple[str, ...]:
    """The loader command that lists what an object loads: the runtime's own loader (that suite's), searching the
    runtime's lib/ and then the unpacked packages' library directories."""
    root = downloads / source.folder / "root"
    loader = runtime / "lib" / LOADER if (runtime / "lib" / LOADER).is_file() else root / source.loader
    return (str(loader), "--library-path", f"{runtime / 'lib'}:{source.library_path(root)}", "--list")
