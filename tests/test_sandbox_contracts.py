"""The hf and e2b backends at their boundary: recording fakes built from the installed SDKs' real signatures.

Every call the backend makes is bound with `inspect.signature` of the real method (`**opts: Unpack[TypedDict]`
keys are checked against the TypedDict), and any attribute the real class lacks raises: a call or argument the real
API does not have fails the test. The recorded calls pin what the backend sends.

The host backends (`local`, `landlock`) run for real against the same protocol contract at the end."""

import asyncio
import inspect
import os
import re
import tarfile
import typing
from pathlib import Path

import e2b
import huggingface_hub
import pytest
from e2b.sandbox_async.commands.command import Commands
from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle
from e2b.sandbox_async.filesystem.filesystem import Filesystem
from huggingface_hub._sandbox import SandboxCommandResult, SandboxFiles, SandboxProcess

from swe_gym_env.server.agents.bundle import _seal
from swe_gym_env.server.sandbox import hf_pool, remote
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox

pytestmark = pytest.mark.anyio
REAL_HF = huggingface_hub.Sandbox  # before any monkeypatch
REAL_POOL = huggingface_hub.SandboxPool
REAL_API = huggingface_hub.HfApi
REAL_E2B = e2b.AsyncSandbox
calls: list[tuple[str, dict]] = []
scripts: dict[str, str] = {}  # detached process id -> the command it ran (to script its output)
GLIBC = {"version": "glibc 2.35"}  # what the fake image's glibc probe prints


def note_script(cmd: str) -> None:
    if m := re.search(r"/tmp/\.swe-gym/([0-9a-f]{12})\.out", cmd):
        scripts[m.group(1)] = cmd


def scripted_out(path: str, default: bytes) -> bytes:
    """A command's stdout as the fake image would print it: the glibc probe and tool list, else `default`."""
    cmd = scripts.get(path.rsplit("/", 1)[-1].split(".")[0], "")
    if "GNU_LIBC_VERSION" in cmd:
        return f"{GLIBC['version']}\nsha256sum\ntar\ngzip\n".encode()
    if "probe-exit" in cmd:
        return b"probe-exit=0\nv22.23.5\n"
    return default


def checked(real_cls: type, name: str):
    """Bind a call against the real method's signature (self included), record it, or raise TypeError."""
    real = inspect.getattr_static(real_cls, name)
    fn = real.__func__ if isinstance(real, (classmethod, staticmethod)) else real
    fn = getattr(fn, "method", fn)  # e2b's class_method_variant: the instance method it wraps
    sig = inspect.signature(getattr(fn, "__wrapped__", fn))

    def record(*args, **kwargs):
        if "self" in sig.parameters or "cls" in sig.parameters:
            args = (None, *args)
        bound = sig.bind(*args, **kwargs)
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD and p.name in bound.arguments:
                hint = typing.get_type_hints(fn, include_extras=True).get(p.name)
                if typing.get_origin(hint) is not typing.Unpack:
                    continue
                allowed = set(typing.get_type_hints(typing.get_args(hint)[0]))
                extra = set(bound.arguments[p.name]) - allowed
                assert not extra, f"{real_cls.__name__}.{name}: no such options {extra}"
        args_out = {k: v for k, v in bound.arguments.items() if k not in ("self", "cls")}
        calls.append((f"{real_cls.__name__}.{name}", args_out))
        return args_out

    return record


class Strict:
    real: type

    def __getattr__(self, name):
        if not hasattr(self.real, name):
            raise AttributeError(f"the real {self.real.__name__} has no {name!r}")
        raise AssertionError(f"fake {self.real.__name__}.{name} not scripted")


# -- HF ------------------------------------------------------------------------------------------------------------
class FakeHFFiles(Strict):
    real = SandboxFiles

    def __init__(self):
        self.store: dict[str, bytes] = {}

    def write(self, *a, **kw):
        args = checked(SandboxFiles, "write")(*a, **kw)
        self.store[args["path"]] = args["data"]

    def read(self, *a, **kw):
        args = checked(SandboxFiles, "read")(*a, **kw)
        path = args["path"]
        if path.endswith(".rc"):
            return b"0\n"
        if path.endswith(".out"):
            return scripted_out(path, b"hello\n")
        return self.store.get(path, b"")

    def upload(self, *a, **kw):
        args = checked(SandboxFiles, "upload")(*a, **kw)
        self.store[args["path"]] = Path(args["local_path"]).read_bytes()


class FakeHFProcess(Strict):
    real = SandboxProcess

    def __init__(self, pid_id: str):
        self.id, self.running, self.exit_code = pid_id, True, None

    def kill(self, *a, **kw):
        checked(SandboxProcess, "kill")(*a, **kw)
        return True


