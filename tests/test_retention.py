"""Disk that does not fill: the results index (listings without a scan), the result cache, retention of results and
capture sessions (age, bytes, free-space floor, grace, rollouts in flight), the capture store giving pages back, and
a real full disk (a small tmpfs): the rollout being stored fails clearly, nothing stored is harmed, the store
recovers once space is freed, and the capture proxy refuses a call it cannot persist."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from swe_gym_env.server.capture.graph import Node
from swe_gym_env.server.capture.store import CaptureStore
from swe_gym_env.server.results.retention import GiB, Retention, RetentionSettings, parse_bytes
from swe_gym_env.server.results.store import INDEX_NAME, ResultsStore, disk_full
from swe_gym_env.wire import RolloutRequest, failed_result

REQ = RolloutRequest()


def result(rid: str, pad: int = 0, phase="done"):
    r = failed_result(REQ, "x" * pad, phase, rollout_id=rid)
    return r.model_copy(update={"ok": True, "error": None, "model_patch": "p" * pad})


def settings(**kw) -> RetentionSettings:
    base = {"max_age_s": 0, "results_max_bytes": 0, "capture_max_bytes": 0, "min_free_bytes": 0, "grace_s": 0}
    return RetentionSettings(**{**base, **kw})


# -- the index and the cache ----------------------------------------------------------------------------------
def test_listing_comes_from_the_index_which_is_rebuilt_when_missing_or_corrupt(tmp_path):
    store = ResultsStore(tmp_path)
    for i in range(5):
        store.put(result(f"r{i}"))
        time.sleep(0.002)
    assert [s.rollout_id for s in store.summaries(3)] == ["r4", "r3", "r2"]
    # a listing reads no result file: they may all be unreadable and it is unchanged
    for p in tmp_path.glob("r*.json"):
        os.chmod(p, 0)
    try:
        assert [s.rollout_id for s in store.summaries()] == ["r4", "r3", "r2", "r1", "r0"]
    finally:
        for p in tmp_path.glob("r*.json"):
            os.chmod(p, 0o644)
    store.close()
    (tmp_path / INDEX_NAME).write_bytes(b"not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / INDEX_NAME}{suffix}").unlink(missing_ok=True)
    rebuilt = ResultsStore(tmp_path)
    assert {s.rollout_id for s in rebuilt.summaries()} == {f"r{i}" for i in range(5)}
    # files added or removed behind its back: reconcile (startup, each periodic pass) fixes the index
    (tmp_path / "r0.json").unlink()
    (tmp_path / "x9.json").write_text(result("x9").model_dump_json())
    (tmp_path / "junk.json").write_text("{")
    assert rebuilt.reconcile() == {"added": 1, "dropped": 1}
    assert {s.rollout_id for s in rebuilt.summaries()} == {"r1", "r2", "r3", "r4", "x9"}
    assert rebuilt.usage()[0] == 5


def test_get_reads_from_disk_through_a_cache_bounded_in_count_and_bytes(tmp_path):
    store = ResultsStore(tmp_path, cache_items=3, cache_bytes=50_000)
    for i in range(6):
        store.put(result(f"r{i}", pad=5_000))
    n, b = store.cache_usage()
    assert n == 3 and b <= 50_000
    big = result("big", pad=60_000)
    store.put(big)  # over the byte bound alone: never cached
    assert "big" not in store._cache
    assert store.get("big") == big and store.get("r0") == result("r0", pad=5_000)  # from disk
    assert store.cache_usage()[0] == 3 and "r0" in store._cache
    assert store.get("nope") is None and store.get("../etc/passwd") is None


# -- retention ------------------------------------------------------------------------------------------------
def test_retention_of_results_by_age_bytes_free_space_grace_and_in_flight(tmp_path):
    store = ResultsStore(tmp_path)
    now = [time.time()]
    for i in range(10):
        store.put(result(f"r{i}", pad=10_000))
    # put stamps time.time(): spread them an hour apart, oldest first
    for i in range(10):
        store.db.execute("UPDATE results SET finished = ? WHERE id = ?", (now[0] - (10 - i) * 3600, f"r{i}"))
    size = store.usage()[1] // 10

    def ids():
        return sorted(s.rollout_id for s in store.summaries())

    # by age: older than 7.5 h goes (r0..r2 are 10, 9, 8 h old)
    Retention(settings(max_age_s=7.5 * 3600), store, None, clock=lambda: now[0]).run_pass()
    assert ids() == [f"r{i}" for i in range(3, 10)]
    # by bytes: oldest first down to the budget; the one in flight is skipped
    keep = Retention(settings(results_max_bytes=size * 4 + 10), store, None, busy=lambda: {"r3"}, clock=lambda: now[0])
    out = keep.run_pass()
    assert ids() == ["r3", "r7", "r8", "r9"] and out["results_deleted"] == 3
    # grace: nothing that ended under 2.5 h ago, whatever the limits (r8 and r9 are 2 h and 1 h old)
    Retention(settings(results_max_bytes=1, grace_s=2.5 * 3600), store, None, clock=lambda: now[0]).run_pass()
    assert ids() == ["r8", "r9"]
    # free-space floor: deletes while the disk is short
    low = Retention(settings(min_free_bytes=1), store, None, clock=lambda: now[0])
    free = iter([0, 10**12])
    low.free_bytes = lambda: next(free)  # type: ignore[method-assign]
    low.run_pass()
    assert ids() == ["r9"]
    assert not list(tmp_path.glob("r[0-8].json")) and (tmp_path / "r9.json").is_file()


def test_settings_from_env(monkeypatch):
    monkeypatch.setenv("SWE_GYM_RETENTION_RESULTS_BYTES", "1.5G")
    monkeypatch.setenv("SWE_GYM_RETENTION_MAX_AGE_H", "24")
    monkeypatch.setenv("SWE_GYM_RETENTION_GRACE_S", "60")
    s = RetentionSettings.from_env()
    assert s.results_max_bytes == int(1.5 * GiB) and s.max_age_s == 86400 and s.grace_s == 60
    assert s.capture_max_bytes == 10 * GiB and s.min_free_bytes == 2 * GiB  # defaults
    assert parse_bytes("512M") == 512 * 1024**2 and parse_bytes("10GiB") == 10 * GiB and parse_bytes("7") == 7
    monkeypatch.setenv("SWE_GYM_RETENTION_CAPTURE_BYTES", "lots")
    with pytest.raises(ValueError, match="SWE_GYM_RETENTION_CAPTURE_BYTES"):
        RetentionSettings.from_env()


def fill_capture(store: CaptureStore, sid: str, calls: int = 20, tokens: int = 20_000) -> None:
    store.open_session(sid, {})
    rng = np.random.default_rng(0)
    for i in range(calls):
        prompt = rng.integers(0, 50_000, tokens).astype(np.int32)
        node = Node(index=i, prompt=prompt, completion=np.arange(8, dtype=np.int32), logprobs=np.zeros(8))
        store.add_call(
            sid,
            node,
            finish_reason="stop",
            streamed=False,
            wall_s=0.1,
            request={"messages": [{"role": "user", "content": f"m{i}"}]},
            response={},
        )
    store.close_session(sid)


def test_capture_sessions_deleted_oldest_first_and_the_file_shrinks(tmp_path):
    store = CaptureStore(tmp_path / "capture.sqlite")
    r = Retention(settings(capture_max_bytes=4_000_000), None, store)
    r.prepare()
    assert r.incremental
    for i in range(4):
        fill_capture(store, f"s{i}")  # ~1.6 MB each
    store.open_session("live", {})  # open: a rollout in flight, never deleted
    for i in range(4):
        store.db.execute("UPDATE sessions SET closed = ? WHERE id = ?", (1000.0 + i, f"s{i}"))
    store.db.execute("UPDATE sessions SET created = 0 WHERE id = 'live'")
    store.reclaim()
    before = store.disk_bytes()
    out = r.run_pass()
    after = store.disk_bytes()
    assert out["sessions_deleted"] == 2 and set(store.session_ids()) == {"s2", "s3", "live"}
    assert store.load_session("s0") is None and store.load_session("s3")["calls"]
    assert before - after > 2_500_000, (before, after)  # pages went back to the file system
    assert out["capture_freed_bytes"] >= before - after  # (the deletes grew the log first)
    assert store.live_bytes() <= 4_000_000


def test_an_older_capture_store_is_switched_to_incremental_vacuum(tmp_path):
    path = tmp_path / "c.sqlite"
    store = CaptureStore(path)
    assert store.db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0  # as CaptureStore creates it
    fill_capture(store, "a", calls=3)
    assert store.ensure_incremental_vacuum()
    assert store.load_session("a")["calls"][2]["index"] == 2  # its data unharmed, the proxy's connection still works
    assert store.db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # (seen from its next transaction on)
    fill_capture(store, "b", calls=3)
    assert store.delete_session("a") > 0 and store.reclaim() > 0
    fill_capture(store, "c", calls=2)
    assert set(store.session_ids()) == {"b", "c"} and store.load_session("c")["calls"][1]["index"] == 1
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- a real full disk ---------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs: a disk that really fills (root, or passwordless sudo as on CI runners)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    r = subprocess.run(
        [*sudo, "mount", "-t", "tmpfs", "-o", "size=16m,mode=1777", "tmpfs", str(mnt)], capture_output=True
    )
    require(r.returncode == 0, f"cannot mount a tmpfs here: {r.stderr.decode()[-200:]}")
    try:
        yield mnt
    finally:
        subprocess.run([*sudo, "umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill the disk to the last page; the filler's path (delete it to free space)."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.json"))}


def test_results_store_on_a_full_disk_fails_cleanly_and_recovers(small_disk):
    store = ResultsStore(small_disk / "results")
    for i in range(3):
        store.put(result(f"r{i}", pad=2000))
    before, listed = snapshot(store.root), [s.rollout_id for s in store.summaries()]
    filler = fill(small_disk)
    with pytest.raises(OSError) as e:
        store.put(result("big", pad=300_000))
    assert disk_full(e.value)
    with pytest.raises(OSError):
        store.mark_running("next", REQ)
    # nothing stored is harmed: files byte for byte, the listing, no temporary file left behind
    assert snapshot(store.root) == before and [s.rollout_id for s in store.summaries()] == listed
    assert not list(store.root.glob(".*.tmp")) and store.get("big") is None
    store.delete("r0")  # retention still works on a full disk (the file goes first)
    filler.unlink()
    assert store.put(result("big", pad=300_000)) > 300_000
    assert [s.rollout_id for s in store.summaries()] == ["big", *[r for r in listed if r != "r0"]]
    assert store.reconcile() == {"added": 0, "dropped": 0}
    assert ResultsStore(store.root).get("big") == result("big", pad=300_000)


def test_service_fails_the_rollout_being_stored_with_disk_full_and_keeps_answering(small_disk):
    from swe_gym_env.server.capture import CaptureProxy
    from swe_gym_env.server.rollout import RolloutService, ServerConfig
    from swe_gym_env.server.rollout.record import RolloutRecord

    config = ServerConfig(engines={}, results_dir=small_disk / "results", retention=settings())
    service = RolloutService(config, CaptureProxy(None))
    stored = result("old", pad=1000)
    service.store.put(stored)
    filler = fill(small_disk)
    rec = RolloutRecord(rollout_id="big", request=REQ)
    service.rollouts["big"] = rec
    told = service._finish(rec, result("big", pad=300_000).model_copy(update={"phase": "grade"}))
    assert told.ok is False and told.phase == "grade" and told.error.startswith("disk full: ")
    assert told.reward is None
    status = service.get("big")  # kept in memory: not on disk
    assert status is not None and status.result == told
    assert [s.rollout_id for s in service.list()] == ["big", "old"]  # listed from memory, then from the index
    assert service.get("old").result == stored  # the server answers, the stored result is whole
    # a new rollout cannot even note that it started: it fails at once, saying why
    rec2 = service.submit(RolloutRequest(rollout_id="new-rollout", sandbox="local"))
    assert rec2.result is not None and rec2.result.ok is False and "disk full" in rec2.result.error
    filler.unlink()
    rec3 = RolloutRecord(rollout_id="after-the-space", request=REQ)
    service.rollouts["after-the-space"] = rec3
    assert service._finish(rec3, result("after-the-space", pad=1000)).ok is True
    assert "after-the-space" not in service.rollouts  # on disk (and its summary in the index), not in memory
    service.store._cache.clear()
    assert service.get("after-the-space").result == result("after-the-space", pad=1000)  # read back from disk
    # re-submitting a finished id returns its result, and starts nothing
    again = service.submit(RolloutRequest(rollout_id="after-the-space"))
    assert again.task is None and again.result == result("after-the-space", pad=1000)


@pytest.mark.anyio
@pytest.mark.usefixtures("need_tokenizer")
async def test_capture_proxy_refuses_a_call_it_cannot_persist_on_a_full_disk(small_disk):
    from test_capture import agent, agent_request, make_proxy, open_session

    from helpers import engine_app

    store = CaptureStore(small_disk / "capture.sqlite")
    proxy = make_proxy(engine_app(), store)
    session, key = open_session(proxy)
    async with agent(proxy, key) as c:
        ok = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        assert ok.status_code == 200
        filler = fill(small_disk)
        refused = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        assert refused.status_code == 500, refused.text
        assert "could not persist" in refused.json()["error"]["message"]
        assert "full" in refused.json()["error"]["message"]
        filler.unlink()
        again = await c.post("/v1/chat/completions", json=agent_request(stream=False))
        assert again.status_code == 200
    assert len(session.turns) == 2
    calls = store.load_session(session.id)["calls"]
    assert [c["index"] for c in calls] == [0, 1]  # the refused call left nothing half-written


def test_disk_full_recognises_the_errors():
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(sqlite3.OperationalError("database or disk is full"))
    assert not disk_full(OSError(errno.EACCES, "denied")) and not disk_full(ValueError("full"))


@pytest.mark.anyio
@pytest.mark.parametrize("grace_s", [0, 600])
async def test_a_finished_rollout_triggers_a_pass_and_health_shows_the_figures(tmp_path, grace_s):
    from swe_gym_env.server.capture import CaptureProxy
    from swe_gym_env.server.rollout import RolloutService, ServerConfig
    from swe_gym_env.server.rollout.record import RolloutRecord

    limits = settings(results_max_bytes=1, grace_s=grace_s)
    service = RolloutService(ServerConfig(engines={}, results_dir=tmp_path, retention=limits), CaptureProxy(None))
    for rid in ("first-rollout", "second-rollout"):
        rec = RolloutRecord(rollout_id=rid, request=REQ)
        service.rollouts[rid] = rec
        service._finish(rec, result(rid, pad=1000))
        await service.retention.aclose()  # the pass that finishing started (in a thread)
    listed = [s.rollout_id for s in service.list()]
    usage = service.retention.usage()
    assert usage["results"]["max_bytes"] == 1 and usage["disk"]["free_bytes"] > 0 and usage["grace_s"] == grace_s
    if grace_s:  # over budget, but both finished under the grace period ago: kept
        assert listed == ["second-rollout", "first-rollout"] and usage["last_pass"]["results_deleted"] == 0
    else:
        assert listed == [] and usage["results"] == {**usage["results"], "count": 0, "bytes": 0}
