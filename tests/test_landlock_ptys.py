"""Pty pairs handed to a landlock-confined command (`ptys=N`): opened by the launcher before it applies Landlock,
inherited by the command, the ruleset unchanged (server/sandbox/confine.py, `LandlockSandbox.gives_ptys`).

From inside the sandbox: the command uses its pairs fully (`bash -i` on one, as OpenHands' terminal runs it; a
controlling terminal, tcgetattr / tcsetattr, both directions), and still opens no pty of its own nor any terminal by
path (/dev/ptmx, /dev/pts/*, its own slave's /dev/pts/N, /dev/tty, a host terminal), changes no line discipline
(seccomp: TIOCSETD); a command that did not ask holds no pty descriptor at all, nor the variable. Why no grant could
do this instead: tests/test_openhands.py::test_the_landlock_sandbox_can_make_no_pty_and_reach_no_host_terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from swe_gym_env.client.mcp_client import SweGymClient
from swe_gym_env.server.agents.base import AgentError
from swe_gym_env.server.agents.harnesses.openhands import OpenHandsHarness
from swe_gym_env.server.sandbox import confine, landlock
from swe_gym_env.server.sandbox.registry import backend_class

from helpers import Stack, full_turns

PROBE = r"""import errno, fcntl, json, os, select, subprocess, sys, termios, time
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def tty_fds():
    out = {}
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("/dev/pts", "/dev/ptmx", "/dev/tty")):
            out[fd] = target
    return out
def read_until(fd, needle, limit=20.0):
    got, end = b"", time.time() + limit
    while needle not in got and time.time() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                got += os.read(fd, 4096)
            except OSError:
                break
    return got.decode(errors="replace")
given = os.environ.get("SWE_GYM_PTYS")
out = {"env": given, "tty fds": sorted(tty_fds().values())}
pairs = [tuple(map(int, p.split(":"))) for p in (given or "").split(",") if p]
out["pairs"] = len(pairs)
out["all ttys"] = all(os.isatty(fd) for pair in pairs for fd in pair)
if pairs:
    m, s = pairs[0]
    slave_path = os.ttyname(s)
    out["slave path"] = slave_path
    pid = os.fork()
    if pid == 0:  # a session of its own, the given slave as its controlling terminal, then what it may do with it
        res = {}
        os.setsid()
        res["ctty"] = attempt(lambda: fcntl.ioctl(s, termios.TIOCSCTTY, 0))
        def echo_off():
            attrs = termios.tcgetattr(s); attrs[3] &= ~termios.ECHO; termios.tcsetattr(s, termios.TCSANOW, attrs)
        res["tcsetattr"] = attempt(echo_off)
        os.write(s, b"from-slave\n")
        res["master reads"] = read_until(m, b"from-slave")
        os.write(m, b"from-master\n")
        res["slave reads"] = read_until(s, b"from-master")
        res["/dev/tty (own ctty)"] = attempt(lambda: os.close(os.open("/dev/tty", os.O_RDWR)))
        res["reopen own slave"] = attempt(lambda: os.close(os.open(slave_path, os.O_RDWR | os.O_NOCTTY)))
        res["peer of given master"] = attempt(lambda: os.close(fcntl.ioctl(m, 0x5441, os.O_RDWR | os.O_NOCTTY)))
        res["set line discipline"] = attempt(lambda: fcntl.ioctl(s, 0x5423, (0).to_bytes(4, "little")))
        os.write(1, json.dumps(res).encode())
        os._exit(0)
    r, w = os.pipe()
    os.waitpid(pid, 0)
    m2, s2 = pairs[-1]  # bash -i on another pair, as OpenHands' subprocess terminal runs it
    bash = subprocess.Popen(["bash", "--norc", "--noprofile", "-i"], stdin=s2, stdout=s2, stderr=s2,
                            preexec_fn=os.setsid, close_fds=True, env={"PATH": os.environ["PATH"], "PS1": "$ "})
    os.close(s2)  # bash holds the only slave now: its exit ends the master's reads (EIO)
    os.write(m2, b"echo bash-on-pty-$((6*7)); tty; exit\n")
    out["bash"] = read_until(m2, b"never printed")
    bash.wait(20)