class FakeHFSandbox(Strict):
    real = REAL_HF
    polls = 0

    def __init__(self):
        self.id = "0123456789abcdef01234567"  # the real one sets it in __init__
        self.files = FakeHFFiles()
        self.procs: list[FakeHFProcess] = []

    @classmethod
    def create(cls, *a, **kw):
        checked(REAL_HF, "create")(*a, **kw)
        return cls()

    def run(self, *a, **kw):
        args = checked(REAL_HF, "run")(*a, **kw)
        note_script(args["cmd"])
        if args.get("background"):
            self.procs.append(FakeHFProcess(f"p{len(self.procs)}"))
            return self.procs[-1]
        return SandboxCommandResult(exit_code=0, stdout=self.foreground(args["cmd"]), stderr="")

    def foreground(self, cmd: str) -> str:
        return ""

    def processes(self, *a, **kw):
        checked(REAL_HF, "processes")(*a, **kw)
        for p in self.procs:  # each process is seen running once, then finished
            if p.running:
                p.running = False
                p.running, p.exit_code = (True, None) if not getattr(p, "seen", False) else (False, 0)
                p.seen = True
        return list(self.procs)

    def kill(self, *a, **kw):
        checked(REAL_HF, "_kill")(*a, **kw)


async def test_hf_backend_calls_exactly_the_real_sdk(monkeypatch):
    calls.clear()
    monkeypatch.setattr(huggingface_hub, "Sandbox", FakeHFSandbox)
    monkeypatch.setattr(remote, "POLL_S", 0.01)
    monkeypatch.setenv("SWE_GYM_PUBLIC_URL", "https://space.example")
    spec = SandboxSpec(
        image="xingyaoww/sweb.eval.x86_64.a_s_b-1", base_commit="abc1234", env={"A": "1"},
        secrets={"KEY": "sek"}, labels={"rollout": "r1"}, deadline_s=900,
    )  # fmt: skip
    sbx = await create_sandbox("hf", spec)
    assert sbx.capture_base_url == "https://space.example/capture"
    r = await sbx.exec("echo hello", timeout=30, relay=True)
    assert r.ok and r.stdout == "hello\n"
    await sbx.close()
    await sbx.close()
    names = [n for n, _ in calls]
    create = calls[0][1]
    assert names[0] == "Sandbox.create" and create["image"] == spec.image and create["idle_timeout"] == 900
    assert create["env"] == {"A": "1"} and "KEY" not in str(create)  # the secret goes through a file
    assert create["labels"]["swe-gym-rollout"] == "r1" and create["labels"]["swe-gym-server"]
    runs = [a for n, a in calls if n == "Sandbox.run"]
    assert all(a.get("background") is True for a in runs if "setsid" in a["cmd"])  # every command detached
    assert "sek" not in str(runs)
    writes = [a for n, a in calls if n == "SandboxFiles.write"]
    assert any(a["path"] == "/tmp/.swe-gym/secrets.env" and a["mode"] == "0600" for a in writes)
    assert "Sandbox.processes" in names and names[-1] == "Sandbox._kill"
    assert names.count("Sandbox._kill") == 1


def test_hf_fake_rejects_what_the_real_api_lacks():
    with pytest.raises(TypeError):
        FakeHFSandbox.create("img", idle_timeout=5, no_such_argument=1)
    with pytest.raises(AttributeError):
        FakeHFSandbox().get_host(8080)  # HF has proxy_url_for, not get_host


# -- HF pool -------------------------------------------------------------------------------------------------------
POOL_HOME = "/.sbx/ab12cd34"  # where the fake pool sandbox's home is (the file API's root)
HOST_JOB = "6a44fadf33c08a2c0dadf7b2"


class FakePoolSandbox(FakeHFSandbox):
    def __init__(self):
        super().__init__()
        self.host_id = HOST_JOB  # the real one is a property over its host
        self.id = f"{HOST_JOB}.ab12cd34"

    def foreground(self, cmd: str) -> str:
        if "pwd -P" in cmd:  # the home lookup prints the home
            return POOL_HOME + "\n"
        return "/testbed\n" if "cp -a" in cmd else ""  # the copy prints the env's editable entries in the tree


class FakePool(Strict):
    real = REAL_POOL
    made: list["FakePool"] = []

    def __init__(self, *a, **kw):
        self.args = checked(REAL_POOL, "__init__")(*a, **kw)
        self.closed = False
        FakePool.made.append(self)

    def create(self, *a, **kw):
        checked(REAL_POOL, "create")(*a, **kw)
        return FakePoolSandbox()

    def close(self, *a, **kw):
        checked(REAL_POOL, "close")(*a, **kw)
        self.closed = True


