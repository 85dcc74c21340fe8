"""Whether this server can install a harness on first use depends on the harness (server/agents/provision.py,
`install_refusal`): the npm ones need npm; the Python ones need what their runtime is built with
(server/agents/pyruntime.py) — the source Python 3.11, ldd, a pip to fetch the runtime's pip with, pip not offline —
and never npm. A fake Python and fake tools on a PATH of our own stand in for the host's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from swe_gym_env.server.agents import provision, pyruntime
from swe_gym_env.server.agents.harnesses.mini_swe_agent import MiniSweAgentHarness
from swe_gym_env.server.agents.harnesses.pi import PiHarness

# answers the two questions install_refusal asks a Python: its version, and whether it has pip
FAKE_PYTHON = """#!/bin/sh
case "$*" in
  *version_info*) echo "${FAKE_VERSION:-3.11}" ;;
  *find_spec*) exit "${FAKE_PIP_RC:-1}" ;;
  *) exit 2 ;;
esac
"""


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def host(monkeypatch, tmp_path):
    """A PATH of its own (``bin``: add tools to it), a fake source Python that has no pip, the server's own Python
    the same fake, no pip wheel fetched, nothing set offline."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = executable(tmp_path / "python3.11", FAKE_PYTHON)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv(pyruntime.SOURCE_ENV, str(python))
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setattr(provision, "_pip_fetched", lambda: False)
    for var in ("FAKE_VERSION", "FAKE_PIP_RC", "PIP_NO_INDEX", "PIP_FIND_LINKS", "npm_config_offline"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("NPM_CONFIG_OFFLINE", raising=False)
    return bin_dir


def test_a_python_harness_needs_what_its_runtime_is_built_with_and_not_npm(host, monkeypatch, tmp_path):
    mini = MiniSweAgentHarness()
    assert "SWE_GYM_INSTALL_ON_USE=0" in (provision.install_refusal(False, mini) or "")
    assert "no ldd" in (provision.install_refusal(True, mini) or "")
    executable(host / "ldd")
    assert "no pip to fetch the agent runtime's pip" in (provision.install_refusal(True, mini) or "")
    monkeypatch.setattr(provision, "_pip_fetched", lambda: True)  # fetched by an earlier install: no pip needed
    assert provision.install_refusal(True, mini) is None  # and no npm on this PATH
    monkeypatch.setattr(provision, "_pip_fetched", lambda: False)
    monkeypatch.setenv("FAKE_PIP_RC", "0")  # the source Python has a pip
    assert provision.install_refusal(True, mini) is None
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    assert "pip is set offline here" in (provision.install_refusal(True, mini) or "")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # offline, from a wheelhouse: it can try
    assert provision.install_refusal(True, mini) is None
    monkeypatch.setenv("FAKE_VERSION", "3.12")
    said = provision.install_refusal(True, mini) or ""
    assert "is Python 3.12, not 3.11" in said and pyruntime.SOURCE_ENV in said
    monkeypatch.setenv(pyruntime.SOURCE_ENV, str(tmp_path / "no-such-python"))
    said = provision.install_refusal(True, mini) or ""
    assert "no-such-python) does not run here" in said and pyruntime.SOURCE_ENV in said


def test_an_npm_harness_needs_npm_and_not_python(host, monkeypatch, tmp_path):
    pi = PiHarness()
    monkeypatch.setenv(pyruntime.SOURCE_ENV, str(tmp_path / "no-such-python"))  # no Python, no ldd, no pip
    assert "no npm" in (provision.install_refusal(True, pi) or "")
    assert "no npm" in (provision.install_refusal(True) or "")  # no harness named: what the npm ones take
    executable(host / "npm")
    assert provision.install_refusal(True, pi) is None and provision.install_refusal(True) is None
    monkeypatch.setenv("npm_config_offline", "true")
    assert "npm is set offline" in (provision.install_refusal(True, pi) or "")
    assert "does not run here" in (provision.install_refusal(True, MiniSweAgentHarness()) or "")


def test_the_pip_downloads_are_where_the_python_harness_fetches_its_pip(monkeypatch, tmp_path):
    name, version, _ = pyruntime.PIP
    monkeypatch.setattr(provision, "bundles_dir", lambda: tmp_path)
    assert provision.pip_downloads() == tmp_path / ".downloads" / "pip" and not provision._pip_fetched()
    provision.pip_downloads().mkdir(parents=True)
    (provision.pip_downloads() / f"{name}-{version}-py3-none-any.whl").write_bytes(b"not the pinned wheel")
    assert not provision._pip_fetched()  # a wheel that is not the pinned one counts for nothing


def test_openhands_needs_apt_get_and_dpkg_deb_for_its_debian_runtime_not_the_source_python(host, monkeypatch):
    from swe_gym_env.server.agents.harnesses.openhands import OpenHandsHarness

    oh = OpenHandsHarness()
    monkeypatch.setenv("FAKE_VERSION", "3.9")  # the host runtime's source Python is beside the point here
    assert "no apt-get or dpkg-deb" in (provision.install_refusal(True, oh) or "")
    executable(host / "apt-get")
    assert "no dpkg-deb" in (provision.install_refusal(True, oh) or "")
    executable(host / "dpkg-deb")
    assert "no pip to fetch the agent runtime's pip" in (provision.install_refusal(True, oh) or "")
    monkeypatch.setenv("FAKE_PIP_RC", "0")
    assert provision.install_refusal(True, oh) is None  # no npm, no ldd, a source Python of another version
    assert "is Python 3.9" in (provision.install_refusal(True, MiniSweAgentHarness()) or "")
