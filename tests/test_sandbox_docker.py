"""The `docker` backend against a real dockerd (Debian docker.io, started by scripts/setup_docker.sh) and an image
imported from a debootstrap root filesystem."""

import asyncio
import json
import os
import subprocess
import time
import uuid

import pytest

from swe_gym_env.core.tempdirs import HOST, INCARNATION, server_id
from swe_gym_env.server.sandbox import docker as docker_backend
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec, SandboxUnavailable
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.usefixtures("need_docker", "need_sandbox")]


def spec(**kw) -> SandboxSpec:
    t = bundled_tasks()[0]
    return SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit, **kw)


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60).stdout


def in_container(name: str, script: str) -> str:
    return docker("exec", name, "sh", "-c", script)


async def settle(check, limit_s: float = 30.0) -> None:
    """Wait up to `limit_s` for `check()`: processes start and containers go asynchronously, later on a loaded machine
    than a fixed sleep assumed. The assertion that follows says what did not happen."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.2)


async def test_repo_tests_labels_limits_no_network_and_close_removes_the_container():
    t = bundled_tasks()[0]
    sbx = await create_sandbox("docker", spec(labels={"rollout": "r-docker-1"}, secrets={"KEY": "v-secret"}))
    async with sbx:
        r = await sbx.exec(
            "git rev-parse HEAD; git log --all --oneline | wc -l; python -m pytest -q | tail -1", timeout=60
        )
        assert r.ok, r
        head, _, tests = r.stdout.splitlines()
        assert head == t.base_commit and tests.startswith("3 passed")
        info = json.loads(docker("inspect", sbx.name))[0]
        labels = info["Config"]["Labels"]
        assert labels["swe-gym.server"] == server_id() and labels["swe-gym.incarnation"] == INCARNATION
        assert labels["swe-gym.rollout"] == "r-docker-1" and int(labels["swe-gym.expires"]) > 0
        assert info["HostConfig"]["NetworkMode"] == "none" and info["HostConfig"]["PidsLimit"] == 1024
        assert "v-secret" not in json.dumps(info)  # not in the container's config or argv
        r = await sbx.exec("echo $KEY; cat /proc/net/dev | grep -c ':'", timeout=10)
        assert r.stdout.split() == ["v-secret", "1"]  # only loopback
        r = await sbx.exec(["printf", "%s|", "a b", "$X"], timeout=10, cwd="/tmp", stdin=b"")
        assert r.stdout == "a b|$X|"
    assert sbx.name not in docker("ps", "-a", "--format", "{{.Names}}")
    await sbx.close()  # idempotent
    with pytest.raises(SandboxError):
        await sbx.exec("true", timeout=5)


async def test_background_and_timeout_kill_the_whole_tree_inside():
    async with await create_sandbox("docker", spec()) as sbx:
        p = await sbx.start("sleep 0.2; echo hi; exit 4")
        r = await p.wait(20)
        assert (r.exit_code, r.stdout) == (4, "hi\n")
        count = lambda: in_container(sbx.name, "pgrep -c -f '^sleep 30[01]'").strip()  # noqa: E731
        tree = await sbx.start("sleep 300 & sleep 300 & wait")
        await settle(lambda: count() == "2")
        assert count() == "2"
        await tree.kill()
        r = await sbx.exec("sleep 301 & sleep 301 & wait", timeout=1.5)
        assert r.timed_out
        await settle(lambda: count() == "0")
        assert count() == "0"


async def test_files_round_trip(tmp_path):
    async with await create_sandbox("docker", spec()) as sbx:
        await sbx.write_file("/home/agent/x/y.bin", bytes(range(256)) * 10, 0o600)
        assert await sbx.read_file("/home/agent/x/y.bin") == bytes(range(256)) * 10
        assert (await sbx.exec("stat -c %a /home/agent/x/y.bin", timeout=10)).stdout.strip() == "600"
        (tmp_path / "up").write_bytes(b"upload")
        await sbx.upload(tmp_path / "up", "/tmp/up")
        await sbx.download("/tmp/up", tmp_path / "down")
        assert (tmp_path / "down").read_bytes() == b"upload"
        with pytest.raises(FileNotFoundError):
            await sbx.read_file("/nope")


async def test_relay_reaches_only_the_capture_socket(tmp_path):
    sock_path = tmp_path / "capture.sock"
    seen: list[bytes] = []

    async def handle(r, w):
        seen.append(await r.read(100))
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await w.drain()
        w.close()

    server = await asyncio.start_unix_server(handle, str(sock_path))
    try:
        async with await create_sandbox("docker", spec(capture_socket=sock_path)) as sbx:
            url = f"{sbx.capture_base_url}/v1/models"
            fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
            r = await sbx.exec(fetch, timeout=30, relay=True)
            assert r.ok and r.stdout.strip() == "ok", r
            assert seen and seen[0].startswith(b"GET /capture/v1/models")
    finally:
        server.close()


async def test_orphans_of_a_dead_incarnation_are_reaped_and_containers_expire_by_themselves(monkeypatch):
    # Its own name and server id: another run on this machine (same cached server id) must neither remove this
    # container by name nor reap it as its own orphan, and this one must not reap theirs.
    monkeypatch.setenv("SWE_GYM_SERVER_ID", f"orphan-test-{uuid.uuid4().hex[:12]}")
    name = f"swe-gym-orphan-test-{os.getpid()}"
    docker("rm", "-f", name)
    docker(
        "run", "-d", "--rm", "--name", name, "--network", "none", "--label", f"swe-gym.server={server_id()}",
        "--label", f"swe-gym.host={HOST}", "--label", "swe-gym.pid=999999999",  # a server pid that is gone
        docker_backend.default_image(), "sleep", "300",
    )  # fmt: skip
    assert name in docker("ps", "--format", "{{.Names}}")
    reaped = docker_backend.reap_orphans()
    assert reaped and name not in docker("ps", "-a", "--format", "{{.Names}}")
    sbx = await create_sandbox("docker", spec(deadline_s=2))
    try:
        assert sbx.name in docker("ps", "--format", "{{.Names}}")
        assert f"docker:{sbx.name}" not in docker_backend.reap_orphans()  # ours, alive: kept
        gone = lambda: sbx.name not in docker("ps", "-a", "--format", "{{.Names}}")  # noqa: E731
        await asyncio.sleep(2)  # its deadline
        await settle(gone)
        assert gone()  # sleep <deadline> ended, --rm
    finally:
        await sbx.close()


async def test_missing_image_is_a_clear_error():
    with pytest.raises(SandboxUnavailable, match="not present"):
        await create_sandbox("docker", spec(image="swe-gym-env/no-such-image:1"))


@pytest.mark.slow
@pytest.mark.usefixtures("need_pi")
async def test_a_rollout_runs_on_docker_with_the_built_in_engine():
    from swe_gym_env.client.mcp_client import SweGymClient

    from helpers import Stack

    stack = Stack("oracle")
    try:
        async with SweGymClient(stack.mcp_url) as c:
            result = await c.run_rollout(harness="pi", sandbox="docker")
    finally:
        stack.stop()
    assert result.ok, result.error
    assert result.reward == 1.0 and result.sandbox == "docker" and len(result.turns) >= 2
    # this server's own containers (its pid on this host): servers of other tests share the server id (one cache dir)
    # and may hold containers of their own at this moment
    mine = ["--filter", f"label=swe-gym.host={HOST}", "--filter", f"label=swe-gym.pid={stack.server.pid}"]
    assert docker("ps", "-a", *mine, "--format", "{{.Names}} {{.Labels}}").strip() == ""