out["openpty"] = attempt(os.openpty)
out["open /dev/ptmx"] = attempt(lambda: os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)))
out["open /dev/pts/ptmx"] = attempt(lambda: os.close(os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY)))
out["/dev/tty"] = attempt(lambda: os.open("/dev/tty", os.O_RDWR))
out["list /dev/pts"] = attempt(lambda: os.listdir("/dev/pts"))
out["host pty"] = attempt(lambda: os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY))
print("\n" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def need_full_landlock() -> None:
    require(confine.landlock_abi() >= confine.FULL_ABI, "the kernel's Landlock ABI is below 6")


@pytest.fixture
def host_terminal():
    """A terminal of the host's, as an operator's shell would hold one: its /dev/pts path."""
    master, slave = os.openpty()
    try:
        yield os.ttyname(slave)
    finally:
        os.close(master)
        os.close(slave)


def confined(tmp_path: Path, host: str, ptys: int) -> tuple[dict, dict]:
    """The probe under the launcher with the backend's own grants (`landlock.DEVICES`): (its report, its child's)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (tmp_path / "probe.py").write_text(PROBE)
    cfg = {"ro": [*landlock.system_ro(), str(tmp_path / "probe.py")], "rw": [str(work)], "dev": landlock.DEVICES}
    if ptys:
        cfg["ptys"] = ptys
    argv = landlock._confine_argv(cfg, [sys.executable, "-I", "-S", str(tmp_path / "probe.py"), host])
    env = {"PATH": "/usr/bin:/bin", "SWE_GYM_PTYS": "0:1"}  # a stale value from outside never gets through
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=work, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    child = json.loads(lines[0]) if ptys else {}
    return json.loads(lines[-1]), child


DENIED = {
    "openpty": "EACCES",
    "open /dev/ptmx": "EACCES",
    "open /dev/pts/ptmx": "EACCES",
    "/dev/tty": "EACCES",
    "list /dev/pts": "EACCES",
    "host pty": "EACCES",
}


@pytest.mark.integration
def test_a_confined_command_uses_its_given_ptys_and_still_opens_no_terminal(
    need_full_landlock, tmp_path, host_terminal
):
    out, child = confined(tmp_path, host_terminal, 4)
    assert out["pairs"] == 4 and out["all ttys"] and re.fullmatch(r"\d+:\d+(,\d+:\d+){3}", out["env"])
    assert len(out["tty fds"]) == 8 and out["tty fds"].count("/dev/ptmx") == 4, out["tty fds"]
    assert host_terminal not in out["tty fds"]
    assert "bash-on-pty-42" in out["bash"] and "/dev/pts/" in out["bash"], out["bash"]  # `tty` names its pty
    assert child["ctty"] == "ok" and child["tcsetattr"] == "ok"
    assert "from-slave" in child["master reads"] and "from-master" in child["slave reads"]
    assert {k: v for k, v in out.items() if k in DENIED} == DENIED
    assert child["/dev/tty (own ctty)"] == "EACCES"  # its own terminal, by path: still a path Landlock refuses
    assert child["reopen own slave"] == "EACCES"  # its own slave's /dev/pts/N, likewise
    assert child["peer of given master"] == "EACCES"  # TIOCGPTPEER opens /dev/pts/N: Landlock checks it too
    assert child["set line discipline"] == "EPERM"  # seccomp: TIOCSETD refused


@pytest.mark.integration
def test_a_command_that_did_not_ask_holds_no_pty_nor_the_variable(need_full_landlock, tmp_path, host_terminal):
    out, _ = confined(tmp_path, host_terminal, 0)
    assert out["env"] is None and out["pairs"] == 0 and out["tty fds"] == []
    assert {k: v for k, v in out.items() if k in DENIED} == DENIED


def test_only_landlock_gives_ptys_and_every_backend_has_or_gives_them():
    assert backend_class("landlock").gives_ptys and not backend_class("landlock").has_ptys
    for name in ("local", "docker", "e2b", "hf", "hf-pool"):
        cls = backend_class(name)
        assert cls.has_ptys and not cls.gives_ptys, name
    assert confine.open_ptys(0) == ""
    with pytest.raises(confine.ConfineError):
        confine.open_ptys(confine.MAX_PTYS + 1)


def test_only_the_agent_command_asks_for_ptys():
    """Grading, setup and the pipeline's own commands never ask: the one caller that passes `ptys=` is the agent
    phase, and only for a harness that `needs_pty`."""
    server = Path(__file__).resolve().parent.parent / "server"
    callers = sorted(
        str(p.relative_to(server))
        for p in server.rglob("*.py")
        if "sandbox" not in p.parts and re.search(r"\bptys=", p.read_text())
    )
    assert callers == ["rollout/agent_run.py"]
    text = (server / "rollout" / "agent_run.py").read_text()
    assert "ptys = PTYS if harness.needs_pty else 0" in text


@pytest.mark.anyio
@pytest.mark.integration
async def test_through_the_sandbox_api_only_the_command_that_asks_gets_them(need_full_landlock, tmp_path):
    from swe_gym_env.server.sandbox.base import SandboxSpec
    from swe_gym_env.server.sandbox.registry import create_sandbox
    from swe_gym_env.tasks.catalog import bundled_tasks

    ok, why = landlock.preflight()
    require(ok, f"landlock backend unavailable here: {why}")
    t = bundled_tasks()[0]
    show = 'echo "env=${SWE_GYM_PTYS-unset}"; ls -l /proc/$$/fd | grep -c -e /dev/ptmx -e /dev/pts || true'
    async with await create_sandbox("landlock", SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit)) as s:
        asked = await s.exec(show, timeout=30, ptys=2)
        assert asked.ok and re.fullmatch(r"env=\d+:\d+,\d+:\d+\n4\n", asked.stdout), asked
        plain = await s.exec(show, timeout=30)
        assert plain.ok and plain.stdout == "env=unset\n0\n", plain
        proc = await s.start(f"{{ {show}; }} > /tmp/started.txt")
        await proc.wait(30)
        assert (await s.read_file("/tmp/started.txt")).decode() == "env=unset\n0\n"
        with pytest.raises(Exception, match="ptys must be"):
            await s.exec("true", timeout=5, ptys=-1)


# the agent's own terminal (OpenHands' `bash -i`) on landlock shows what it holds: the variable, its descriptors
TERMINAL = 'echo "ptys=${SWE_GYM_PTYS-unset}"; for f in /proc/$$/fd/*; do echo "fd ${f##*/} $(readlink $f)"; done'
LONG = {"SWE_GYM_ENGINE_MAX_MODEL_LEN": "32768", "SWE_GYM_CONTEXT_WINDOW": "32768"}  # as tests/test_openhands.py


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.anyio
async def test_openhands_terminal_on_landlock_holds_one_given_pty_and_not_the_variable(need_full_landlock):
    """End to end: OpenHands' terminal runs on a given pair; the variable never reaches it, nor the other pairs."""
    try:
        OpenHandsHarness().mounts()
    except AgentError as e:
        require(False, f"openhands: {e}")
    ok, why = landlock.preflight()
    require(ok, f"landlock backend unavailable here: {why}")
    stack = Stack(f"oracle+probe:{TERMINAL}; echo fds-end", env=LONG)
    try:
        async with SweGymClient(stack.mcp_url) as c:
            result = await c.run_rollout(harness="openhands", sandbox="landlock", deadline_s=240)
    finally:
        stack.stop()
    assert result.ok and result.reward == 1.0 and result.cross_check == "match", (result.error, result.agent_log_tail)
    seen = [t for t in full_turns(result)[1:] if "fds-end" in str(t.request.get("messages"))]
    assert seen, "the probe's output never reached the model"
    tool = [m for m in seen[0].request["messages"] if m.get("role") == "tool"][-1]
    content = tool.get("content")
    text = "\n".join(c.get("text", "") for c in content) if isinstance(content, list) else str(content)
    assert "ptys=unset" in text, text
    fds = dict(re.findall(r"^fd (\d+) (\S*)", text, re.M))
    terminals = {target for target in fds.values() if target.startswith(("/dev/pts", "/dev/ptmx", "/dev/tty"))}
    assert len(terminals) == 1 and next(iter(terminals)).startswith("/dev/pts/"), fds  # its own slave, nothing else
    assert fds.get("0") == fds.get("1") == fds.get("2") == next(iter(terminals)), fds
