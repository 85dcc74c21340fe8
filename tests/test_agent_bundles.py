"""Agent bundles (server/agents/bundle.py): content addressing and manifest checks, the glibc floor, and both real
agents running an oracle rollout on `docker` in an image that has no Node at all."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import require

from swe_gym_env.core.assets import task_runtime_dir
from swe_gym_env.server.agents import bundle as bundles
from swe_gym_env.server.agents.base import BUNDLE_MOUNT
from swe_gym_env.server.agents.bundle import (
    NODE,
    BundleError,
    build_bundle,
    ensure_bundle,
    find_bundle,
    require_bundle,
    verify_bundle,
)
from swe_gym_env.server.agents.harnesses.opencode import OpenCodeHarness
from swe_gym_env.server.agents.harnesses.pi import PiHarness
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.bundles import glibc_problem, glibc_version
from swe_gym_env.server.sandbox.docker import default_image
from swe_gym_env.tasks.catalog import BUNDLED_DIR, bundled_tasks

REPO = Path(__file__).resolve().parent.parent
LONG = {"SWE_GYM_ENGINE_MAX_MODEL_LEN": "32768", "SWE_GYM_CONTEXT_WINDOW": "32768"}  # OpenCode's ~7.9k prompt


# -- a small harness to build bundles from files in a temp dir --------------------------------------------------
class ToyHarness:
    name = "toy"
    version = "1.0"
    package = "toy-agent"
    needs_node = False
    min_context_tokens = 1
    bundle_artifacts = ()
    min_glibc = "2.28"
    bundle_probe = "./bin/run --version"
    bundle_verifier = None
    bundle_inputs = ()
    installer = "npm install"

    def __init__(self, src: Path) -> None:
        self.src = src

    def ensure_installed(self, log=print) -> Path:
        return self.src

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        return {"bin/run": self.src / "run", "lib": self.src / "lib"}


@pytest.fixture
def toy(tmp_path, monkeypatch) -> ToyHarness:
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "cache"))
    src = tmp_path / "src"
    (src / "lib" / "pkg" / ".bin").mkdir(parents=True)
    (src / "run").write_text("#!/bin/sh\necho toy 1.0\n")
    (src / "run").chmod(0o755)
    (src / "lib" / "pkg" / "index.js").write_text("module.exports = 1\n")
    (src / "lib" / "pkg" / "index.js.map").write_text("{}")  # pruned: nothing loads source maps
    (src / "lib" / "pkg" / "index.d.ts").write_text("export {}")  # pruned: TypeScript declarations
    (src / "lib" / "pkg" / "README.md").write_text("docs are kept\n")
    os.symlink("../index.js", src / "lib" / "pkg" / ".bin" / "toy")  # npm's entry links: dropped
    os.symlink("index.js", src / "lib" / "pkg" / "alias.js")  # a link to a file: copied as a file
    return ToyHarness(src)


def test_a_bundle_is_named_by_the_sha256_of_its_manifest_and_lists_every_file(toy):
    b = build_bundle(toy, log=lambda *_: None)
    sums = (b.path / "SHA256SUMS").read_bytes()
    assert b.digest == hashlib.sha256(sums).hexdigest() and b.path.name == f"toy-1.0-{b.digest[:16]}"
    listed = {line[66:]: line[:64] for line in sums.decode().splitlines()}
    assert set(listed) == {"EXECUTABLES", "bin/run", "lib/pkg/index.js", "lib/pkg/README.md", "lib/pkg/alias.js"}
    for rel, sha in listed.items():
        assert hashlib.sha256((b.path / rel).read_bytes()).hexdigest() == sha
    assert (b.path / "EXECUTABLES").read_text() == "bin/run\n" and os.access(b.path / "bin/run", os.X_OK)
    assert not (b.path / "lib/pkg/alias.js").is_symlink()
    meta = json.loads((b.path / "bundle.json").read_text())
    assert meta["digest"] == b.digest and meta["files"] == 5 and meta["glibc"] == "2.28"
    assert meta["probe"] == "./bin/run --version" and meta["recipe"] == bundles.recipe(toy)
    assert find_bundle(toy) == b and verify_bundle(b.path) == meta
    assert subprocess.run([b.path / "bin/run"], capture_output=True, text=True).stdout == "toy 1.0\n"


def test_same_content_same_digest_and_one_byte_changes_it(toy):
    first = build_bundle(toy, log=lambda *_: None)
    again = build_bundle(toy, log=lambda *_: None)
    assert again.digest == first.digest and again.path == first.path
    (toy.src / "lib" / "pkg" / "index.js").write_text("module.exports = 2\n")
    changed = build_bundle(toy, log=lambda *_: None)
    assert changed.digest != first.digest and changed.path != first.path
    assert find_bundle(toy) == changed  # the pointer follows the newest build
    (toy.src / "run").chmod(0o644)  # the executable bit is content too (EXECUTABLES is listed)
    assert build_bundle(toy, log=lambda *_: None).digest != changed.digest


def test_ensure_is_idempotent_and_fast_when_present(toy):
    built = ensure_bundle(toy, log=lambda *_: None)
    mtime = (built.path / "bundle.json").stat().st_mtime_ns
    assert ensure_bundle(toy, log=lambda *_: None) == built
    assert (built.path / "bundle.json").stat().st_mtime_ns == mtime  # kept, not rebuilt


def test_a_corrupted_file_fails_the_check_with_the_file_named_and_setup_rebuilds_it(toy):
    b = build_bundle(toy, log=lambda *_: None)
    (b.path / "lib/pkg/index.js").write_text("module.exports = 666\n")
    with pytest.raises(BundleError, match=r"lib/pkg/index\.js: FAILED \(sha256 mismatch\)") as e:
        verify_bundle(b.path)
    assert e.value.kind == "install"
    said: list[str] = []
    fixed = ensure_bundle(toy, log=said.append)
    assert fixed.digest == b.digest and "lib/pkg/index.js" in said[0]
    assert verify_bundle(fixed.path)["digest"] == b.digest


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda p: (p / "bin/run").unlink(), r"bin/run: FAILED \(missing\)"),
        (lambda p: (p / "bin/run").chmod(0o644), r"bin/run: FAILED \(not executable\)"),
        (lambda p: (p / "lib/extra.js").write_text("x"), r"lib/extra\.js: FAILED \(not in SHA256SUMS\)"),
        (lambda p: (p / "SHA256SUMS").write_text("0" * 64 + "  bin/run\n"), r"SHA256SUMS: FAILED"),
    ],
)
def test_every_kind_of_damage_is_named(toy, damage, named):
    b = build_bundle(toy, log=lambda *_: None)
    damage(b.path)
    with pytest.raises(BundleError, match=named):
        verify_bundle(b.path)


def test_a_tampered_manifest_or_a_changed_recipe_is_no_bundle(toy, monkeypatch):
    b = build_bundle(toy, log=lambda *_: None)
    with monkeypatch.context() as m:
        m.setattr(ToyHarness, "min_glibc", "2.31")  # the recipe changed: the old bundle is stale
        assert find_bundle(toy) is None
        with pytest.raises(BundleError, match="swe-gym-env setup"):
            require_bundle(toy)
    assert find_bundle(toy) == b
    (b.path / "SHA256SUMS").write_bytes((b.path / "SHA256SUMS").read_bytes() + b"\n")
    assert find_bundle(toy) is None


# -- the glibc floor (the parser of `getconf GNU_LIBC_VERSION` / `ldd --version`) ------------------------------
@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("glibc 2.35\n", (2, 35)),
        ("ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35\nCopyright (C) 2022 Free Software Foundation, Inc.\n", (2, 35)),
        ("ldd (Debian GLIBC 2.36-9+deb12u14) 2.36\n", (2, 36)),
        ("ldd (GNU libc) 2.17\n", (2, 17)),
        ("ldd (GNU libc) 2.28\n", (2, 28)),
        ("musl libc (x86_64)\nVersion 1.2.4\n", None),
        ("sh: ldd: not found\n", None),
        ("", None),
    ],
)
def test_glibc_version_parser(text, version):
    assert glibc_version(text) == version


def test_an_old_or_missing_glibc_is_a_clear_message_naming_what_was_found():
    assert glibc_problem("ldd (GNU libc) 2.17", "2.28") == (
        "the image's glibc is 2.17; the agent bundle needs glibc >= 2.28"
    )
    assert glibc_problem("ldd (GNU libc) 2.27", "2.28") is not None
    assert glibc_problem("ldd (GNU libc) 2.28", "2.28") is None
    assert glibc_problem("glibc 2.35", "2.28") is None and glibc_problem("glibc 2.17", "2.17") is None
    musl = glibc_problem("musl libc (x86_64)", "2.28")
    assert musl is not None and "musl libc" in musl and ">= 2.28" in musl


def test_the_node_pin_is_the_dockerfiles_pin():
    for name in ("Dockerfile",):  # the Space image installs Node for npm (setup); the HF sandbox image has none
        text = (REPO / name).read_text()
        args = dict(re.findall(r"^ARG (NODE_VERSION|NODE_SHA512)=(\S+)$", text, re.M))
        assert args == {"NODE_VERSION": NODE.version, "NODE_SHA512": NODE.integrity.removeprefix("sha512-")}, name


# -- the real bundles (built by `swe-gym-env setup --all`) -------------------------------------------------------
@pytest.fixture(scope="module")
def real_bundles() -> dict[str, Path]:
    found = {h.name: find_bundle(h) for h in (PiHarness(), OpenCodeHarness())}
    missing = [n for n, b in found.items() if b is None]
    require(not missing, f"agent bundles not built for {missing}: run `swe-gym-env setup --all`")
    return {n: b.path for n, b in found.items() if b is not None}


@pytest.mark.parametrize("harness", [PiHarness, OpenCodeHarness])
def test_real_bundles_verify_mount_at_the_fixed_path_and_run_on_the_host(real_bundles, harness):
    h = harness()
    path = real_bundles[h.name]
    meta = verify_bundle(path)
    assert h.mounts() == {str(path): BUNDLE_MOUNT} and meta["glibc"] == h.min_glibc
    probe = subprocess.run(["sh", "-c", h.bundle_probe], cwd=path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    if h.name == "pi":
        assert probe.stdout.startswith(f"v{NODE.version}")
        assert (path / "pi/node_modules/@mariozechner/pi-coding-agent/dist/cli.js").is_file()
        assert not list((path / "pi/node_modules").rglob("*.d.ts"))[:1]
    else:
        assert (path / "bin/opencode").is_file() and os.access(path / "bin/rg", os.X_OK)


# -- docker: both agents in an image without Node ----------------------------------------------------------------
def docker(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)


# Like a SWE-Gym image: the task's repo at /testbed, pytest in the image's own Python, and no Node at all.
NO_NODE_DOCKERFILE = """FROM {base}
COPY site-packages/ /usr/local/lib/python3.11/dist-packages/
COPY repo.bundle /tmp/repo.bundle
RUN (apt-get purge -y nodejs libnode108 >/dev/null 2>&1 || true) \\
 && rm -f /usr/bin/node /usr/bin/nodejs /usr/local/bin/node && ln -sf python3 /usr/bin/python \\
 && ! command -v node && ! command -v npm && python3 -m pytest --version \\
 && git clone -q /tmp/repo.bundle /testbed && git -C /testbed checkout -q {commit} && rm /tmp/repo.bundle
