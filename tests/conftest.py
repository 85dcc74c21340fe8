from __future__ import annotations

import os
import shutil

import pytest

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
def anyio_backend() -> str:
    return "asyncio"