@pytest.fixture
def fake_pool(monkeypatch):
    calls.clear()
    FakePool.made.clear()
    monkeypatch.setattr(huggingface_hub, "SandboxPool", FakePool)
    monkeypatch.setattr(hf_pool, "_pools", {})
    monkeypatch.setattr(remote, "POLL_S", 0.01)
    monkeypatch.setenv("SWE_GYM_PUBLIC_URL", "https://space.example")
    monkeypatch.setenv("HF_TOKEN", "hf_dummy")  # preflight wants one; nothing is sent
    for name in ("SANDBOXES_PER_HOST", "WARM_UP", "MAX_HOSTS", "IDLE_TIMEOUT_S"):
        monkeypatch.delenv(f"SWE_GYM_HF_POOL_{name}", raising=False)
    return FakePool


async def test_hf_pool_backend_calls_exactly_the_real_sdk(fake_pool, monkeypatch):
    spec = SandboxSpec(
        image="xingyaoww/sweb.eval.x86_64.a_s_b-1", base_commit="abc1234", env={"A": "/testbed/x"},
        secrets={"KEY": "sek"}, labels={"rollout": "r1"}, deadline_s=900,
    )  # fmt: skip
    sbx = await create_sandbox("hf-pool", spec)
    other = await create_sandbox("hf-pool", spec)  # same image: same pool
    assert sbx.agent_workdir == f"{POOL_HOME}/testbed"  # its own copy, what the agent's prompt names
    r = await sbx.exec("cat /tmp/x > /testbed/y", timeout=30)
    assert r.ok and r.stdout == "hello\n"
    await sbx.write_file("/tmp/grading/eval.sh", b"cd /testbed && pytest\n", 0o700)
    await sbx.write_file("/tmp/grading/model.patch", b"--- a/testbed/f\n")
    assert (await sbx.read_file("/home/agent/out.txt")) == b""
    with pytest.raises(SandboxError, match="outside the pool sandbox's home"):
        await sbx.read_file("/etc/passwd")
    await sbx.close()
    await other.close()
    assert len(FakePool.made) == 1
    made = FakePool.made[0].args
    assert made["image"] == spec.image and made["sandboxes_per_host"] == 8 and made["warm_up"] == 1
    assert made["max_hosts"] is None and made["idle_timeout"] == 600
    name = made["name"]
    assert re.fullmatch(r"swegym-[A-Za-z0-9]{1,16}-[0-9a-f]{6}-\d+-[a-z0-9-]+-[0-9a-f]{8}", name) and len(name) <= 64
    assert f"-{os.getpid()}-" in name
    creates = [a for n, a in calls if n == "SandboxPool.create"]
    assert len(creates) == 2 and all(a == {"idle_timeout": 900} for a in creates)  # no env, no secret in the call
    writes = {a["path"]: a for n, a in calls if n == "SandboxFiles.write"}
    assert next(iter(writes)) == "/.swe-gym-home"  # the home is found first, through the file API's root
    assert writes["/tmp/.swe-gym/secrets.env"]["mode"] == "0600"  # paths relative to the home
    assert writes["/tmp/grading/eval.sh"]["data"] == f"cd {POOL_HOME}/testbed && pytest\n".encode()  # a script: mapped
    assert writes["/tmp/grading/model.patch"]["data"] == b"--- a/testbed/f\n"  # content: never mapped
    runs = [a["cmd"] for n, a in calls if n == "Sandbox.run"]
    copy = next(c for c in runs if "cp -a" in c)
    assert f"cp -a /testbed/. {POOL_HOME}/testbed/" in copy
    user = next(c for c in runs if "/testbed/y" in c)
    assert f"cat {POOL_HOME}/tmp/x > {POOL_HOME}/testbed/y" in user and f"cd {POOL_HOME}/testbed" in user
    assert f"HOME={POOL_HOME}/home/agent" in user and f"A={POOL_HOME}/testbed/x" in user
    assert f"PYTHONPATH={POOL_HOME}/testbed\n" in user  # the image's editable install, pointed at the copy
    assert f"{POOL_HOME}/tmp/.swe-gym/" in user and " /tmp/" not in user  # the detached protocol's files too
    assert "sek" not in str(runs)
    assert [n for n, _ in calls].count("Sandbox._kill") == 2
    assert hf_pool.close_pools() == [spec.image] and FakePool.made[0].closed
    assert hf_pool.close_pools() == []


