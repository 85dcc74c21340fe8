"""`setup --harness all` builds the Debian-Python agents (OpenHands, Kimi CLI, Mistral Vibe) side by side; they share
one suite's apt folder. The fetch is one at a time and reused: in a fresh Space image three concurrent `apt-get
update`s on one state folder failed on apt's lock (two of the three agents' setups failed)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from swe_gym_env.server.agents import pyruntime


def test_concurrent_fetches_of_one_suite_run_one_at_a_time_and_reuse_the_root(tmp_path, monkeypatch):
    source = pyruntime.DebianPython(version="3.13", suite="trixie", packages=("python3.13-minimal", "libc6"))
    inside, most, calls = [0], [0], []

    def fake_fetch(src, downloads: Path, log=print) -> Path:
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        calls.append(src.suite)
        time.sleep(0.3)
        root = downloads / f"debian-{src.suite}" / "root"
        root.mkdir(parents=True, exist_ok=True)
        inside[0] -= 1
        return root

    monkeypatch.setattr(pyruntime, "_fetch_debian", fake_fetch)
    roots: list[Path] = []
    threads = [
        threading.Thread(target=lambda: roots.append(pyruntime.fetch_debian(source, tmp_path))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1, "two fetches of one suite ran at once"
    assert calls == ["trixie"], "a root unpacked for the same packages is reused"
    assert len(set(roots)) == 1
