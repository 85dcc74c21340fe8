"""The `landlock` backend (Landlock + seccomp + rlimits, no namespaces): the security probes from inside a sandbox,
on this host and inside the Space image (uid 1000, docker's default seccomp), and rollouts / validate there.

The probes run from inside one sandbox against a real engine + server (started by `DRIVER`, a standalone program
run with the app's interpreter, here and in the container alike) and assert the specific denial: EACCES / EPERM,
never just "some error". Test traffic stays on loopback (the container runs with `--network none`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import require

from swe_gym_env.server.sandbox import confine
from swe_gym_env.server.sandbox.landlock import preflight, probe

DRIVER = r'''
import asyncio, glob, json, os, shutil, sys, tempfile, time
import httpx
from swe_gym_env.core import procs
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks

ADMIN = "adm-landlock-" + os.urandom(6).hex()
PROBE = """
import errno, json, os, signal, socket, sys, urllib.request, urllib.error
cfg = json.load(open(sys.argv[1]))
out = {}
def attempt(name, fn):
    try:
        out[name] = ["ok", fn()]
    except OSError as e:
        out[name] = [errno.errorcode.get(e.errno, str(e.errno)), str(e)[:200]]
for name, path in cfg["read"].items():
    attempt("read:" + name, lambda p=path: open(p, "rb").read(8).hex())
for name, path in cfg["list"].items():
    attempt("list:" + name, lambda p=path: len(os.listdir(p)))
for name, path in cfg["readlink"].items():
    attempt("readlink:" + name, lambda p=path: os.readlink(p))
for name, port in cfg["connect"].items():
    attempt("connect:" + name, lambda p=port: socket.create_connection(("127.0.0.1", p), 3).close())