@pytest.mark.parametrize(
    ("env", "err"),
    [
        ({"SANDBOXES_PER_HOST": "0"}, "SWE_GYM_HF_POOL_SANDBOXES_PER_HOST=0 is below 1"),
        ({"WARM_UP": "two"}, "SWE_GYM_HF_POOL_WARM_UP='two' is not a whole number (>= 0)"),
        ({"MAX_HOSTS": "2", "WARM_UP": "3"}, "SWE_GYM_HF_POOL_WARM_UP=3 is over SWE_GYM_HF_POOL_MAX_HOSTS=2"),
        ({"IDLE_TIMEOUT_S": "5"}, "SWE_GYM_HF_POOL_IDLE_TIMEOUT_S=5 is below 60"),
    ],
)
async def test_hf_pool_settings_are_checked(fake_pool, monkeypatch, env, err):
    for k, v in env.items():
        monkeypatch.setenv(f"SWE_GYM_HF_POOL_{k}", v)
    assert hf_pool.preflight() == (False, err)
    with pytest.raises(SandboxError, match=re.escape(err)):
        await create_sandbox("hf-pool", SandboxSpec(image="img/x:1"))
    assert not FakePool.made


async def test_hf_pool_settings_reach_the_pool(fake_pool, monkeypatch):
    for k, v in {"SANDBOXES_PER_HOST": "2", "WARM_UP": "3", "MAX_HOSTS": "4", "IDLE_TIMEOUT_S": "120"}.items():
        monkeypatch.setenv(f"SWE_GYM_HF_POOL_{k}", v)
    sbx = await create_sandbox("hf-pool", SandboxSpec(image="img/x:1"))
    await sbx.close()
    args = FakePool.made[0].args
    assert (args["sandboxes_per_host"], args["warm_up"], args["max_hosts"], args["idle_timeout"]) == (2, 3, 4, 120)


async def test_hf_pool_waits_for_a_slot_being_freed_rather_than_booting_a_host(monkeypatch):
    """The pipeline grades in a new sandbox while the agent's is still being removed: with every host full and
    removals in flight, one freed slot lets exactly one create through (no thundering herd onto a new host)."""
    from types import SimpleNamespace

    pool = SimpleNamespace(num_sandboxes=4, num_hosts=2, sandboxes_per_host=2)
    monkeypatch.setattr(hf_pool, "_closing", {"img": 2})
    monkeypatch.setattr(hf_pool, "_admitted", {})
    through: list[int] = []

    async def create(i: int) -> None:
        async with hf_pool._slot("img", pool):
            through.append(i)
            await asyncio.sleep(0.3)  # the pool placing it

    waiters = [asyncio.ensure_future(create(i)) for i in range(2)]
    await asyncio.sleep(0.2)
    assert through == []  # full, removals in flight: both wait
    pool.num_sandboxes = 3  # one removal done
    await asyncio.sleep(0.15)
    assert len(through) == 1  # one slot, one create
    hf_pool._closing["img"] = 0  # nothing more being removed: the other goes on (the pool may boot a host)
    await asyncio.gather(*waiters)
    assert sorted(through) == [0, 1] and hf_pool._admitted["img"] == 0


class FakeApi(Strict):
    real = REAL_API
    jobs: list = []

    def __init__(self, *a, **kw):
        checked(REAL_API, "__init__")(*a, **kw)

    def list_jobs(self, *a, **kw):
        checked(REAL_API, "list_jobs")(*a, **kw)
        return list(FakeApi.jobs)

    def cancel_job(self, *a, **kw):
        checked(REAL_API, "cancel_job")(*a, **kw)


def test_hf_pool_reaps_the_hosts_of_dead_servers_by_pool_name(monkeypatch):
    from types import SimpleNamespace

    calls.clear()
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setenv("HF_TOKEN", "hf_dummy")
    ours = hf_pool.pool_name("img/x:1")
    dead = ours.replace(f"-{os.getpid()}-", "-4199999-")  # over pid_max: no such process
    other = "swegym-someoneelse0000-abcdef-4199999-x-00000000"
    # a restarted container: the server before it had this very pid (1 in a container), another incarnation
    before_restart = ours.replace(f"-{hf_pool.INCARNATION[:6]}-", "-000000-")
    FakeApi.jobs = [
        SimpleNamespace(id=f"job{i}", labels={"hf-sandbox-mode": "pool", "hf-sandbox-pool": n})
        for i, n in enumerate([ours, dead, other, before_restart])
    ]
    assert hf_pool.reap_orphans() == ["hf-pool:job1", "hf-pool:job3"]
    assert [a for n, a in calls if n == "HfApi.cancel_job"] == [{"job_id": "job1"}, {"job_id": "job3"}]
    listed = next(a for n, a in calls if n == "HfApi.list_jobs")
    assert listed["labels"] == {"hf-sandbox-mode": "pool"} and "RUNNING" in listed["status"]


