"""The hf and e2b backends at their boundary: recording fakes built from the installed SDKs' real signatures.

Every call the backend makes is bound with `inspect.signature` of the real method (`**opts: Unpack[TypedDict]`
keys are checked against the TypedDict), and any attribute the real class lacks raises: a call or argument the real
API does not have fails the test. The recorded calls pin what the backend sends."""

import inspect
import typing

import e2b
import huggingface_hub
import pytest
from e2b.sandbox_async.commands.command import Commands
from e2b.sandbox_async.commands.command_handle import AsyncCommandHandle
from e2b.sandbox_async.filesystem.filesystem import Filesystem
from huggingface_hub._sandbox import SandboxFiles, SandboxProcess

from swe_gym_env.server.sandbox import remote
from swe_gym_env.server.sandbox.base import SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox

pytestmark = pytest.mark.anyio
REAL_HF = huggingface_hub.Sandbox  # before any monkeypatch
REAL_E2B = e2b.AsyncSandbox
calls: list[tuple[str, dict]] = []


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
            return b"hello\n"
        return self.store.get(path, b"")


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
        self.files = FakeHFFiles()
        self.procs: list[FakeHFProcess] = []

    @classmethod
    def create(cls, *a, **kw):
        checked(REAL_HF, "create")(*a, **kw)
        return cls()

    def run(self, *a, **kw):
        args = checked(REAL_HF, "run")(*a, **kw)
        if args.get("background"):
            self.procs.append(FakeHFProcess(f"p{len(self.procs)}"))
            return self.procs[-1]
        return None

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
        checked(Commands, "run")(*a, **kw)
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
        return b"0\n" if args["path"].endswith(".rc") else b"out\n" if args["path"].endswith(".out") else b""


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
