"""One client, several servers (client/servers.py, client/ws_client.py, client/trl_adapter.py).

- In memory (health answered by an httpx MockTransport): the choice follows free capacity and this client's own
  rollouts in flight; health is read once per TTL, not per rollout; a server whose health fails is skipped with a
  logged reason and used again when it recovers; all down is a clear error; servers without `capacity` are used by
  load; rollout ids name their server whatever the URL order.
- Real (one built-in engine, two `swe-gym-env serve` processes, the bundled tasks, local sandbox): 6 concurrent
  rollouts through one client with server A limited to 1 running rollout; each result is fetched back by a new
  client (servers listed in the other order) from the server its id names, and only that server has it; the MCP
  client spreads and finds rollouts the same way (same id tags); then A is
  killed mid-rollout: its rollout comes back failed at once (not a hang), new rollouts go to B, and with B gone too
  a rollout is a failed result naming both servers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import httpx
import pytest

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.client.servers import NoServerAvailable, ServerSet, id_tag, server_tag
from swe_gym_env.client.trl_adapter import run_rollouts
from swe_gym_env.client.ws_client import ServerError, SweGymWSClient
from swe_gym_env.tasks.catalog import bundled_tasks
from swe_gym_env.wire import RolloutRequest

from helpers import Stack

pytestmark = pytest.mark.anyio
A, B = "http://a.test:1", "http://b.test:2"


class FakeHealth:
    """`/health` per host: a dict (200 JSON), an int (that HTTP status) or an exception to raise."""

    def __init__(self, **by_host: object) -> None:
        self.by_host = by_host
        self.reads = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/health"
        self.reads += 1
        answer = self.by_host[request.url.host.split(".")[0]]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            return httpx.Response(answer)
        return httpx.Response(200, json=answer)


def healthy(max_rollouts: int | None, in_flight: int = 0) -> dict:
    body: dict = {"status": "healthy", "rollouts_in_flight": in_flight}
    if max_rollouts is not None:
        body["capacity"] = {"max_rollouts": max_rollouts, "in_flight": in_flight, "free": max_rollouts - in_flight}
    return body


def server_set(fake: FakeHealth, ttl: float = 60.0, urls=(A, B)) -> ServerSet:
    return ServerSet(list(urls), health_ttl_s=ttl, transport=httpx.MockTransport(fake))


async def test_choice_follows_free_capacity_and_own_rollouts():
    fake = FakeHealth(a=healthy(1), b=healthy(4, in_flight=1))  # A: 1 of 1 free; B: 3 of 4 free
    servers = server_set(fake)
    got = [await servers.acquire(1.0) for _ in range(4)]
    assert [s.url for s in got] == ["http://a.test:1"] + ["http://b.test:2"] * 3  # largest free share first
    assert fake.reads == 2  # one health read per server, not one per rollout
    with pytest.raises(TimeoutError, match="no server had a free rollout slot"):
        await servers.acquire(0.2)  # all full: the client waits rather than overfill a server
    servers.release(got[1])  # one of ours on B finished: B has a slot again without a new read
    assert (await servers.acquire(1.0)).url == "http://b.test:2"
    await servers.aclose()


async def test_waiting_rollout_takes_the_first_slot_freed():
    servers = server_set(FakeHealth(a=healthy(1), b=healthy(1)))
    first, second = await servers.acquire(1.0), await servers.acquire(1.0)
    waiting = asyncio.create_task(servers.acquire(5.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    servers.release(second)
    assert (await asyncio.wait_for(waiting, 2.0)) is second
    assert first.own == 1
    await servers.aclose()


async def test_unknown_capacity_is_used_by_load_after_servers_with_room():
    fake = FakeHealth(a=healthy(None, in_flight=5), b=healthy(None, in_flight=2))
    servers = server_set(fake)
    got = [(await servers.acquire(1.0)).url[7] for _ in range(5)]
    assert got == ["b", "b", "b", "a", "b"]  # least loaded (theirs + ours) first; never "full"
    await servers.aclose()
    fake = FakeHealth(a=healthy(None), b=healthy(2))
    servers = server_set(fake)
    got = [(await servers.acquire(1.0)).url[7] for _ in range(3)]
    assert got == ["b", "b", "a"]  # a server stating free slots first
    await servers.aclose()


async def test_a_failing_server_is_skipped_with_its_reason_until_it_recovers(caplog):
    fake = FakeHealth(a=httpx.ConnectError("refused"), b=healthy(2))
    servers = server_set(fake, ttl=0.05)
    with caplog.at_level(logging.WARNING, logger="swe_gym_env.client"):
        assert [(await servers.acquire(1.0)).url[7] for _ in range(2)] == ["b", "b"]
    warnings = [r.getMessage() for r in caplog.records if "a.test" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectError: refused" in warnings[0]  # logged once, with the reason
    fake.by_host["a"] = healthy(2)
    await asyncio.sleep(0.06)
    assert (await servers.acquire(1.0)).url[7] == "a"  # recovered at the next read
    fake.by_host["a"], fake.by_host["b"] = (
        503,
        {"status": "healthy", "capacity": {"max_rollouts": 0, "in_flight": 0, "free": 0}},
    )
    await asyncio.sleep(0.06)
    with pytest.raises(NoServerAvailable) as err:
        await servers.acquire(1.0)
    assert "a.test:1: health answered HTTP 503" in str(err.value)
    assert "b.test:2: no usable sandbox backend" in str(err.value)
    fake.by_host["b"] = {"status": "starting"}
    await servers.refresh(force=True)
    assert servers.servers[1].down == "health status 'starting'"
    await servers.aclose()


async def test_bad_capacity_fields_count_as_unknown():
    fake = FakeHealth(a={"status": "healthy", "capacity": {"max_rollouts": "8", "free": True}}, b=healthy(1))
    servers = server_set(fake)
    await servers.refresh()
    assert servers.servers[0].capacity is None and servers.servers[1].capacity is not None
    await servers.aclose()


def test_rollout_ids_name_their_server_whatever_the_url_order():
    one, other = ServerSet([A, B]), ServerSet(["HTTP://B.test:2/", A])
    assert server_tag(B) == server_tag("HTTP://B.test:2/") != server_tag(A)
    rid = one.new_rollout_id(one.servers[1])
    assert id_tag(rid) == server_tag(B) and RolloutRequest(rollout_id=rid).rollout_id == rid  # valid on the wire
    assert other.candidates(rid) == [other.servers[0]]  # a new client finds it from the id alone
    assert other.candidates("my-own-id-123") == other.servers  # a foreign id: every server is asked
    other.record("my-own-id-123", other.servers[1])
    assert other.candidates("my-own-id-123") == [other.servers[1]]
    with pytest.raises(ValueError, match="listed twice"):
        ServerSet([A, A + "/"])
    with pytest.raises(ValueError, match="not an http"):
        ServerSet(["ftp://x"])


# -- two real servers ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    a = Stack("oracle", env={"SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("a")), "SWE_GYM_MAX_ROLLOUTS": "1"})
    try:
        b = Stack(
            "oracle",
            engine_up=False,
            server_engine_url=a.engine_url("/v1"),
            env={"SWE_GYM_DATA_DIR": str(tmp_path_factory.mktemp("b"))},
        )
    except BaseException:
        a.stop()
        raise
    yield a, b
    b.stop()
    a.stop()


def url(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.server_port}"


async def watch_in_flight(stack: Stack, peak: list[int], stop: asyncio.Event) -> None:
    # /health probes the disk store in a thread: on a 2-core machine saturated by the suite it once took over 5 s
    async with httpx.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            body = (await http.get(f"{url(stack)}/health")).json()
            peak[0] = max(peak[0], (body.get("capacity") or {}).get("in_flight", body["rollouts_in_flight"]))
            await asyncio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_rollouts_spread_by_capacity_and_come_back_from_their_server(two_servers):
    a, b = two_servers
    stated = "capacity" in a.health()
    tasks = bundled_tasks()
    peak, stop = [0], asyncio.Event()
    watcher = asyncio.create_task(watch_in_flight(a, peak, stop))
    t0 = time.monotonic()
    async with SweGymWSClient([url(a), url(b)], health_ttl_s=0.5) as c:
        ids = [tasks[i % len(tasks)].instance_id for i in range(6)]
        results = await asyncio.gather(*[c.run_rollout(instance_id=i) for i in ids])
        ran = {r.rollout_id: c.servers.ran_on[r.rollout_id].url for r in results}
        started = {s.url: s.started for s in c.servers.servers}
    stop.set()
    await watcher
    wall = time.monotonic() - t0
    assert all(r.ok and r.reward == 1.0 for r in results), [r.error for r in results]
    if stated:  # A states 1 slot: it gets one rollout, B (8 slots) the other five
        assert started == {url(a): 1, url(b): 5} and peak[0] == 1, (started, peak)
    else:  # no capacity in /health (an older server): spread by load
        assert started == {url(a): 3, url(b): 3}, started
    async with SweGymWSClient([url(b), url(a)]) as fresh, httpx.AsyncClient(timeout=10) as http:
        for r in results:
            home = ran[r.rollout_id]
            assert id_tag(r.rollout_id) == server_tag(home)
            status = await fresh.get_rollout(r.rollout_id)  # a new client: found from the id alone
            assert status.state == "finished" and status.result and status.result.reward == 1.0
            other = url(b) if home == url(a) else url(a)
            assert (await http.get(f"{home}/rollouts/{r.rollout_id}")).status_code == 200
            assert (await http.get(f"{other}/rollouts/{r.rollout_id}")).status_code == 404
        with pytest.raises(ServerError, match="not found"):
            await fresh.get_rollout("no-such-rollout-1")  # asked of both servers
    print(f"6 rollouts over 2 servers: {wall:.1f}s, spread {started}, capacity stated: {stated}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_the_mcp_client_spreads_too_with_the_same_ids(two_servers):
    a, b = two_servers
    tasks = bundled_tasks()
    async with SweGymClient([a.mcp_url, b.mcp_url], health_ttl_s=0.5) as c:
        results = await asyncio.gather(*[c.run_rollout(instance_id=t.instance_id) for t in tasks[:2]])
        started = {s.url: s.started for s in c.servers.servers}
    assert all(r.ok and r.reward == 1.0 for r in results), [r.error for r in results]
    assert started == {url(a): 1, url(b): 1}  # A: one slot (or, by load, the least loaded first)
    assert sorted(id_tag(r.rollout_id) or "" for r in results) == sorted([server_tag(url(a)), server_tag(url(b))])
    async with SweGymClient([b.mcp_url, a.mcp_url]) as fresh:
        for r in results:
            status = await fresh.get_rollout(r.rollout_id)
            assert status.state == "finished" and status.result and status.result.reward == 1.0


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_a_killed_server_fails_its_rollouts_and_the_rest_go_on(two_servers):
    a, b = two_servers
    tasks = bundled_tasks()
    async with SweGymWSClient([url(a), url(b)], health_ttl_s=0.5) as c:
        doomed = asyncio.create_task(c.run_rollout(instance_id=tasks[0].instance_id))  # A listed first, A free
        for _ in range(200):
            if a.health()["rollouts_in_flight"] == 1:
                break
            await asyncio.sleep(0.05)
        os.kill(a.server.pid, signal.SIGKILL)
        t0 = time.monotonic()
        lost = await asyncio.wait_for(doomed, 30)  # an error result, never a hang
        assert time.monotonic() - t0 < 10
        assert not lost.ok and "ConnectionError" in lost.error and lost.rollout_id in lost.error, lost.error
        assert url(a) in lost.error
        more = await asyncio.gather(*[c.run_rollout(instance_id=t.instance_id) for t in tasks[:3]])
        assert all(r.ok and r.reward == 1.0 for r in more), [r.error for r in more]
        assert {c.servers.ran_on[r.rollout_id].url for r in more} == {url(b)}
        assert c.servers.servers[0].down is not None
        with pytest.raises(ConnectionError, match="unreachable"):
            await c.get_rollout(lost.rollout_id)  # its server is the one that is gone
    via_adapter = await run_rollouts([url(a), url(b)], [RolloutRequest(instance_id=tasks[1].instance_id)])
    assert via_adapter[0].ok and id_tag(via_adapter[0].rollout_id) == server_tag(url(b))
    b.stop()
    with pytest.raises(NoServerAvailable, match="no server available"):
        async with SweGymWSClient([url(a), url(b)]):
            pass
    gone = await run_rollouts([url(a), url(b)], [RolloutRequest(instance_id=tasks[1].instance_id)])
    assert not gone[0].ok and "no server available" in gone[0].error
    assert url(a) in gone[0].error and url(b) in gone[0].error
