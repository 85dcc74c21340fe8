import asyncio
import os

import pytest

from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.usefixtures("need_sandbox")]


def spec(**kw) -> SandboxSpec:
    t = bundled_tasks()[0]
    return SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit, **kw)


async def test_repo_at_base_commit_and_nothing_of_the_host(monkeypatch):
    monkeypatch.setenv("SWE_GYM_SECRET_PROBE", "hunter2")
    t = bundled_tasks()[0]
    async with await create_sandbox("local", spec()) as sbx:
        r = await sbx.exec("git rev-parse HEAD; git remote; env; ls /work /root/.ssh 2>&1; echo end", timeout=30)
        assert r.ok
        assert r.stdout.splitlines()[0] == t.base_commit
        assert "hunter2" not in r.stdout and "SWE_GYM_SECRET_PROBE" not in r.stdout
        assert "No such file or directory" in r.stdout  # the server's checkout is not there
        tests = await sbx.exec("python -m pytest -q", timeout=60)
        assert "3 passed" in tests.stdout


async def test_no_network_without_relay_and_relay_reaches_only_the_socket(tmp_path):
    import socket

    sock_path = tmp_path / "capture.sock"
    seen: list[bytes] = []

    async def handle(r, w):
        seen.append(await r.read(100))
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await w.drain()
        w.close()

    server = await asyncio.start_unix_server(handle, str(sock_path))
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    host_port = tcp.getsockname()[1]
    try:
        async with await create_sandbox("local", spec(capture_socket=sock_path)) as sbx:
            probe = (
                f"python3 -c \"import socket; s=socket.create_connection(('127.0.0.1', {host_port}), 2)\" "
                "2>&1 | tail -1"
            )
            r = await sbx.exec(probe, timeout=30)
            assert "ConnectionRefused" in r.stdout  # the host's loopback is not the sandbox's
            url = f"{sbx.capture_base_url}/v1/models"
            fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
            r = await sbx.exec(fetch, timeout=30, relay=True)
            assert r.ok and r.stdout.strip() == "ok", r.stderr
            assert seen and seen[0].startswith(b"GET /capture/v1/models")
    finally:
        server.close()
        tcp.close()


def sleepers() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", b"300"]:
                    found.append(pid)
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
    return found


async def test_timeout_kills_the_process_tree_and_close_removes_everything():
    sbx = await create_sandbox("local", spec())
    root = sbx.root
    r = await sbx.exec("sleep 300 & sleep 300 & echo $$ > /tmp/pid; wait", timeout=1.5)
    assert r.timed_out and r.exit_code == 124
    await asyncio.sleep(0.2)
    assert sleepers() == []
    await sbx.close()
    await sbx.close()  # idempotent
    assert not root.exists()
    with pytest.raises(SandboxError):
        await sbx.exec("true", timeout=5)


async def test_file_access_cannot_escape(tmp_path):
    async with await create_sandbox("local", spec()) as sbx:
        await sbx.exec("ln -s /etc/hostname /testbed/link; ln -s / /tmp/rootlink", timeout=10)
        with pytest.raises(SandboxError):
            await sbx.read_file("/testbed/link")
        with pytest.raises(SandboxError):
            await sbx.read_file("/tmp/rootlink/etc/passwd")
        with pytest.raises(SandboxError):
            await sbx.write_file("/etc/evil", b"x")
        await sbx.write_file("/home/agent/secret.env", b"K=V\n", 0o600)
        r = await sbx.exec("stat -c %a /home/agent/secret.env; cat /home/agent/secret.env", timeout=10)
        assert r.stdout.split() == ["600", "K=V"]


async def test_bad_repo_source_is_a_boot_error():
    with pytest.raises(SandboxError, match="preparing the repository failed"):
        await create_sandbox("local", SandboxSpec(repo_source="/nonexistent.bundle", base_commit="a" * 40))
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        await create_sandbox("nope", spec())
