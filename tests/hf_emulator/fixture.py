"""The ``hf_emulator`` pytest fixture: one emulator process per test run, its containers removed at the end (under
pytest-xdist every test that uses it runs on one worker: the `hf-emulator` group of tests/conftest.py).

`HFEmulator` gives a test what a process running the SDK needs (`env`, `docker_args`, `run_sdk`) and the fault
hooks (`kill_job`, `pause_job`, `unpause_job`) plus `jobs` to see every job and its stage.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from swe_gym_env.core import procs

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUN = HERE / "run.py"
TOKEN = "hf_emulator_dummy_token"
DOMAIN = "hfjobs.test"
CONTAINER_CA = "/.hfemu/ca.pem"


def venv_python() -> str:
    python = REPO / ".venv" / "bin" / "python"
    return str(python) if python.is_file() else sys.executable


@dataclass
class HFEmulator:
    """A running emulator: where it is, and how a process or container reaches it."""

    endpoint: str
    state_dir: Path
    instance: str
    token: str = TOKEN
    domain: str = DOMAIN
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        auth = {"Authorization": f"Bearer {self.token}"}
        self._client = httpx.Client(base_url=self.endpoint, headers=auth, timeout=60, trust_env=False)

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "tls" / "ca.pem"

    @property
    def hosts_file(self) -> Path:
        return self.state_dir / "hosts"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a process that runs the SDK against the emulator: ``base`` (default: this one) with
        HF_ENDPOINT, HF_TOKEN and SSL_CERT_FILE set, HF_HUB_OFFLINE (CI sets it; every HfApi call would raise) and
        proxies dropped, and a private HF_HOME (the pool cache lives there)."""
        env = dict(os.environ if base is None else base)
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "SSL_CERT_DIR"):
            env.pop(name, None)
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env.pop(name, None)
        env.update(HF_ENDPOINT=self.endpoint, HF_TOKEN=self.token, SSL_CERT_FILE=str(self.ca_file))
        env.update(HF_HOME=str(self.state_dir / "hf_home"), NO_PROXY=f"127.0.0.1,localhost,.{self.domain}")
        return env

    def container_mounts(self) -> list[str]:
        """``docker run`` mounts for a container that runs the SDK: the emulator's hosts file and its CA."""
        return ["-v", f"{self.hosts_file}:/etc/hosts:ro", "-v", f"{self.ca_file}:{CONTAINER_CA}:ro"]

    def container_env(self) -> dict[str, str]:
        """The environment of a container that runs the SDK (pass it as an env file: HF_TOKEN is a secret)."""
        return {
            "SSL_CERT_FILE": CONTAINER_CA,
            "HF_ENDPOINT": self.endpoint,
            "HF_TOKEN": self.token,
            "HF_HUB_OFFLINE": "0",
        }

    def docker_args(self) -> list[str]:
        """``docker run`` arguments for a container that runs the SDK (e.g. the Space): `container_mounts` and
        `container_env`. Its network must be the host's (``--network host``) to reach 127.0.0.1."""
        env = [a for k, v in self.container_env().items() for a in ("-e", f"{k}={v}")]
        return [*self.container_mounts(), *env]

    def run_sdk(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a Python snippet with the app venv's python, its /etc/hosts the emulator's (a private mount namespace:
        ``unshare -m``, or ``-rm`` when not root), its environment `env()`. The snippet is read from stdin."""
        script = 'mount --bind "$1" /etc/hosts && exec "$2" -'
        ns = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
        argv = [*ns, "sh", "-c", script, "sh", str(self.hosts_file), venv_python()]
        return subprocess.run(argv, input=code, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def jobs(self, stage: str | None = None) -> list[dict[str, Any]]:
        """Every job of this emulator with its stage (``stage``: only those in it)."""
        r = self._client.get("/_emulator/jobs")
        r.raise_for_status()
        return [j for j in r.json() if stage is None or j["stage"] == stage]

    def _fault(self, job_id: str, action: str) -> dict[str, Any]:
        r = self._client.post(f"/_emulator/jobs/{job_id}/{action}")
        if r.status_code != 200:
            raise RuntimeError(f"{action} {job_id}: {r.status_code} {r.text}")
        return r.json()

    def kill_job(self, job_id: str) -> dict[str, Any]:
        """``docker kill`` the job's container: the job dies (ERROR, exit code 137)."""
        return self._fault(job_id, "kill")

    def pause_job(self, job_id: str) -> dict[str, Any]:
        """``docker pause`` the job's container: its server stops answering, the job still reads RUNNING."""
        return self._fault(job_id, "pause")

    def unpause_job(self, job_id: str) -> dict[str, Any]:
        return self._fault(job_id, "unpause")

    def expire_job(self, job_id: str) -> dict[str, Any]:
        """The job's idle timeout fires now: its server shuts down as on a real idle timeout (the job completes)."""
        return self._fault(job_id, "expire")

    def containers(self) -> list[str]:
        """This emulator's containers as docker lists them (any state)."""
        out = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=hfemu.instance={self.instance}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return out.stdout.split()

    def close(self) -> None:
        self._client.close()


def docker_usable() -> bool:
    if shutil.which("docker") is None or shutil.which("unshare") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="session")
def hf_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HFEmulator]:
    """A Jobs emulator for the session; stopped at the end, and then none of its containers may be left."""
    from conftest import require

    require(docker_usable(), "no docker daemon (or no unshare) for the HF emulator")
    state = tmp_path_factory.mktemp("hf_emulator")
    port = procs.free_port()
    log = (state / "emulator.log").open("w")
    argv = [venv_python(), str(RUN), "--state-dir", str(state), "--port", str(port)]
    with ExitStack() as stack:
        stack.callback(log.close)
        proc = procs.start(argv, f"http://127.0.0.1:{port}/_emulator/health", stdout=log, stderr=log, timeout=120)
        emu = HFEmulator(f"http://127.0.0.1:{port}", state, (state / "instance").read_text().strip())
        try:
            yield emu
        finally:
            emu.close()
            procs.stop(proc, grace=60)
            leaked = emu.containers()
            if leaked:
                subprocess.run(["docker", "rm", "-f", *leaked], capture_output=True, timeout=120)
            output = (state / "emulator.log").read_text()
            assert "hf-emulator: stopped" in output, f"the emulator did not shut down cleanly: {output[-3000:]}"
            assert not leaked, f"the emulator left containers behind: {leaked}"
