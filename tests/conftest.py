from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hf_emulator.fixture import hf_emulator  # noqa: F401  (the HF Jobs emulator, session scope)

from swe_gym_env.server.agents.opencode import OpenCodeHarness
from swe_gym_env.server.agents.pi import PiHarness
from swe_gym_env.server.assets import task_runtime_dir, tokenizer_dir

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parent.parent
BASE_IMAGE = os.environ.get("SWE_GYM_DOCKER_IMAGE", "swe-gym-env/base:bookworm")  # made by scripts/setup_docker.sh
SPACE_IMAGE = "swe-gym-env/space:test"


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
def need_docker() -> None:
    """A docker daemon with the default sandbox image; started by scripts/setup_docker.sh when we may (root)."""
    import subprocess

    from swe_gym_env.server.sandbox.docker import preflight

    ok, why = preflight()
    if (not ok or "MISSING" in why) and os.geteuid() == 0:
        script = os.path.join(os.path.dirname(__file__), "..", "scripts", "setup_docker.sh")
        r = subprocess.run(["bash", script], capture_output=True, text=True, timeout=1200)
        ok, why = preflight() if r.returncode == 0 else (False, f"setup_docker.sh failed: {r.stderr[-500:]}")
    require(ok and "MISSING" not in why, f"docker sandbox unavailable: {why}")


def docker_ready() -> bool:
    """A docker CLI and daemon with the local base image the Space image builds from."""
    if shutil.which("docker") is None:
        return False
    ok = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, timeout=30)
    return ok.returncode == 0


@pytest.fixture(scope="session")
def space_image() -> str:
    """The Space image (the repo's Dockerfile), built once per test run (it takes minutes) for every test that runs
    it: tests/test_space.py (health, uid, tools) and tests/test_sandbox_landlock.py (sandboxes inside it)."""
    require(docker_ready(), f"no docker daemon with {BASE_IMAGE}: run `bash scripts/setup_docker.sh`")
    argv = ["docker", "build", "--network", "host", "--build-arg", f"BASE={BASE_IMAGE}", "-t", SPACE_IMAGE]
    extra_ca = "".join(p.read_text() for p in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")))
    if extra_ca:  # this machine's TLS-intercepting egress proxy: the build must trust its CA to reach PyPI and npm
        argv += ["--build-arg", f"EXTRA_CA_CERT={extra_ca}"]
    build = subprocess.run([*argv, str(REPO)], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    return SPACE_IMAGE


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