"""
NO_LIBSTDCXX_DOCKERFILE = "FROM {base}\nRUN rm -f /usr/lib/x86_64-linux-gnu/libstdc++.so.6*\n"


def build_image(name: str, dockerfile: str, context: Path) -> str:
    """Build once per content (the tag is a digest of the Dockerfile, the base image's id and the context)."""
    key = hashlib.sha256(dockerfile.encode())
    for f in sorted(p for p in context.rglob("*") if p.is_file()):
        key.update(f"{f.relative_to(context)} {f.stat().st_size}\n".encode())
    tag = f"{name}:{key.hexdigest()[:12]}"
    if docker("image", "inspect", tag).returncode != 0:
        (context / "Dockerfile").write_text(dockerfile)
        r = docker("build", "--network", "none", "-q", "-t", tag, str(context), timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return tag


@pytest.fixture(scope="module")
def no_node_image(tmp_path_factory, need_docker) -> str:
    base_id = docker("image", "inspect", "--format", "{{.Id}}", default_image()).stdout.strip()
    require(bool(base_id), f"the docker base image {default_image()} is missing: run scripts/setup_docker.sh")
    site = next(task_runtime_dir().glob("lib/python3*/site-packages"), None)
    require(site is not None, f"task runtime missing at {task_runtime_dir()}: run `swe-gym-env setup`")
    assert site is not None
    ctx = tmp_path_factory.mktemp("nonode-ctx")
    skip = shutil.ignore_patterns("pip", "pip-*", "setuptools", "setuptools-*", "pkg_resources", "_distutils_hack",
                                  "distutils-precedence.pth", "__pycache__")  # fmt: skip
    shutil.copytree(site, ctx / "site-packages", ignore=skip)
    task = bundled_tasks()[0]
    shutil.copyfile(task.repo_source or "", ctx / "repo.bundle")
    dockerfile = NO_NODE_DOCKERFILE.format(base=base_id, commit=task.base_commit)
    image = build_image("swe-gym-env/test-nonode", dockerfile, ctx)
    r = docker("run", "--rm", "--network", "none", image, "sh", "-c", "command -v node; echo rc=$?")
    assert r.stdout.strip() == "rc=127", r.stdout  # no node anywhere on the image's PATH
    return image


@pytest.fixture(scope="module")
def no_node_split(no_node_image, tmp_path_factory) -> str:
    """A one-row SWE-rebench-style copy of bundled task 0 that names the no-Node image, which holds the repo
    (registered by env)."""
    row = json.loads((BUNDLED_DIR / "tasks.jsonl").read_text().splitlines()[0])
    row.pop("repo_source", None)
    row["docker_image"] = no_node_image
    row["install_config"] = {"test_cmd": "python3 -m pytest -rA -p no:cacheprovider"}
    path = tmp_path_factory.mktemp("nonode-split") / "nonode.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return f"nonode={path}"


@pytest.fixture(scope="module")
def nonode_stack(no_node_split, real_bundles, need_tokenizer_module):
    from helpers import Stack

    s = Stack("oracle", env={"SWE_GYM_DATASETS": no_node_split, **LONG})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def need_tokenizer_module() -> None:
    from swe_gym_env.core.assets import tokenizer_dir

    require((tokenizer_dir() / "tokenizer.json").is_file(), "tokenizer not prepared: run `swe-gym-env setup`")


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("harness", ["pi", "opencode"])
async def test_both_agents_run_an_oracle_rollout_on_docker_in_an_image_without_node(nonode_stack, no_node_image,
                                                                                      harness):  # fmt: skip
    from swe_gym_env.client.mcp_client import SweGymClient

    async with SweGymClient(nonode_stack.mcp_url) as c:
        result = await c.run_rollout(harness=harness, sandbox="docker", split="nonode", index=0)
    assert result.ok, f"{result.phase}: {result.error}"
    assert result.reward == 1.0 and result.sandbox == "docker" and result.harness == harness
    assert result.cross_check == "match", result.cross_check_detail
    assert result.instance_id == bundled_tasks()[0].instance_id and len(result.turns) >= 2
    r = docker("run", "--rm", "--network", "none", no_node_image, "sh", "-c", "command -v node || echo none")
    assert r.stdout.strip() == "none"


@pytest.mark.anyio
@pytest.mark.integration
async def test_bundle_checks_at_boot_and_the_upload_path_for_real(no_node_image, real_bundles, tmp_path, monkeypatch):
    """On docker: the boot check passes and costs little; a bundle that cannot run in the image (libstdc++ gone) is
    a clear boot error; and the upload path of hf/e2b (tarball in, unpacked, sha256sum -c inside, probe) run for real
    in the no-Node image, including a corrupted file named by the check inside and the JS verifier where the image
    has no sha256sum."""
    from swe_gym_env.server.sandbox.registry import create_sandbox

    t = bundled_tasks()[0]
    pi = PiHarness()
    base = SandboxSpec(repo_source=t.repo_source or "", base_commit=t.base_commit, image=no_node_image, deadline_s=300)
    async with await create_sandbox("docker", dataclasses.replace(base, ro_mounts=pi.mounts())) as sbx:
        assert 0 < sbx.bundle_s < 10 and sbx.bundle_bytes == 0  # mounted: nothing uploaded
        r = await sbx.exec("command -v node || echo none; /opt/swe-gym-agent/node/bin/node --version", timeout=60)
        assert r.stdout.split() == ["none", f"v{NODE.version}"]

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    no_cxx = build_image("swe-gym-env/test-nolibstdcxx", NO_LIBSTDCXX_DOCKERFILE.format(base=no_node_image), ctx)
    with pytest.raises(SandboxError, match=r"does not run in this image .*libstdc\+\+"):
        await create_sandbox("docker", dataclasses.replace(base, image=no_cxx, ro_mounts=pi.mounts()))

    # the upload path (hf / e2b) on a docker sandbox: the same shell, a real image without Node
    async with await create_sandbox("docker", base) as sbx:
        sbx.spec = dataclasses.replace(sbx.spec, ro_mounts=pi.mounts())
        await sbx.deliver_bundles()
        assert sbx.bundle_bytes > 10_000_000 and sbx.bundle_s > 0
        r = await sbx.exec("/opt/swe-gym-agent/node/bin/node --version; stat -c %A /opt/swe-gym-agent", timeout=60)
        assert r.stdout.split() == [f"v{NODE.version}", "dr-xr-xr-x"]

    toy_src = tmp_path / "toy"
    (toy_src / "lib").mkdir(parents=True)
    (toy_src / "run").write_text("#!/bin/sh\necho toy\n")
    (toy_src / "run").chmod(0o755)
    (toy_src / "lib" / "a.js").write_text("1\n")
    with monkeypatch.context() as m:  # the real bundles stay where they are for the harnesses below
        m.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "cache"))
        toy = build_bundle(ToyHarness(toy_src), log=lambda *_: None)
    await asyncio.to_thread((toy.path / "lib" / "a.js").write_text, "tampered\n")  # after sealing: in the tarball
    async with await create_sandbox("docker", base) as sbx:
        sbx.spec = dataclasses.replace(sbx.spec, ro_mounts={str(toy.path): "/opt/swe-gym-agent"})
        with pytest.raises(SandboxError, match=r"lib/a\.js: FAILED"):
            await sbx.deliver_bundles()

    # no sha256sum in the image: the bundle's own runtime checks the digest (Pi: its node; OpenCode: Bun)
    for h in (pi, OpenCodeHarness()):
        async with await create_sandbox("docker", base) as sbx:
            await sbx._root_exec("rm -f /usr/bin/sha256sum")
            sbx.spec = dataclasses.replace(sbx.spec, ro_mounts=h.mounts())
            await sbx.deliver_bundles()
            r = await sbx.exec("command -v sha256sum || echo none; ls /opt/swe-gym-agent", timeout=30)
            assert r.stdout.split()[0] == "none" and "bundle.json" in r.stdout
