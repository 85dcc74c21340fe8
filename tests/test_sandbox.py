import asyncio
import os
import time

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


# This process's own long sleep: a plain `sleep 300` is also what other suites start (in their docker containers, all
# in this /proc), maybe at the same time on this machine, and what another run of this file starts.
SLEEP = f"300.{os.getpid()}"


def sleepers() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", SLEEP.encode()]:
                    found.append(pid)
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
    return found


async def settle(check, limit_s: float = 20.0) -> None:
    """Wait up to `limit_s` for `check()`: processes start and die asynchronously, later on a loaded machine than a
    fixed sleep assumed. The assertion that follows says what did not happen."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)


async def test_timeout_kills_the_process_tree_and_close_removes_everything():
    sbx = await create_sandbox("local", spec())
    root = sbx.root
    r = await sbx.exec(f"sleep {SLEEP} & sleep {SLEEP} & echo $$ > /tmp/pid; wait", timeout=1.5)
    assert r.timed_out and r.exit_code == 124
    await settle(lambda: sleepers() == [])
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


# -- protocol: argv, cwd, env, stdin, background processes ----------------------------------------------------------
async def test_argv_cwd_env_stdin_and_output_marker():
    async with await create_sandbox("local", spec()) as sbx:
        r = await sbx.exec(["printf", "%s|", "a b", "$HOME", "'q'"], timeout=10, cwd="/tmp")
        assert r.stdout == "a b|$HOME|'q'|"
        r = await sbx.exec("pwd; echo $FOO; cat", timeout=10, cwd="/home/agent", env={"FOO": "x y"}, stdin=b"in")
        assert r.stdout.split("\n") == ["/home/agent", "x y", "in"]
        big = await sbx.exec("head -c 600000 /dev/zero | tr '\\0' a", timeout=20)
        assert "output truncated by swe_gym_env" in big.stdout and len(big.stdout) < 300_000
        with pytest.raises(SandboxError):
            await sbx.exec("true", timeout=5, env={"BAD NAME": "x"})


async def test_background_process_poll_wait_and_kill_the_tree():
    async with await create_sandbox("local", spec()) as sbx:
        p = await sbx.start("sleep 0.3; echo finished; exit 3")
        assert await p.poll() is None
        r = await p.wait(10)
        assert r.exit_code == 3 and r.stdout == "finished\n" and await p.poll() == 3
        tree = await sbx.start(f"sleep {SLEEP} & sleep {SLEEP} & wait")
        await settle(lambda: len(sleepers()) >= 2)
        assert len(sleepers()) >= 2
        await tree.kill()
        await settle(lambda: sleepers() == [])
        assert sleepers() == []


async def test_secrets_go_through_a_file_never_argv():
    async with await create_sandbox("local", spec(secrets={"CAPTURE_KEY": "s3cr3t-value"})) as sbx:
        p = await sbx.start("sleep 5")
        await asyncio.sleep(0.3)
        assert not any(b"s3cr3t-value" in a for a in all_argv())
        r = await sbx.exec("echo $CAPTURE_KEY; stat -c %a /tmp/.swe-gym/secrets.env", timeout=10)
        assert r.stdout.split() == ["s3cr3t-value", "600"]
        await p.kill()


def is_dir(path: str) -> bool:
    return os.path.isdir(path)


def all_argv() -> list[bytes]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read())
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue
    return found


async def test_git_history_past_the_base_commit_is_gone(tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "a",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "a",
        "GIT_COMMITTER_EMAIL": "a@b",
    }
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, env=env, capture_output=True, text=True)  # noqa: E731
    repo.mkdir()
    run("init", "-q", "-b", "main")
    (repo / "f.py").write_text("bug\n")
    run("add", "."), run("commit", "-qm", "base")
    base = run("rev-parse", "HEAD").stdout.strip()
    (repo / "f.py").write_text("THE-FIX\n")
    run("add", "."), run("commit", "-qm", "the fix")
    fix = run("rev-parse", "HEAD").stdout.strip()
    run("tag", "v-fix"), run("branch", "other")
    async with await create_sandbox("local", SandboxSpec(repo_source=str(repo), base_commit=base)) as sbx:
        r = await sbx.exec(
            f"git log --all --oneline | wc -l; git rev-parse HEAD; git cat-file -t {fix} 2>&1; git tag; "
            "git grep -r THE-FIX $(git rev-list --all) | wc -l; git fsck --lost-found 2>&1 | wc -l",
            timeout=20,
        )
        lines = r.stdout.split("\n")
        assert lines[0] == "1" and lines[1] == base, r
        assert "fatal" in lines[2] or "could not get object" in lines[2], r
        assert lines[3:5] == ["0", "0"], r


# -- guarantees: a killed server leaves nothing running; nothing of the server is reachable ------------------------
KILLED_SERVER = """
import asyncio, sys
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks
async def main():
    t = bundled_tasks()[0]
    sbx = await create_sandbox("local", SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit))
    await sbx.start("sleep SLEEP & sleep SLEEP & wait")
    print(sbx.root, flush=True)
    await asyncio.sleep(300)
