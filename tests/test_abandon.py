"""A starting server abandons only what servers that are gone left open, never a live server's work on the same data
dir (core/owners.py): capture sessions (`CaptureStore.abandon_open`), `.running` rollouts and half-written
temporary files (`ResultsStore.recover`). Owners are real processes holding the real stores; the dead one is killed
with SIGKILL, so it runs no cleanup at all."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from swe_gym_env.core import owners
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.results.store import ResultsStore
from swe_gym_env.wire import RolloutRequest

# a server's stores in a process of its own: opens a capture session, marks a rollout running (phase agent) and leaves a
# temporary result file mid-write, then waits to be killed
OWNER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from swe_gym_env.server.capture.store import CaptureStore
    from swe_gym_env.server.results.store import ResultsStore
    from swe_gym_env.wire import RolloutRequest

    data, name = Path(sys.argv[1]), sys.argv[2]
    capture, results = CaptureStore(data / "capture.sqlite"), ResultsStore(data / "results")
    capture.open_session("session-" + name, {"who": name})
    results.mark_running("rollout-" + name, RolloutRequest(), "agent")
    tmp = results.root / f".rollout-{name}.json.{results.owner.id}.tmp"
    tmp.write_bytes(b'{"half": ')
    print(json.dumps({"capture": capture.owner.id, "results": results.owner.id, "tmp": str(tmp)}), flush=True)
    time.sleep(600)
    """
)