# -- E2B -----------------------------------------------------------------------------------------------------------
class FakeHandle(Strict):
    real = AsyncCommandHandle
    exit_code = 0

    async def kill(self, *a, **kw):
        checked(AsyncCommandHandle, "kill")(*a, **kw)
        return True


class FakeCommands(Strict):
    real = Commands

    async def run(self, *a, **kw):
        args = checked(Commands, "run")(*a, **kw)
        note_script(args["cmd"])
        return FakeHandle()


class FakeFiles(Strict):
    real = Filesystem

    def __init__(self):
        self.store = {}

    async def write(self, *a, **kw):
        args = checked(Filesystem, "write")(*a, **kw)
        self.store[args["path"]] = args["data"]

    async def read(self, *a, **kw):
        args = checked(Filesystem, "read")(*a, **kw)
        path = args["path"]
        return b"0\n" if path.endswith(".rc") else scripted_out(path, b"out\n") if path.endswith(".out") else b""


class FakeE2B(Strict):
    real = REAL_E2B

    def __init__(self):
        self.commands, self.files = FakeCommands(), FakeFiles()

    @classmethod
    async def create(cls, *a, **kw):
        checked(REAL_E2B, "create")(*a, **kw)
        return cls()

    def get_host(self, *a, **kw):
        checked(REAL_E2B, "get_host")(*a, **kw)
        return "8080-sbx.e2b.dev"

    async def kill(self, *a, **kw):
        checked(REAL_E2B, "kill")(*a, **kw)
        return True


async def test_e2b_backend_calls_exactly_the_real_sdk(monkeypatch):
    calls.clear()
    monkeypatch.setattr(e2b, "AsyncSandbox", FakeE2B)
    monkeypatch.setattr(remote, "POLL_S", 0.01)
    monkeypatch.setenv("SWE_GYM_E2B_TEMPLATES", '{"img/x:1": "tmpl-x"}')
    spec = SandboxSpec(image="img/x:1", base_commit="abc1234", env={"A": "1"}, labels={"rollout": "r2"}, deadline_s=700)
    sbx = await create_sandbox("e2b", spec)
    r = await sbx.exec(["echo", "out"], timeout=30)
    assert r.ok and r.stdout == "out\n"
    assert sbx.host(8080) == "8080-sbx.e2b.dev"
    await sbx.close()
    names = [n for n, _ in calls]
    create = calls[0][1]
    assert names[0] == "AsyncSandbox.create" and create["template"] == "tmpl-x" and create["timeout"] == 700
    assert create["metadata"]["swe-gym-rollout"] == "r2" and create["envs"] == {"A": "1"}
    runs = [a for n, a in calls if n == "Commands.run" and "setsid" in a["cmd"]]
    assert runs and all(a["background"] is True and a["timeout"] == 0 for a in runs)
    assert names[-1] == "AsyncSandbox.kill"


def test_e2b_fake_rejects_unknown_options():
    with pytest.raises(AssertionError, match="no such options"):
        checked(REAL_E2B, "kill")(nope=1)
    with pytest.raises(TypeError):
        checked(Commands, "run")("ls", no_such=True)


# -- agent bundles: uploaded, unpacked, digest checked inside, glibc checked first ------------------------------------
def tiny_bundle(root) -> tuple[str, dict]:
    stage = root / "stage"
    (stage / "node" / "bin").mkdir(parents=True)
    (stage / "node" / "bin" / "node").write_text("#!/bin/sh\necho v22\n")
    (stage / "node" / "bin" / "node").chmod(0o755)
    (stage / "pi").mkdir()
    (stage / "pi" / "cli.js").write_text("console.log(1)\n")
    meta = _seal(stage, {"name": "pi-0", "glibc": "2.28", "probe": "./node/bin/node --version", "verifier": None})
    final = root / f"pi-0-{meta['digest'][:16]}"
    stage.rename(final)
    return str(final), meta


def archive_facts(local: str, host: str) -> tuple[list[str], list[str], tuple[int, int], int]:
    with tarfile.open(local) as tar:
        names = sorted(tar.getnames())
        modes = (tar.getmember("node/bin/node").mode, tar.getmember("pi/cli.js").mode)
    tree = sorted(str(p.relative_to(host)) for p in Path(host).rglob("*"))
    return names, tree, modes, os.path.getsize(local)