asyncio.run(main())
"""


async def test_a_server_killed_with_sigkill_leaves_no_process_and_the_next_one_reaps_its_dir():
    import signal
    import subprocess
    import sys

    from swe_gym_env.server.sandbox.registry import reap_orphans

    code = KILLED_SERVER.replace("SLEEP", SLEEP)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    root = proc.stdout.readline().strip()
    await settle(lambda: len(sleepers()) >= 2)
    assert len(sleepers()) >= 2 and is_dir(root)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    await settle(lambda: sleepers() == [])
    assert sleepers() == []  # --die-with-parent
    assert root in reap_orphans() and not is_dir(root)


async def test_limits_cap_pids_and_memory():
    from swe_gym_env.server.sandbox import cgroups
    from swe_gym_env.server.sandbox.base import Limits

    if cgroups.mode() is None:
        pytest.skip("cgroups are not writable here: the local backend runs without limits (preflight says so)")
    async with await create_sandbox("local", spec(limits=Limits(pids=40, memory_mb=64))) as sbx:
        r = await sbx.exec("for i in $(seq 80); do sleep 5 & done 2>&1; echo spawned", timeout=30)
        assert "fork" in r.stdout.lower() or "resource temporarily unavailable" in (r.stdout + r.stderr).lower(), r
        r = await sbx.exec("python3 -c 'x = bytearray(256 * 1024 * 1024); print(len(x))'", timeout=30)
        assert not r.ok and "268435456" not in r.stdout


def _leftovers() -> tuple[set[str], int, set[str]]:
    import glob
    import tempfile

    dirs = set(glob.glob(f"{tempfile.gettempdir()}/swe-gym-sbx-{os.getpid()}-*"))
    mounts = open("/proc/self/mountinfo").read().count("swe-gym-sbx")
    cg = set(glob.glob(f"/sys/fs/cgroup/*/swe-gym/swe-gym-sbx-{os.getpid()}-*")) | set(
        glob.glob(f"/sys/fs/cgroup/swe-gym/swe-gym-sbx-{os.getpid()}-*")
    )
    return dirs, mounts, cg


@pytest.mark.slow
async def test_200_create_close_cycles_leave_nothing_behind():
    before = (_leftovers(), sorted(os.listdir("/proc")).__len__())
    children = lambda: {p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == os.getpid()}  # noqa: E731
    already = children()  # session fixtures' processes (e.g. the HF emulator) are not this test's
    for i in range(200):
        sbx = await create_sandbox("local", spec())
        if i % 2:
            await sbx.start(f"sleep {SLEEP}")
        else:
            await sbx.exec("true", timeout=10)
        await sbx.close()
    settled = lambda: _leftovers() == (set(), 0, set()) and sleepers() == [] and children() == already  # noqa: E731
    await settle(settled)
    assert _leftovers() == before[0] == (set(), 0, set())
    assert sleepers() == [] and children() == already


def _ppid(pid: str) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


async def test_from_inside_only_capture_is_reachable_on_a_real_server():
    """A real server and engine: the sandbox's relay reaches /capture; the Task API, /mcp, the admin API, /health
    and the engine answer 404 through it or cannot be reached at all."""
    import glob
    import tempfile

    from helpers import Stack

    stack = Stack("oracle")
    try:
        (sock,) = glob.glob(f"{tempfile.gettempdir()}/swe-gym-capture-{stack.server.pid}-*/capture.sock")
        async with await create_sandbox("local", spec(capture_socket=sock)) as sbx:
            base = sbx.capture_base_url.removesuffix("/capture")
            probe = (
                "import sys, urllib.request as u, urllib.error as e\n"
                "for url in sys.argv[1:]:\n"
                "    try:\n"
                "        body = b'{}' if url.endswith(('mcp', 'tasks', 'completions')) else None\n"
                "        req = u.Request(url, data=body, headers={'content-type': 'application/json'})\n"
                "        r = u.urlopen(req, timeout=5)\n"
                "        print(r.status)\n"
                "    except e.HTTPError as x: print(x.code)\n"
                "    except Exception as x: print('unreachable', type(x).__name__)\n"
            )
            await sbx.write_file("/tmp/probe.py", probe.encode())
            urls = [
                f"{base}/capture/v1/chat/completions",  # through the relay: the capture app itself
                f"{base}/list_environments",
                f"{base}/swe_gym_env/tasks",
                f"{base}/mcp",
                f"{base}/health",
                f"{base}/capture/sessions",
                f"{base}/rollouts/x",
                f"http://127.0.0.1:{stack.server_port}/health",  # the server's own port: another netns
                f"http://127.0.0.1:{stack.engine_port}/health",  # the engine
                stack.engine_url("/v1/models"),
            ]
            r = await sbx.exec(["python3", "/tmp/probe.py", *urls], timeout=60, relay=True)
            codes = r.stdout.splitlines()
            assert len(codes) == len(urls), r
            assert codes[0] in ("400", "401", "403"), codes  # /capture answers (refuses a call without a key)
            assert codes[1:7] == ["404"] * 6, dict(zip(urls, codes, strict=True))
            assert all(c.startswith("unreachable") for c in codes[7:]), dict(zip(urls, codes, strict=True))
    finally:
        stack.stop()


async def test_backends_load_lazily_and_know_nothing_of_agents():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from swe_gym_env.server.sandbox.registry import backend_class, BACKENDS\n"
        "[backend_class(n) for n in BACKENDS]\n"
        "print([m for m in sys.modules if m.startswith(('swe_gym_env.server.agents', 'swe_gym_env.tasks'))])\n"
        "print('huggingface_hub' in sys.modules, 'e2b' in sys.modules)\n"
    )
    out = subprocess.run(  # noqa: ASYNC221
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "False False"  # SDKs load on first create, not on import
