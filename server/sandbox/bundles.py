"""Agent bundles at boot: a read-only mount whose host directory holds `bundle.json` is a content-addressed tree
(built by `server/agents/bundle.py`; the sandbox layer knows its format, not what is in it).

Backends that mount host paths check the image can run it (`check_bundles`); the others upload it as a tarball,
unpack it and check its digest inside (`deliver_bundles`). Either way boot checks the image's glibc against the
bundle's floor and runs its probe, and records the cost in `bundle_bytes` / `bundle_s`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import tarfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swe_gym_env.server.sandbox.errors import SandboxError

if TYPE_CHECKING:
    from swe_gym_env.server.sandbox.base import ExecResult

BUNDLE_META = "bundle.json"  # marks a content-addressed tree among spec.ro_mounts
BUNDLE_SUMS = "SHA256SUMS"  # `sha256sum -c` lines for every other file; the tree's digest is this file's sha256
GLIBC_PROBE = "getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1"
# The digest check where the image has no sha256sum, run by the bundle's own JS runtime (`verifier` in bundle.json)
VERIFY_JS = (
    "const f=require('fs'),c=require('crypto'),[d,want]=process.argv.slice(1),h=b=>c.createHash('sha256')"
    ".update(b).digest('hex'),s=f.readFileSync(d+'/SHA256SUMS');if(h(s)!==want){console.log('SHA256SUMS: FAILED');"
    "process.exit(1)}const bad=[];for(const l of s.toString().split('\\n')){if(!l)continue;let ok=false;"
    "try{ok=h(f.readFileSync(d+'/'+l.slice(66)))===l.slice(0,64)}catch(e){}if(!ok)bad.push(l.slice(66)+': FAILED')}"
    "if(bad.length){console.log(bad.slice(0,20).join('\\n'));process.exit(1)}"
)
_archive_lock = threading.Lock()


def bundle_meta(host_dir: str | Path) -> dict | None:
    """The metadata of a content-addressed tree (None: a plain directory, or no readable metadata)."""
    try:
        meta = json.loads((Path(host_dir) / BUNDLE_META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and re.fullmatch(r"[0-9a-f]{64}", str(meta.get("digest"))) else None


def glibc_version(text: str) -> tuple[int, int] | None:
    """The glibc version in `getconf GNU_LIBC_VERSION` ("glibc 2.35") or `ldd --version` output ("ldd (Ubuntu GLIBC
    2.35-0ubuntu3.8) 2.35", "ldd (GNU libc) 2.17"); None for anything else (musl's ldd, no ldd at all)."""
    first = (text.strip().splitlines() or [""])[0]
    m = re.match(r"glibc (\d+)\.(\d+)", first) or (
        re.search(r"(\d+)\.(\d+)\s*$", first) if re.search(r"GLIBC|GNU libc", first, re.I) else None
    )
    return (int(m.group(1)), int(m.group(2))) if m else None


def glibc_problem(text: str, need: str) -> str | None:
    """Why an image whose glibc probe printed `text` cannot run a bundle that needs glibc >= `need` (None: it can)."""
    found = glibc_version(text)
    if found is None:
        seen = text.strip().splitlines()[0][:100] if text.strip() else "no output"
        return f"the image has no glibc the agent bundle can use ({seen!r}); it needs glibc >= {need}"
    if found < tuple(int(x) for x in need.split(".")[:2]):
        return f"the image's glibc is {found[0]}.{found[1]}; the agent bundle needs glibc >= {need}"
    return None