async def bundle_rollout(backend: str, monkeypatch, tmp_path):
    calls.clear()
    monkeypatch.setattr(huggingface_hub, "Sandbox", FakeHFSandbox)
    monkeypatch.setattr(e2b, "AsyncSandbox", FakeE2B)
    monkeypatch.setattr(remote, "POLL_S", 0.01)
    monkeypatch.setenv("SWE_GYM_PUBLIC_URL", "https://space.example")
    host, meta = tiny_bundle(tmp_path)
    spec = SandboxSpec(image="img/x:1", ro_mounts={host: "/opt/swe-gym-agent"}, deadline_s=600)
    return await create_sandbox(backend, spec), host, meta


@pytest.mark.parametrize("backend", ["hf", "e2b"])
async def test_the_agent_bundle_is_uploaded_unpacked_and_its_digest_checked_inside(backend, monkeypatch, tmp_path):
    sbx, host, meta = await bundle_rollout(backend, monkeypatch, tmp_path)
    try:
        assert sbx.bundle_bytes > 0 and sbx.bundle_s > 0  # the cost boot reports
    finally:
        await sbx.close()
    digest = meta["digest"]
    remote_tar = f"/tmp/.swe-gym/bundle-{digest[:16]}.tar.gz"
    if backend == "hf":
        ups = [a for n, a in calls if n == "SandboxFiles.upload"]
        assert [a["path"] for a in ups] == [remote_tar] and ups[0]["mode"] == "0600"
        local = ups[0]["local_path"]
        cmds = [a["cmd"] for n, a in calls if n == "Sandbox.run"]
    else:
        ups = [a for n, a in calls if n == "Filesystem.write" and a["path"] == remote_tar]
        assert len(ups) == 1 and not isinstance(ups[0]["data"], bytes)  # streamed from the file
        local = ups[0]["data"].name
        cmds = [a["cmd"] for n, a in calls if n == "Commands.run"]
    names, tree, modes, size = archive_facts(local, host)
    assert names == tree and modes == (0o755, 0o644)  # the tarball holds exactly the tree, modes normalised
    assert sbx.bundle_bytes == size
    i_glibc = next(i for i, c in enumerate(cmds) if "GNU_LIBC_VERSION" in c)
    i_unpack = next(i for i, c in enumerate(cmds) if "tar -xzf" in c)
    assert i_glibc < i_unpack  # glibc first: nothing is uploaded to an image that cannot run it
    unpack = cmds[i_unpack]
    assert f"{digest}  SHA256SUMS" in unpack and "sha256sum -c --quiet --strict SHA256SUMS" in unpack
    assert "/opt/swe-gym-agent" in unpack and "chmod -R a-w" in unpack
    assert unpack.index("sha256sum -c") < unpack.index("./node/bin/node --version")  # the probe, after the check


@pytest.mark.parametrize("backend", ["hf", "e2b"])
async def test_an_old_glibc_is_a_boot_error_before_any_upload(backend, monkeypatch, tmp_path):
    monkeypatch.setitem(GLIBC, "version", "ldd (GNU libc) 2.17")
    with pytest.raises(SandboxError, match=r"glibc is 2\.17; the agent bundle needs glibc >= 2\.28"):
        await bundle_rollout(backend, monkeypatch, tmp_path)
    names = [n for n, _ in calls]
    assert "SandboxFiles.upload" not in names and not any("tar -xzf" in str(a) for _, a in calls)
    assert names[-1] in ("Sandbox._kill", "AsyncSandbox.kill")  # torn down, not leaked


# -- host backends, run for real: the protocol both keep (local: bubblewrap namespaces; landlock: no namespaces) ----
HOST_BACKENDS = ["local", "landlock"]


async def host_sandbox(backend: str, **kw):
    from conftest import require

    from swe_gym_env.server.sandbox.preflight import preflight
    from swe_gym_env.tasks.catalog import bundled_tasks

    pf = preflight(backend)
    require(pf["usable"], f"{backend} backend unavailable here: {pf['reason']}")
    t = bundled_tasks()[0]
    return await create_sandbox(backend, SandboxSpec(repo_source=t.repo_source or "", base_commit=t.base_commit, **kw))


def seen(sbx, path: str) -> str:
    """How a path of the usual layout shows inside: itself under `local`; its real dir under `landlock`."""
    from swe_gym_env.server.sandbox.landlock import LandlockSandbox

    return sbx.to_host(path) if isinstance(sbx, LandlockSandbox) else path


