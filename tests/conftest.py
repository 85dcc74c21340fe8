from __future__ import annotations

import os
import shutil

import pytest

from swe_gym_env.server.agents.opencode import OpenCodeHarness
from swe_gym_env.server.agents.pi import PiHarness
from swe_gym_env.server.assets import task_runtime_dir, tokenizer_dir

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
    require(h.binary(h.install_dir()).is_file(), "OpenCode not installed: run `swe-gym-env setup`")
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