class OwnerProcess:
    def __init__(self, data: Path, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER, str(data), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it holds its locks and wrote its records (or died)
        if not line:
            self.proc.kill()
            raise AssertionError(f"owner {name} did not start: {self.proc.communicate(timeout=30)[1][-2000:]}")
        self.ids = json.loads(line)
        self.tmp = Path(self.ids["tmp"])

    def kill(self) -> None:
        """SIGKILL: no cleanup runs, the kernel drops its locks."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        assert self.proc.returncode == -signal.SIGKILL


@pytest.fixture
def two_owners(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    live, dead = OwnerProcess(data, "live"), None
    try:
        dead = OwnerProcess(data, "dead")
        dead.kill()
        yield data, live, dead
    finally:
        for o in (live, dead):
            if o is not None and o.proc.poll() is None:
                o.proc.kill()
                o.proc.wait(30)


def state(data: Path, session_id: str) -> str:
    with sqlite3.connect(data / "capture.sqlite") as db:
        return db.execute("SELECT state FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]


def test_a_starting_store_abandons_the_killed_servers_work_and_leaves_the_live_ones(two_owners):
    data, live, dead = two_owners
    capture, results = CaptureStore(data / "capture.sqlite"), ResultsStore(data / "results")
    try:
        assert capture.abandon_open() == ["session-dead"]
        assert state(data, "session-live") == "open" and state(data, "session-dead") == "abandoned"
        assert capture.load_session("session-dead")["meta"] == {"who": "dead"}  # still readable

        assert results.recover() == ["rollout-dead"]
        failed = results.get("rollout-dead")
        assert failed is not None and failed.ok is False and failed.phase == "agent" and failed.reward is None
        assert "server_restarted: the server stopped in phase 'agent'" in (failed.error or "")
        assert results.get("rollout-live") is None, "a live server's rollout in flight was given a result"
        assert (results.root / "rollout-live.running").is_file()
        assert not (results.root / "rollout-dead.running").exists()
        assert live.tmp.is_file() and not dead.tmp.exists()  # its write in progress is not pulled from under it

        # the dead owner's lock files are gone; the live one's stay, held
        assert not (data / "capture.sqlite.owners" / f"{dead.ids['capture']}.lock").exists()
        assert not (data / "results" / ".owners" / f"{dead.ids['results']}.lock").exists()
        assert owners.alive(data / "capture.sqlite.owners", live.ids["capture"])
        assert owners.alive(data / "results" / ".owners", live.ids["results"])

        # a second start changes nothing more; this store's own sessions are never its own victims
        capture.open_session("session-mine", {})
        assert capture.abandon_open() == [] and results.recover() == []
        assert state(data, "session-live") == "open" and state(data, "session-mine") == "open"

        live.kill()  # now that one crashes too: the next start takes its work as a dead server's
        assert capture.abandon_open() == ["session-live"]
        assert results.recover() == ["rollout-live"] and not live.tmp.exists()
        assert state(data, "session-mine") == "open"
    finally:
        capture.close()
        results.close()


def test_two_stores_in_one_process_are_two_owners(tmp_path):
    """A flock belongs to an open file description: two servers in one process (tests, `local_service`) do not
    take each other for dead, and a closed store's open sessions are a dead server's."""
    path = tmp_path / "capture.sqlite"
    a = CaptureStore(path)
    a.open_session("a-1", {})
    b = CaptureStore(path)
    try:
        assert b.abandon_open() == [] and b.load_session("a-1")["state"] == "open"
        a.close()
        assert b.abandon_open() == ["a-1"] and b.load_session("a-1")["state"] == "abandoned"
    finally:
        a.close()
        b.close()
    r1 = ResultsStore(tmp_path / "results")
    r1.mark_running("r-1", RolloutRequest())
    r2 = ResultsStore(tmp_path / "results")
    try:
        assert r2.recover() == [] and r2.get("r-1") is None
        r1.close()
        assert r2.recover() == ["r-1"] and r2.get("r-1").ok is False  # type: ignore[union-attr]
    finally:
        r2.close()


def test_records_without_an_owner_or_with_a_forged_one_count_as_a_dead_servers(tmp_path):
    """Stores written before owners were kept; an owner field that is not an id is never a path to probe."""
    path = tmp_path / "capture.sqlite"
    first = CaptureStore(path)
    first.open_session("old", {})
    first.open_session("forged", {})
    first.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE sessions SET state = 'open', owner = NULL WHERE id = 'old'")
        db.execute("UPDATE sessions SET state = 'open', owner = '../../../../etc/passwd' WHERE id = 'forged'")
    store = CaptureStore(path)
    try:
        assert sorted(store.abandon_open()) == ["forged", "old"]
    finally:
        store.close()
    results = tmp_path / "results"
    results.mkdir()
    body = {"rollout_id": "legacy", "request": RolloutRequest().model_dump(mode="json"), "phase": "boot"}
    (results / "legacy.running").write_text(json.dumps(body))
    (results / "forged.running").write_text(json.dumps({**body, "rollout_id": "forged", "owner": "/etc/passwd"}))
    (results / ".legacy.json.999999999.tmp").write_text("{")  # a dead pid's, named before owners
    store2 = ResultsStore(results)
    try:
        assert sorted(store2.recover()) == ["forged", "legacy"]
        assert not (results / ".legacy.json.999999999.tmp").exists()
    finally:
        store2.close()


def test_owner_locks_of_crashed_servers_are_swept_and_a_live_one_is_not(tmp_path):
    folder = tmp_path / "owners"
    mine = owners.Owner(folder)
    stale = "o" + "0" * 32
    (folder / f"{stale}.lock").write_text("pid 1\n")  # a crashed owner's file: nobody holds its lock
    assert owners.sweep(folder) == [stale]
    assert sorted(p.name for p in folder.iterdir()) == [f"{mine.id}.lock"]
    assert mine.alive_check(mine.id) and owners.alive(folder, mine.id)
    mine.release()
    assert not mine.alive_check(mine.id) and not owners.alive(folder, mine.id) and list(folder.iterdir()) == []


@pytest.mark.slow
@pytest.mark.integration
def test_a_real_server_starting_on_a_shared_data_dir_leaves_the_live_servers_work_open(two_owners):
    """`swe-gym-env serve` on a data dir another live server uses: the killed one's session is abandoned and its
    rollout reads back failed; the live one's session stays open and its rollout is not given a result."""
    from helpers import Stack

    data, live, _dead = two_owners
    s = Stack("oracle", engine_up=False, server_engine_url="http://127.0.0.1:9/v1", env={"SWE_GYM_DATA_DIR": str(data)})
    try:
        base = f"http://127.0.0.1:{s.server_port}"
        assert state(data, "session-dead") == "abandoned"
        assert state(data, "session-live") == "open", "the starting server abandoned a live server's session"
        dead_status = httpx.get(f"{base}/rollouts/rollout-dead", timeout=30)
        assert dead_status.status_code == 200, dead_status.text
        body = dead_status.json()
        assert body["state"] == "finished" and body["result"]["ok"] is False
        assert "server_restarted" in body["result"]["error"]
        assert httpx.get(f"{base}/rollouts/rollout-live", timeout=30).status_code == 404
        assert (data / "results" / "rollout-live.running").is_file() and live.tmp.is_file()
        assert s.health()["capture_sessions"] == 0  # the live server's session is not this server's
    finally:
        s.stop()