def sleeping(mark: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", mark.encode()]:
                    found.append(pid)
        except OSError:
            continue
    return found


def every_argv() -> list[bytes]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append(f.read())
        except OSError:
            continue
    return found


def own(mark: str) -> str:
    """A sleep's argument only this test process uses (`2711.<pid>`): another run of these tests on this machine
    starts the same `sleep 2711`, and /proc shows every process of the machine."""
    return f"{mark}.{os.getpid()}"


async def gone(mark: str) -> bool:
    for _ in range(50):
        if not sleeping(mark):
            return True
        await asyncio.sleep(0.05)
    return False


async def started(mark: str, n: int, limit: int = 400) -> None:
    """Wait (up to `limit` x 50 ms) until `n` sleeps of `mark` run: a fixed wait is too short on a loaded machine."""
    for _ in range(limit):
        if len(sleeping(mark)) >= n:
            return
        await asyncio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.parametrize("backend", HOST_BACKENDS)
async def test_host_backend_argv_cwd_env_stdin_and_output_limit(backend):
    async with await host_sandbox(backend) as sbx:
        r = await sbx.exec(["printf", "%s|", "a b", "$HOME", "'q'"], timeout=30, cwd="/tmp")
        assert r.stdout == "a b|$HOME|'q'|", r
        r = await sbx.exec("pwd; echo $FOO; cat", timeout=30, cwd="/home/agent", env={"FOO": "x y"}, stdin=b"in")
        assert r.stdout.split("\n") == [seen(sbx, "/home/agent"), "x y", "in"], r
        r = await sbx.exec("git rev-parse --show-toplevel", timeout=30)
        assert r.stdout.strip() == seen(sbx, "/testbed"), r
        big = await sbx.exec("head -c 600000 /dev/zero | tr '\\0' a", timeout=30)
        assert "output truncated by swe_gym_env" in big.stdout and len(big.stdout) < 300_000
        with pytest.raises(SandboxError):
            await sbx.exec("true", timeout=5, env={"BAD NAME": "x"})


@pytest.mark.integration
@pytest.mark.parametrize("backend", HOST_BACKENDS)
async def test_host_backend_kills_the_whole_tree_setsid_and_double_fork_included(backend):
    escape = "setsid sh -c '(sleep {m} &) ; sleep {m}' </dev/null >/dev/null 2>&1 & sleep {m} & wait"
    async with await host_sandbox(backend) as sbx:
        p = await sbx.start("sleep 0.3; echo finished; exit 3")
        assert await p.poll() is None
        r = await p.wait(20)
        assert r.exit_code == 3 and r.stdout == "finished\n" and await p.poll() == 3
        tree = await sbx.start(escape.format(m=own("2711")))
        await started(own("2711"), 3)
        assert len(sleeping(own("2711"))) == 3
        await tree.kill()
        assert await gone(own("2711"))
        r = await sbx.exec(escape.format(m=own("2712")), timeout=1.5)
        assert r.timed_out and r.exit_code == 124
        assert await gone(own("2712"))
        await sbx.start(escape.format(m=own("2713")))
        await started(own("2713"), 3)
        assert len(sleeping(own("2713"))) == 3
    assert await gone(own("2713"))  # close kills what is still running


@pytest.mark.integration
@pytest.mark.parametrize("backend", HOST_BACKENDS)
async def test_host_backend_files_cannot_escape_and_secrets_never_reach_argv(backend):
    async with await host_sandbox(backend, secrets={"CAPTURE_KEY": "s3cr3t-value"}) as sbx:
        await sbx.exec("ln -s /etc/hostname /testbed/link; ln -s / /tmp/rootlink", timeout=30)
        with pytest.raises(SandboxError):
            await sbx.read_file("/testbed/link")
        with pytest.raises(SandboxError):
            await sbx.read_file("/tmp/rootlink/etc/passwd")
        with pytest.raises(SandboxError):
            await sbx.write_file("/etc/evil", b"x")
        await sbx.write_file("/home/agent/secret.env", b"K=V\n", 0o600)
        r = await sbx.exec("stat -c %a /home/agent/secret.env; cat /home/agent/secret.env", timeout=30)
        assert r.stdout.split() == ["600", "K=V"]
        p = await sbx.start(f"sleep {own('2714')}")
        await started(own("2714"), 1)
        assert sleeping(own("2714"))  # checked while the command runs
        argv = every_argv()
        assert argv and not any(b"s3cr3t-value" in a for a in argv)
        r = await sbx.exec("echo $CAPTURE_KEY; stat -c %a /tmp/.swe-gym/secrets.env", timeout=30)
        assert r.stdout.split() == ["s3cr3t-value", "600"]
        await p.kill()
    await sbx.close()  # idempotent
    with pytest.raises(SandboxError):
        await sbx.exec("true", timeout=5)


@pytest.mark.integration
@pytest.mark.parametrize("backend", HOST_BACKENDS)
async def test_host_backend_reaches_capture_only_with_relay(backend, tmp_path):
    """A capture endpoint as the server offers it (unix socket + the capture-only TCP port written beside it)."""
    from swe_gym_env.server.sandbox.landlock import CAPTURE_PORT_FILE

    async def handle(r, w):
        await r.read(100)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await w.drain()
        w.close()

    sock = tmp_path / "capture.sock"
    servers = [await asyncio.start_unix_server(handle, str(sock)), await asyncio.start_server(handle, "127.0.0.1", 0)]
    (tmp_path / CAPTURE_PORT_FILE).write_text(str(servers[1].sockets[0].getsockname()[1]))
    fetch = 'python3 -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())"'
    try:
        async with await host_sandbox(backend, capture_socket=sock) as sbx:
            url = f"{sbx.capture_base_url}/v1/models"
            r = await sbx.exec(f"{fetch} {url}", timeout=60, relay=True)
            assert r.ok and r.stdout.strip() == "ok", r
            r = await sbx.exec(f"{fetch} {url}", timeout=60)
            assert not r.ok and ("Connection refused" in r.stderr or "Permission denied" in r.stderr), r
    finally:
        for s in servers:
            s.close()


async def test_a_command_killed_with_its_sandbox_is_sandbox_gone_not_exit_137():
    """An idle timeout kills every process, then the sandbox server exits: a poll can read the command's 137 before
    the job leaves RUNNING. Only a 137 asks whether the sandbox still lives; a dead one is SandboxGone."""
    from swe_gym_env.server.sandbox.errors import SandboxGone

    asked = []

    async def finished() -> bool:
        return True

    def reads(rc: bytes):
        async def read(path: str) -> bytes:
            return rc

        return read

    async def nothing(*_) -> None:
        return None

    async def dead() -> None:
        asked.append("dead")
        raise SandboxGone("HF sandbox job j1 is COMPLETED (its idle timeout fired)")

    async def alive() -> None:
        asked.append("alive")

    with pytest.raises(SandboxGone, match="COMPLETED"):
        await remote.RemoteProcess("p", finished, reads(b"137\n"), nothing, nothing, dead).poll()
    assert await remote.RemoteProcess("p", finished, reads(b"137\n"), nothing, nothing, alive).poll() == 137
    assert await remote.RemoteProcess("p", finished, reads(b"1\n"), nothing, nothing, dead).poll() == 1
    assert asked == ["dead", "alive"], "only a kill asks about the sandbox"


def test_cloud_sandbox_own_timeout_floor_is_a_setting(monkeypatch) -> None:
    from swe_gym_env.server.sandbox.remote import OWN_TIMEOUT_FLOOR_ENV, own_timeout_s

    monkeypatch.delenv(OWN_TIMEOUT_FLOOR_ENV, raising=False)
    assert own_timeout_s(5) == 60 and own_timeout_s(600.2) == 601
    monkeypatch.setenv(OWN_TIMEOUT_FLOOR_ENV, "8")
    assert own_timeout_s(5) == 8 and own_timeout_s(30) == 30
    monkeypatch.setenv(OWN_TIMEOUT_FLOOR_ENV, "0")
    assert own_timeout_s(0.1) == 1
    monkeypatch.setenv(OWN_TIMEOUT_FLOOR_ENV, "a minute")
    with pytest.raises(ValueError, match="SWE_GYM_REMOTE_TIMEOUT_FLOOR_S='a minute'"):
        own_timeout_s(5)


def test_docker_preflight_reports_a_daemon_that_does_not_answer(tmp_path, monkeypatch) -> None:
    """A daemon busy past the probe's bound (in CI an inspect once took over 30 s while other workers used the
    daemon) is a reason with the command and the bound, never an exception out of the probe; a daemon that answers
    without the image says MISSING."""
    from swe_gym_env.server.sandbox import docker as docker_backend

    cli = tmp_path / "docker"
    cli.write_text(
        '#!/bin/sh\ncase "$1" in version) echo 27.5.1;; image) [ -e "$0.hang" ] && exec sleep 30; exit 1;; esac\n'
    )
    cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    ok, why = docker_backend.preflight(wait_s=5)
    assert (ok, "MISSING" in why) == (False, True), why
    (tmp_path / "docker.hang").touch()
    ok, why = docker_backend.preflight(wait_s=1)
    assert not ok and "does not answer `docker image` within 1 s" in why, why