attempt("socket:udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close())
attempt("socket:raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
attempt("socket:unix", lambda: socket.socket(socket.AF_UNIX).close())
attempt("socket:netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close())
def bind():
    s = socket.socket(); s.bind(("127.0.0.1", 0))
attempt("bind:tcp", bind)
def listen():
    s = socket.socket(); s.listen()
attempt("listen:tcp", listen)
attempt("signal:0", lambda: os.kill(cfg["server_pid"], 0))
attempt("signal:SIGTERM", lambda: os.kill(cfg["server_pid"], signal.SIGTERM))
attempt("write:own tmp", lambda: open(os.environ["TMPDIR"] + "/mine", "w").write("x"))
def post(key):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
    req = urllib.request.Request(cfg["capture"] + "/v1/chat/completions", body,
                                 {"content-type": "application/json", "authorization": "Bearer " + key})
    try:
        return urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code
out["capture:own key"] = post(cfg["key"])
out["capture:bogus key"] = post("sgk-" + "x" * 30)
for route in ("/health", "/mcp", "/capture/sessions", "/list_environments"):  # the port serves /capture only
    try:
        out["capture port:" + route] = urllib.request.urlopen(cfg["capture"].removesuffix("/capture") + route).status
    except urllib.error.HTTPError as e:
        out["capture port:" + route] = e.code
print(json.dumps(out))
"""


TAG = f".{os.getpid()}"  # on every sleep this driver starts: another run on this machine starts the same ones


def pids(pattern: str, under: str | None = None) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = open(f"/proc/{name}/cmdline", "rb").read().split(b"\0")
            if argv[0] == b"sleep" and argv[1].decode().startswith(pattern) and argv[1].decode().endswith(TAG):
                if under is None or os.readlink(f"/proc/{name}/cwd").startswith(under):
                    found.append(int(name))
        except (OSError, IndexError):
            continue
    return found


def escape(mark: str) -> str:
    """sleep <mark>3, a setsid'd sh running sleep <mark>2 and, double-forked, sleep <mark>1 (each with our TAG)."""
    inner = f"(sleep {mark}1{TAG} &) ; sleep {mark}2{TAG}"
    return f"setsid sh -c '{inner}' </dev/null >/dev/null 2>&1 & sleep {mark}3{TAG}"


async def until(check, limit_s: float) -> None:
    """Wait up to `limit_s` for `check()` (processes start and die asynchronously); the caller records what holds."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not check():
        await asyncio.sleep(0.05)


async def main() -> dict:
    tmp = tempfile.mkdtemp(prefix="landlock-probe-")
    data = os.path.join(tmp, "data")
    env = {"SWE_GYM_DATA_DIR": data, "SWE_GYM_ADMIN_KEY": ADMIN, "SWE_GYM_UI": "0"}
    me = [sys.executable, "-m", "swe_gym_env.cli"]
    ep, sp = procs.free_port(), procs.free_port()
    engine = procs.start([*me, "engine", "--port", str(ep), "--policy", "oracle"], f"http://127.0.0.1:{ep}/health",
                         env=env, timeout=180)
    server = procs.start([*me, "serve", "--port", str(sp), "--engine-url", f"http://127.0.0.1:{ep}/v1"],
                         f"http://127.0.0.1:{sp}/health", env=env, timeout=180)
    out = {}
    try:
        (sock,) = glob.glob(f"{tempfile.gettempdir()}/swe-gym-capture-{server.pid}-*/capture.sock")
        r = httpx.post(f"http://127.0.0.1:{sp}/capture/sessions", headers={"authorization": f"Bearer {ADMIN}"},
                       json={"engine_url": f"http://127.0.0.1:{ep}/v1", "served_model": "smollm2-135m-instruct"})
        key = r.json()["key"]
        t = bundled_tasks()[0]
        spec = lambda **kw: SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit, **kw)
        b = await create_sandbox("landlock", spec())
        a = await create_sandbox("landlock", spec(capture_socket=sock))
        try:
            await b.write_file("/testbed/other-secret.txt", b"B-SECRET")
            sleeper = await b.start(f"sleep 3000{TAG}")
            for _ in range(100):
                if (bp := pids("3000", b.workdir)):
                    break
                await asyncio.sleep(0.05)
            cfg = {
                "read": {"capture store": os.path.join(data, "capture.sqlite"),
                         "other sandbox file": os.path.join(b.workdir, "other-secret.txt"),
                         "server environ": f"/proc/{server.pid}/environ",
                         "other sandbox environ": f"/proc/{bp[0]}/environ"},
                "list": {"data dir": data, "results dir": os.path.join(data, "results"),
                         "other sandbox tree": b.workdir, "capture socket dir": os.path.dirname(sock)},
                "readlink": {"server cwd": f"/proc/{server.pid}/cwd", "other sandbox cwd": f"/proc/{bp[0]}/cwd"},
                "connect": {"server main port": sp, "engine port": ep, "capture port": a.capture_port},
                "server_pid": server.pid, "capture": a.capture_base_url, "key": key,
            }
            out["exist"] = {k: os.path.exists(v) for k, v in {**cfg["read"], **cfg["list"]}.items()}
            await a.write_file("/tmp/probe.py", PROBE.encode())
            await a.write_file("/tmp/probe.json", json.dumps(cfg).encode())  # data: host paths stay as they are
            res = await a.exec(["python3", "/tmp/probe.py", "/tmp/probe.json"], timeout=120, relay=True)
            out["probes"] = json.loads(res.stdout.strip().splitlines()[-1]) if res.ok else {"error": res.stderr}
            dial = f"import socket; socket.create_connection(('127.0.0.1', {a.capture_port}), 3)"
            no_relay = await a.exec(["python3", "-c", dial], timeout=60)
            out["capture without relay"] = no_relay.stderr.strip().splitlines()[-1:]
            out["server alive"] = server.poll() is None
            await sleeper.kill()
        finally:
            await a.close()
            await b.close()
        # a setsid + double-forked child dies at the sandbox's deadline, and on close
        c = await create_sandbox("landlock", spec(deadline_s=6))
        await c.start(escape("314"))
        await until(lambda: len(pids("314")) == 3, c.expires_at - time.time() - 0.5)  # all 3 run, before the deadline
        out["before deadline"] = len(pids("314"))
        await asyncio.sleep(max(0.0, c.expires_at - time.time()))
        await until(lambda: not pids("314"), 5)  # a loaded machine: the kill at the deadline may land a little late
        out["after deadline"] = len(pids("314"))
        await c.close()
        d = await create_sandbox("landlock", spec())
        await d.start(escape("315"))
        await until(lambda: len(pids("315")) == 3, 20)
        out["before close"] = len(pids("315"))
        await d.close()
        await until(lambda: not pids("315"), 5)
        out["after close"] = len(pids("315"))
        out["uid"] = os.getuid()
    finally:
        procs.stop(server)
        procs.stop(engine)
        shutil.rmtree(tmp, ignore_errors=True)
    return out

print("RESULT " + json.dumps(asyncio.run(main())), flush=True)
'''


def check(out: dict) -> None:
    """What the driver found, denial by denial."""
    p = out["probes"]
    assert "error" not in p, p
    assert all(out["exist"].values()), out["exist"]  # so each EACCES below is a denial, not a missing file
    for name in ("capture store", "other sandbox file", "server environ", "other sandbox environ"):
        assert p[f"read:{name}"][0] == "EACCES", (name, p[f"read:{name}"])
    for name in ("data dir", "results dir", "other sandbox tree", "capture socket dir"):
        assert p[f"list:{name}"][0] == "EACCES", (name, p[f"list:{name}"])
    for name in ("server cwd", "other sandbox cwd"):
        assert p[f"readlink:{name}"][0] == "EACCES", (name, p[f"readlink:{name}"])
    assert p["connect:server main port"][0] == "EACCES" and p["connect:engine port"][0] == "EACCES", p
    assert p["connect:capture port"][0] == "ok", p
    for kind in ("udp", "raw", "unix", "netlink"):
        assert p[f"socket:{kind}"][0] == "EACCES", (kind, p[f"socket:{kind}"])
    assert p["bind:tcp"][0] == "EACCES" and p["listen:tcp"][0] == "EACCES", p
    assert p["signal:0"][0] == "EPERM" and p["signal:SIGTERM"][0] == "EPERM", p
    assert out["server alive"]
    assert p["write:own tmp"][0] == "ok", p
    assert p["capture:own key"] == 200 and p["capture:bogus key"] == 401, p
    assert [p[f"capture port:{r}"] for r in ("/health", "/mcp", "/capture/sessions", "/list_environments")] == [404] * 4
    assert "Permission denied" in " ".join(out["capture without relay"]), out  # no port without relay=True
    assert out["before deadline"] == 3 and out["after deadline"] == 0, out
    assert out["before close"] == 3 and out["after close"] == 0, out


def run_driver(argv: list[str], stdin: str | None = None, timeout: float = 420) -> dict:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.fixture(scope="module")
def need_landlock() -> None:
    ok, why = preflight()
    require(ok, f"landlock backend unavailable here: {why}")


# -- the launcher itself ---------------------------------------------------------------------------------------------
def test_the_kernel_abi_and_level_are_reported():
    report = probe()
    abi = confine.landlock_abi()
    assert report["abi"] == abi and report["level"] == confine.level(abi)
    ok, detail = preflight()
    if ok:
        assert f"landlock ABI {abi}: {confine.level(abi)}" in detail
        assert report["self_test"] == {  # the launcher's confined self-test: the denials hold here
            "connect allowed port": "ok",
            "connect other port": "EACCES",
            "udp socket": "EACCES",
            "read outside": "EACCES",
            "signal launcher": "EPERM",
            "write inside": "ok",
        }
    assert confine.level(7) == "fs+net+scopes" and confine.level(4) == "fs+net" and confine.level(3) == "fs"
    assert confine.level(0) == "none" and confine.missing(6) == [] and len(confine.missing(3)) == 2


def test_the_filter_assembles_for_each_architecture():
    for arch in confine.SYSCALLS.values():
        for notify in (False, True):
            code = confine.build_filter(arch, notify)
            assert len(code) % 8 == 0 and 20 < len(code) // 8 < 255


def test_a_partial_abi_is_refused_unless_the_operator_opts_in(monkeypatch, tmp_path):
    from swe_gym_env.server.sandbox import landlock

    weak = {"abi": 4, "level": "fs+net", "missing": confine.missing(4), "ok": True, "self_test": {}}
    monkeypatch.setattr(landlock, "probe", lambda: weak)
    (tmp_path / ".ready").write_text("ok\n")
    monkeypatch.setattr(landlock, "task_runtime_dir", lambda: tmp_path)
    monkeypatch.delenv(landlock.PARTIAL_ENV, raising=False)
    ok, why = landlock.preflight()
    assert not ok and "landlock ABI 4 gives only 'fs+net'" in why and "could signal the server" in why
    assert landlock.PARTIAL_ENV in why
    monkeypatch.setenv(landlock.PARTIAL_ENV, "1")
    ok, detail = landlock.preflight()
    assert ok and "PARTIAL" in detail and "fs+net" in detail


# -- the probes, on this host ----------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("need_landlock", "need_tokenizer")
@pytest.mark.parametrize("secret", ["results", "capture.sqlite", "grading"])
def test_a_grant_over_the_servers_stores_is_refused(secret, tmp_path, monkeypatch):
    """A read-only mount over the results, the capture store or the grading store (each task's canaries: the mutants
    a 1.0 must fail) is refused by name before any process starts."""
    from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec
    from swe_gym_env.server.sandbox.landlock import LandlockSandbox

    data = tmp_path / "data"
    (data / secret).mkdir(parents=True)
    monkeypatch.setenv("SWE_GYM_DATA_DIR", str(data))
    with pytest.raises(SandboxError, match=f"refusing to grant {data / secret}.*{secret}"):
        LandlockSandbox(SandboxSpec(ro_mounts={str(data / secret): "/opt/x"}), tmp_path / "root", None)


def test_probes_from_inside_a_landlock_sandbox_on_this_host():
    check(run_driver([sys.executable, "-c", DRIVER]))


@pytest.mark.anyio
@pytest.mark.integration
@pytest.mark.usefixtures("need_landlock")
async def test_paths_of_the_usual_layout_map_onto_the_sandbox_dirs():
    from swe_gym_env.server.sandbox.base import SandboxSpec
    from swe_gym_env.server.sandbox.registry import create_sandbox
    from swe_gym_env.tasks.catalog import bundled_tasks

    t = bundled_tasks()[0]
    async with await create_sandbox("landlock", SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit)) as s:
        r = await s.exec("pwd; cd /testbed && pwd; echo $HOME $TMPDIR", timeout=30)
        assert r.stdout.split() == [s.workdir, s.workdir, s.home, s.tmpdir], r
        await s.write_file("/tmp/run.sh", b"cd /testbed && git rev-parse HEAD > /tmp/out\n", 0o700)  # a script: mapped
        await s.write_file("/tmp/data.patch", b"+/tmp/x /testbed\n")  # data: never rewritten
        assert (await s.exec("bash /tmp/run.sh", timeout=30)).ok
        assert (await s.read_file("/tmp/out")).decode().strip() == t.base_commit
        assert await s.read_file(f"{s.tmpdir}/data.patch") == b"+/tmp/x /testbed\n"  # real paths work too
        assert s.to_host(f"{s.workdir}/a /tmp/b /tmpx /usr/tmp") == f"{s.workdir}/a {s.tmpdir}/b /tmpx /usr/tmp"
        r = await s.exec("python -m pytest -q -p no:cacheprovider 2>&1 | tail -1", timeout=60)
        assert "3 passed" in r.stdout, r


KILLED_SERVER = """
import asyncio
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
from swe_gym_env.tasks.catalog import bundled_tasks
async def main():
    t = bundled_tasks()[0]
    sbx = await create_sandbox("landlock", SandboxSpec(repo_source=t.repo_source, base_commit=t.base_commit))
    await sbx.start("setsid sh -c '(sleep 3161TAG &) ; sleep 3162TAG' </dev/null >/dev/null 2>&1 & sleep 3163TAG")
    print(sbx.root, flush=True)
    await asyncio.sleep(300)
asyncio.run(main())
"""


TAG = f".{os.getpid()}"  # on the sleeps this process's killed server starts: another run starts the same ones


def sleeping(prefix: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"sleep" and argv[1].startswith(prefix.encode()) and argv[1].endswith(TAG.encode()):
            found.append(pid)
    return found


@pytest.mark.integration
@pytest.mark.usefixtures("need_landlock")
def test_a_server_killed_with_sigkill_leaves_no_process_and_the_next_one_reaps_its_dir():
    from swe_gym_env.server.sandbox.registry import reap_orphans

    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_SERVER.replace("TAG", TAG)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    root = proc.stdout.readline().strip()
    deadline = time.monotonic() + 10
    while len(sleeping("316")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sleeping("316")) == 3 and os.path.isdir(root)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while sleeping("316") and time.monotonic() < deadline:  # the launcher's parent-death signal: it kills them all
        time.sleep(0.05)
    assert sleeping("316") == []
    assert root in reap_orphans() and not os.path.isdir(root)


# -- the Space image: probes as uid 1000 under docker's default seccomp, then validate and rollouts ------------------
def _docker(*argv: str, timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *argv], input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def space_container(space_image):
    """The Space image running idle with no network (loopback only), its default user and seccomp profile."""
    name = f"swe-gym-landlock-test-{os.getpid()}"
    run = _docker("run", "-d", "--rm", "--name", name, "--network", "none", space_image, "sleep", "1800")
    assert run.returncode == 0, run.stderr
    try:
        yield name
    finally:
        _docker("rm", "-f", name, timeout=60)


@pytest.mark.integration
@pytest.mark.slow
def test_inside_the_space_image_landlock_is_the_backend_that_works(space_container):
    uid = _docker("exec", space_container, "id", "-u")
    assert uid.stdout.strip() == "1000"
    seccomp = _docker("exec", space_container, "grep", "^Seccomp:", "/proc/self/status")
    assert seccomp.stdout.split() == ["Seccomp:", "2"]  # docker's default profile is on
    info = _docker("exec", space_container, "swe-gym-env", "info", timeout=180)
    sandboxes = json.loads(info.stdout)["sandboxes"]
    assert sandboxes["landlock"]["usable"], sandboxes["landlock"]
    assert "landlock ABI" in sandboxes["landlock"]["reason"]
    assert not sandboxes["local"]["usable"] and "bwrap cannot create" in sandboxes["local"]["reason"]


@pytest.mark.integration
@pytest.mark.slow
def test_probes_from_inside_a_landlock_sandbox_in_the_space_image(space_container):
    out = run_driver(["docker", "exec", "-i", space_container, "python", "-"], stdin=DRIVER)
    assert out["uid"] == 1000
    check(out)


@pytest.mark.integration
@pytest.mark.slow
def test_validate_and_rollouts_with_landlock_in_the_space_image(space_container):
    t0 = time.monotonic()
    v = _docker("exec", space_container, "swe-gym-env", "validate", "--sandbox", "landlock", timeout=600)
    assert v.returncode == 0 and " 0 surprises" in v.stdout, v.stdout[-3000:] + v.stderr[-2000:]
    engine = "nohup swe-gym-env engine --port 18777 --policy oracle --max-model-len 16384 >/tmp/engine.log 2>&1 &"
    wait = "for i in $(seq 120); do curl -fsS http://127.0.0.1:18777/health >/dev/null && break; sleep 1; done"
    assert _docker("exec", space_container, "sh", "-c", f"{engine} {wait}", timeout=180).returncode == 0
    for harness in ("pi", "opencode"):
        r = _docker(
            "exec", space_container, "swe-gym-env", "rollout", "--sandbox", "landlock", "--harness", harness,
            "--engine-url", "http://127.0.0.1:18777/v1", "--index", "0", "--deadline", "300", timeout=420,
        )  # fmt: skip
        result = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
        assert r.returncode == 0 and result.get("ok"), (harness, r.stdout[-2000:], r.stderr[-2000:])
        assert result["sandbox"] == "landlock" and len(result["turns"]) >= 1
        assert result["reward"] == 1.0 and result["cross_check"] == "match", result.get("grading")
    assert time.monotonic() - t0 < 400


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_demo_with_landlock_on_this_host(harness, need_pi, need_opencode):
    """The README's demo with `--sandbox landlock`: the agent is told where its work tree really is (no mount
    namespace), and the oracle, like an agent, works there."""
    r = subprocess.run(
        [sys.executable, "-m", "swe_gym_env.cli", "demo", "--sandbox", "landlock", "--harness", harness, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert result["ok"] and result["reward"] == 1.0 and result["cross_check"] == "match", result.get("error")
    assert result["sandbox"] == "landlock"