def bundle_archive(host_dir: str | Path) -> Path:
    """The tree as a gzipped tarball beside it (`<dir>.tar.gz`), made once: the upload for backends without host
    mounts. Paths sorted, owners and times normalised; what it holds is checked against SHA256SUMS inside."""
    src = Path(host_dir)
    out = src.with_name(src.name + ".tar.gz")
    with _archive_lock:
        if out.is_file():
            return out
        tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}")

        def norm(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 1_700_000_000
            info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
            return info

        try:
            with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
                for path in sorted(src.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(src)), recursive=False, filter=norm)
            tmp.replace(out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


class BundleBoot:
    """What `SandboxBase` does with agent bundles at boot (a mixin over the sandbox's `spec`, `exec` and `upload`)."""

    spec: Any  # the sandbox's SandboxSpec (its ro_mounts name the bundles)
    bundle_bytes: int = 0
    bundle_s: float = 0.0

    async def exec(self, cmd: str | list[str], *, timeout: float, **kw: Any) -> ExecResult:
        raise NotImplementedError

    async def upload(self, local: Path, path: str, mode: int = 0o644) -> None:
        raise NotImplementedError

    def _bundles(self) -> list[tuple[str, str, dict]]:
        return [(h, inside, m) for h, inside in self.spec.ro_mounts.items() if (m := bundle_meta(h)) is not None]

    @staticmethod
    def _probe_script(meta: dict, inside: str) -> str:
        """Shell that runs the bundle's probe in its directory and prints `probe-exit=N` and its last lines."""
        probe = meta.get("probe") or "true"
        return (
            f"rc=0; out=$(cd {shlex.quote(inside)} && {{ {probe}; }} 2>&1) || rc=$?\n"
            'echo "probe-exit=$rc"; printf \'%s\\n\' "$out" | tail -n 5'
        )

    @staticmethod
    def _glibc_and_tools(meta: dict, inside: str, lines: list[str]) -> set[str]:
        """Fail (SandboxError: phase boot) when the image's glibc is below the bundle's floor; the tools it has."""
        if (why := glibc_problem("\n".join(lines[:1]), str(meta.get("glibc") or "2.28"))) is not None:
            raise SandboxError(f"cannot run the agent bundle {meta.get('name', '?')} at {inside}: {why}")
        return set(lines[1:])

    @staticmethod
    def _probe_result(meta: dict, lines: list[str]) -> None:
        at = next((i for i, line in enumerate(lines) if line.startswith("probe-exit=")), None)
        rc = lines[at].partition("=")[2] if at is not None else "?"
        if rc != "0":
            said = " | ".join(lines[at + 1 :] if at is not None else lines[-5:])[-400:]
            raise SandboxError(
                f"the agent bundle {meta.get('name', '?')} does not run in this image "
                f"(`{meta.get('probe')}` exit {rc}): {said}"
            )

    async def check_bundles(self) -> None:
        """Mounted bundles (host_mounts backends): the image's glibc and the bundle's probe, in one command. The
        digest was checked on the host when the bundle was built (`swe-gym-env setup`); its directory is named by
        it."""
        t = time.monotonic()
        for _, inside, meta in self._bundles():
            r = await self.exec(f'echo "$({GLIBC_PROBE})"\n{self._probe_script(meta, inside)}', timeout=120, cwd="/")
            lines = r.stdout.splitlines()
            self._glibc_and_tools(meta, inside, lines[:1])
            self._probe_result(meta, lines)
        self.bundle_s += time.monotonic() - t

    async def deliver_bundles(self) -> None:
        """Bundles for backends without host mounts: glibc first (before any upload), then the tarball uploaded,
        unpacked at the mount path, every file checked against the digest inside the sandbox, and the probe."""
        t = time.monotonic()
        for host, inside, meta in self._bundles():
            tools = "for t in sha256sum tar gzip; do command -v $t >/dev/null && echo $t; done"
            r = await self.exec(f'echo "$({GLIBC_PROBE})"; {tools}', timeout=60, cwd="/")
            have = self._glibc_and_tools(meta, inside, r.stdout.splitlines())
            if not {"tar", "gzip"} <= have:
                raise SandboxError(f"the image lacks {sorted({'tar', 'gzip'} - have)}: cannot unpack the agent bundle")
            q, digest = shlex.quote(inside), meta["digest"]
            if "sha256sum" in have:
                check = f'echo "{digest}  {BUNDLE_SUMS}" | sha256sum -c --quiet --strict - && '
                check += f"sha256sum -c --quiet --strict {BUNDLE_SUMS}"
            elif re.fullmatch(r"[A-Za-z0-9_./= -]+", str(meta.get("verifier") or "")):
                check = f"{meta['verifier']} -e {shlex.quote(VERIFY_JS)} {q} {digest}"
            else:
                raise SandboxError("the image has no sha256sum and the agent bundle no verifier: cannot check it")
            archive = await asyncio.to_thread(bundle_archive, host)
            remote = f"/tmp/.swe-gym/bundle-{digest[:16]}.tar.gz"
            await self.upload(archive, remote, 0o600)
            self.bundle_bytes += archive.stat().st_size
            script = "\n".join(
                [
                    "set -e",
                    f'mkdir -p {q} 2>/dev/null || sudo -n install -d -o "$(id -u)" {q} 2>/dev/null || '
                    f'{{ echo "cannot create {inside} as uid $(id -u) (no write access, no sudo): the image must '
                    'let its user create it, or hold it empty and writable" >&2; exit 3; }',
                    f'[ -z "$(ls -A {q})" ] || {{ echo "{inside} exists and is not empty" >&2; exit 3; }}',
                    f"tar -xzf {remote} -C {q} && rm -f {remote}",
                    f"cd {q}",
                    check,
                    f"chmod -R a-w {q}",
                    self._probe_script(meta, inside),
                ]
            )
            r = await self.exec(script, timeout=600, cwd="/")
            if not r.ok:
                out = (r.stdout.strip() + "\n" + r.stderr.strip()).strip()[-600:]
                raise SandboxError(f"delivering the agent bundle {meta.get('name', '?')} to {inside} failed: {out}")
            self._probe_result(meta, r.stdout.splitlines())
        self.bundle_s += time.monotonic() - t
