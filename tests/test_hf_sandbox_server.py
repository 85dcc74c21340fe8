"""The emulated HF sandbox server (`tests/hf_emulator/sandbox_server.py`) in a job-like container, driven by
huggingface_hub's own client classes (`_SandboxServer.from_job` on a hand-built `JobInfo`, `Sandbox`, `files`)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi, JobInfo
from huggingface_hub._sandbox import Sandbox, SandboxFiles, _derive_sandbox_token, _SandboxServer
from huggingface_hub.errors import SandboxCommandError, SandboxError

from swe_gym_env.core.procs import free_port

IMAGE = "swe-gym-env-standin/sweb.eval.x86_64.uiri_s_toml-0.10.2"
DOMAIN = "hfjobs.test"
SERVER_PY = Path(__file__).resolve().parent / "hf_emulator" / "sandbox_server.py"
HF_TOKEN = "hf_emulator_dummy_token"
RUN_ID = uuid.uuid4().hex[:8]


def _docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _docker_ready(), reason=f"needs docker and the image {IMAGE}")


class Job:
    """One container running the sandbox server, started the way the emulator's jobs side starts a job."""

    def __init__(self, tls: Path, env: dict[str, str]) -> None:
        self.id = secrets.token_hex(12)
        self.port = free_port()
        self.nonce = secrets.token_hex(16)
        self.name = f"hfemu-sbxtest-{RUN_ID}-{self.id[:8]}"
        token = _derive_sandbox_token(HF_TOKEN, self.nonce)
        env = {**env, "HFEMU_PORT": str(self.port), "HFEMU_JOB_ID": self.id}
        argv = ["docker", "run", "-d", "--network", "host", "--name", self.name, "--label", f"hfemu.test={RUN_ID}"]
        argv += ["-v", f"{SERVER_PY}:/.hfemu/sandbox_server.py:ro", "-v", f"{tls}:/.hfemu/tls:ro", "-e", "SBX_TOKEN"]
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        argv += ["--entrypoint", "/bin/sh", IMAGE, "-c"]
        argv += ['exec "$(command -v python3 || command -v python)" /.hfemu/sandbox_server.py']
        # The token travels in the docker client's environment (`-e SBX_TOKEN`), never in argv.
        subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "SBX_TOKEN": token})

    @property
    def url(self) -> str:
        return f"https://{self.id}--49983.{DOMAIN}:{self.port}"

    def info(self) -> JobInfo:
        return JobInfo(
            id=self.id,
            owner={"id": "u-test", "name": "tester", "type": "user"},
            status={"stage": "RUNNING", "exposeUrls": [self.url]},
            labels={"hf-sandbox": "1", "hf-sandbox-nonce": self.nonce},
        )

    def server(self, token: str | None = None, capacity: int = 0) -> _SandboxServer:
        """The SDK's transport for this job, ready (it polled `/health` and checked the protocol)."""
        server = _SandboxServer.from_job(
            job=self.info(),
            nonce=self.nonce,
            sandbox_token=token or _derive_sandbox_token(HF_TOKEN, self.nonce),
            api=HfApi(token=HF_TOKEN),
            max_connections=SandboxFiles.PARALLEL_MAX_WORKERS + 2,
            capacity=capacity,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait_ready asks the Jobs API about a slow job; there is none here
            try:
                if server._client.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                time.sleep(0.2)
        server.wait_ready(10)
        return server

    def wait_exit(self, timeout: float) -> int | None:
        try:
            done = subprocess.run(["docker", "wait", self.name], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return int(done.stdout.strip())

    def logs(self) -> str:
        return subprocess.run(["docker", "logs", self.name], capture_output=True, text=True).stdout

    def exec(self, code: str) -> str:
        return subprocess.run(
            ["docker", "exec", self.name, "python3", "-c", code], capture_output=True, text=True, check=True
        ).stdout

    def remove(self) -> None:
        subprocess.run(["docker", "rm", "-f", self.name], capture_output=True)


@pytest.fixture(scope="module")
def env() -> Iterator[dict]:
    """TLS material, names resolved to loopback, and a `start` that tracks every container for removal."""
    trustme = pytest.importorskip("trustme")
    tls = Path(f"/tmp/hfemu-sbxtest-{RUN_ID}")
    tls.mkdir(mode=0o755)
    ca = trustme.CA()
    cert = ca.issue_cert(f"*.{DOMAIN}")
    ca.cert_pem.write_to_path(str(tls / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tls / "key.pem"))
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(tls / "cert.pem"), append=i > 0)
    for f in tls.iterdir():
        f.chmod(0o644)
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):  # what the emulator's hosts file does for a container
        return real("127.0.0.1" if str(host).endswith("." + DOMAIN) else host, *args, **kwargs)

    jobs: list[Job] = []

    def start(**job_env: str) -> Job:
        job = Job(tls, job_env)
        jobs.append(job)
        return job

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSL_CERT_FILE", str(tls / "ca.pem"))
        mp.setattr(socket, "getaddrinfo", resolve)
        try:
            yield {"start": start}
        finally:
            for job in jobs:
                job.remove()
            left = subprocess.run(
                ["docker", "ps", "-aq", "--filter", f"label=hfemu.test={RUN_ID}"], capture_output=True, text=True
            ).stdout.split()
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
            shutil.rmtree(tls, ignore_errors=True)


@pytest.fixture(scope="module")
def dedicated(env) -> Iterator[tuple[Job, Sandbox]]:
    job = env["start"](FOO="from-job-env")
    sbx = Sandbox(id=job.id, server=job.server(), local_id=None, owns_sandbox=False, owns_server=True)
    yield job, sbx
    sbx.close()


def test_exec_streams_output_exit_code_cwd_env_stdin(dedicated) -> None:
    _, sbx = dedicated
    seen: list[str] = []
    r = sbx.run("echo out; echo err >&2; exit 3", check=False, on_stdout=seen.append)
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 3, False)
    assert "".join(seen) == "out\n"
    with pytest.raises(SandboxCommandError):
        sbx.run("exit 1")
    assert sbx.run(["pwd"], cwd="/tmp").stdout == "/tmp\n"
    r = sbx.run('echo "$FOO-$BAR-${SBX_TOKEN:-no-token}"', env={"BAR": "b"})
    assert r.stdout == "from-job-env-b-no-token\n"  # job env reaches commands; the server's token does not
    assert sbx.run("cat", stdin="piped in").stdout == "piped in"
    assert sbx.run(["no-such-binary-xyz"], check=False).exit_code == 127
    with pytest.raises(SandboxError) as bad_cwd:
        sbx.run("true", cwd="/no/such/dir")
    assert bad_cwd.value.status_code == 400


def test_exec_timeout_kills_the_command(dedicated) -> None:
    _, sbx = dedicated
    t0 = time.monotonic()
    r = sbx.run("echo started; sleep 30", timeout=1, check=False)
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert r.stdout == "started\n"
    assert time.monotonic() - t0 < 10


def test_background_process_listed_survives_then_killed(dedicated) -> None:
    _, sbx = dedicated
    proc = sbx.run("sleep 300", background=True)
    assert proc.id and proc.pid > 0
    listed = {p.id: p for p in sbx.processes()}
    assert listed[proc.id].running and listed[proc.id].cmd == "sleep 300"
    assert sbx.run(f"kill -0 {proc.pid}").ok  # alive after the request that started it returned
    assert proc.kill() is True
    after = {p.id: p for p in sbx.processes()}[proc.id]
    assert not after.running and after.exit_code is not None
    assert proc.kill() is False
    assert sbx.run(f"kill -0 {proc.pid}", check=False).exit_code != 0


def test_files_ranged_roundtrip_and_ops(dedicated, tmp_path: Path) -> None:
    _, sbx = dedicated
    big = os.urandom(3 * 1024 * 1024 + 12345)  # over PARALLEL_THRESHOLD: ranged parallel write and read
    sbx.files.write("/tmp/hfemu/deep/big.bin", big)  # parents are created
    assert sbx.files.stat("/tmp/hfemu/deep/big.bin").size == len(big)
    assert sbx.files.read("/tmp/hfemu/deep/big.bin") == big
    assert sbx.files._read_range("/tmp/hfemu/deep/big.bin", 1024 * 1024 + 7, 1000) == big[1024 * 1024 + 7 :][:1000]
    sbx.files.download("/tmp/hfemu/deep/big.bin", tmp_path / "big.bin")
    assert (tmp_path / "big.bin").read_bytes() == big
    smaller = big[: 2 * 1024 * 1024 + 999]
    sbx.files.write("/tmp/hfemu/deep/big.bin", smaller)  # ranged overwrite truncates to the new size
    assert sbx.files.read("/tmp/hfemu/deep/big.bin") == smaller
    assert sbx.run("sha256sum /tmp/hfemu/deep/big.bin").stdout.split()[0] == hashlib.sha256(smaller).hexdigest()

    sbx.files.write("/tmp/hfemu/run.sh", "#!/bin/sh\necho ran\n", mode="755")
    assert sbx.files.stat("/tmp/hfemu/run.sh").mode.endswith("755")
    assert sbx.run("/tmp/hfemu/run.sh").stdout == "ran\n"
    sbx.files.mkdir("/tmp/hfemu/a/b/c")
    entries = {e.name: e for e in sbx.files.list("/tmp/hfemu")}
    assert entries["a"].type == "dir" and entries["run.sh"].type == "file" and entries["run.sh"].size == 19
    assert entries["deep"].path == "/tmp/hfemu/deep"
    assert sbx.files.exists("/tmp/hfemu/a/b/c") and not sbx.files.exists("/tmp/hfemu/nope")
    with pytest.raises(SandboxError) as not_empty:
        sbx.files.delete("/tmp/hfemu/a")
    assert not_empty.value.status_code == 409
    sbx.files.delete("/tmp/hfemu/a", recursive=True)
    sbx.files.delete("/tmp/hfemu/run.sh")
    assert {e.name for e in sbx.files.list("/tmp/hfemu")} == {"deep"}


RANGE = 64 * 1024  # the SDK's ranges are 1 MiB: 64 KiB ones make the same 16 requests at once, cheaply


def _race_parents(sbx: Sandbox, base: str, seen_as: str, rounds: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's parallel ranged write of 16 ranges + 1, again and again, each time into a fresh 5-deep dir under
    `base` (`seen_as` by a command): every range creates the missing parents. Each file checked byte for byte (a
    range truncating another's would show)."""
    monkeypatch.setattr(sbx.files, "PARALLEL_THRESHOLD", RANGE)  # this test's instance only: restored after it
    monkeypatch.setattr(sbx.files, "PARALLEL_CHUNK_SIZE", RANGE)
    written = {}
    for n in range(rounds):
        path = f"{base}/{n}/a/b/c/d/e/f.bin"
        written[path] = os.urandom(SandboxFiles.PARALLEL_MAX_WORKERS * RANGE + 1 + n)
        sbx.files.write(path, written[path])
    sums = sbx.run(["sh", "-c", 'cd "$1" && sha256sum */a/b/c/d/e/f.bin', "sh", seen_as]).stdout
    assert sorted(sums.split()[1::2]) == sorted(p[len(base) + 1 :] for p in written)
    for got, name in zip(sums.split()[::2], sums.split()[1::2], strict=True):
        assert got == hashlib.sha256(written[f"{base}/{name}"]).hexdigest(), name


def test_parallel_ranged_writes_create_parents_race_free(dedicated, monkeypatch) -> None:
    """Two ranges of one write both found a parent missing and both made it: the loser's request failed with 409
    "File exists" (the flake of `test_files_ranged_roundtrip_and_ops`; this lost it in ~5% of rounds)."""
    _, sbx = dedicated
    base = f"/tmp/hfemu-race-{RUN_ID}"
    _race_parents(sbx, base, base, 100, monkeypatch)
    sbx.files.delete(base, recursive=True)


def test_missing_file_is_404(dedicated) -> None:
    _, sbx = dedicated
    for call in (lambda: sbx.files.read("/no/such/file"), lambda: sbx.files.stat("/no/such/file")):
        with pytest.raises(SandboxError) as missing:
            call()
        assert missing.value.status_code == 404
    assert sbx.files.exists("/no/such/file") is False


def test_wrong_token_is_refused(dedicated) -> None:
    job, _ = dedicated
    bad = Sandbox(id=job.id, server=job.server(token="0" * 64), local_id=None, owns_sandbox=False, owns_server=True)
    try:
        with pytest.raises(SandboxError) as refused:
            bad.run("true")
        assert refused.value.status_code == 403
        with pytest.raises(SandboxError):  # `exists` must not turn an auth failure into "missing"
            bad.files.exists("/etc/hostname")
    finally:
        bad.close()
    r = httpx2.get(job.url + "/v1/processes", verify=False)
    assert r.status_code == 401  # no token at all


def test_port_proxy_reaches_a_server_in_the_sandbox(dedicated) -> None:
    _, sbx = dedicated
    port = free_port()
    sbx.files.write("/tmp/hfemu-www/hello.txt", "hello through the proxy")
    proc = sbx.run(f"cd /tmp/hfemu-www && exec python3 -m http.server {port} --bind 127.0.0.1", background=True)
    try:
        probe = ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"]
        for _ in range(100):
            if sbx.run(probe, check=False).ok:
                break
            time.sleep(0.1)
        got = sbx._server._client.get(sbx.proxy_url_for(port, "/hello.txt"), headers=sbx.proxy_headers)
        assert got.status_code == 200 and got.text == "hello through the proxy"
    finally:
        proc.kill()


def test_idle_timeout_exits_once_no_request_and_no_process(env) -> None:
    job = env["start"](SBX_IDLE_TIMEOUT="2")
    sbx = Sandbox(id=job.id, server=job.server(), local_id=None, owns_sandbox=False, owns_server=True)
    t0 = time.monotonic()
    sbx.run("sleep 4", background=True)  # a running background process is activity
    sbx.close()
    assert job.wait_exit(30) == 0
    assert time.monotonic() - t0 >= 5.5
    assert "idle for 2s" in job.logs()


@pytest.fixture(scope="module")
def pool(env) -> Iterator[tuple[Job, _SandboxServer]]:
    job = env["start"](SBX_HOST_MODE="1", SBX_CAPACITY="2", SBX_IDLE_TIMEOUT="600")
    host = job.server(capacity=2)
    yield job, host
    host.close()


def _create(job: Job, host: _SandboxServer, **body) -> Sandbox:
    """What `SandboxPool._create_one` does with a host's answer."""
    data = host.request("POST", "/v1/sandboxes", json={"count": 1, **body}).json()
    assert data["rejected"] == 0, data
    item = data["sandboxes"][0]
    return Sandbox(
        id=f"{job.id}.{item['id']}",
        server=host,
        local_id=item["id"],
        owns_sandbox=True,
        owns_server=False,
        sandbox_token=item["token"],
    )


def test_pool_sandboxes_are_isolated_uids_under_landlock(pool) -> None:
    job, host = pool
    a, b = _create(job, host, env={"WHO": "a"}), _create(job, host)
    try:
        assert a.run("echo $WHO").stdout == "a\n"
        uid_a, uid_b = int(a.run("id -u").stdout), int(b.run("id -u").stdout)
        assert uid_a >= 20000 and uid_b >= 20000 and uid_a != uid_b
        home_a = a.run("pwd").stdout.strip()
        assert a.run("echo $HOME").stdout.strip() == home_a
        a.files.write("/secret.txt", "a's secret")  # rooted at a's home
        assert a.run("cat secret.txt").stdout == "a's secret"
        assert a.files.read("/secret.txt") == b"a's secret"
        assert a.run('echo t > "$TMPDIR/t" && echo ok > mine && cat mine').stdout == "ok\n"

        assert not b.run(f"cat {home_a}/secret.txt", check=False).ok
        assert not b.run(f"echo x > {home_a}/planted", check=False).ok
        assert not b.files.exists("/secret.txt")
        with pytest.raises(SandboxError) as escaped:
            b.files.read(f"/../{a._local_id}/secret.txt")  # lexically rooted at b's home
        assert escaped.value.status_code == 404
        b.run("ln -s /etc/passwd link")
        with pytest.raises(SandboxError) as symlink:
            b.files.read("/link")
        assert symlink.value.status_code == 400
        # Landlock, beyond uids: /var/tmp is world-writable, yet b cannot write there, nor bind a TCP port.
        denied = b.run("echo x > /var/tmp/hfemu-pool-probe", check=False)
        assert not denied.ok and "Permission denied" in denied.stderr
        port = free_port()
        bind = b.run(["python3", "-c", f"import socket; socket.socket().bind(('127.0.0.1', {port}))"], check=False)
        assert not bind.ok and "PermissionError" in bind.stderr

        stolen = Sandbox(id=b.id, server=host, local_id=b._local_id, owns_sandbox=False, owns_server=False,
                         sandbox_token=a._sandbox_token)  # fmt: skip
        with pytest.raises(SandboxError) as cross:
            stolen.run("true")
        assert cross.value.status_code == 403
        assert host.sandbox_token(a._local_id) == a._sandbox_token  # recovery with the host credential
        with pytest.raises(SandboxError) as not_host:
            host.request("GET", "/v1/sandboxes", sandbox_token=a._sandbox_token)
        assert not_host.value.status_code == 403

        full = host.request("POST", "/v1/sandboxes", json={"count": 1}).json()
        assert full == {"sandboxes": [], "rejected": 1}  # capacity 2 enforced by the host

        a.run("sleep 300", background=True)
        a.run("setsid sleep 301 >/dev/null 2>&1 &")  # detached: only killing the uid finds it
        a.kill()
        assert {s["id"] for s in host.request("GET", "/v1/sandboxes").json()} == {b._local_id}
        assert b.run(f"test -e {home_a}", check=False).exit_code == 1  # its home is gone
        left = job.exec(f"import os; print(sum(os.stat('/proc/'+p).st_uid == {uid_a} for p in os.listdir('/proc') "
                        "if p.isdigit()))")  # fmt: skip
        assert left.strip() == "0"
        c = _create(job, host)  # the slot is free again
        c.kill()
    finally:
        for s in (a, b):
            s.kill()


def test_pool_sandbox_idle_eviction(pool) -> None:
    job, host = pool
    s = _create(job, host, idle_timeout_secs=1)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if s._local_id not in {x["id"] for x in host.request("GET", "/v1/sandboxes").json()}:
            break
        time.sleep(0.3)
    else:
        pytest.fail("an idle pool sandbox was not evicted")
    with pytest.raises(SandboxError) as gone:
        s.run("true")
    assert gone.value.status_code == 404


def test_pool_parallel_ranged_writes_create_parents_race_free(pool, monkeypatch) -> None:
    """The same in a pool sandbox's home (paths rooted there, no symlink followed), where whichever request made a
    parent, it is the sandbox uid's."""
    job, host = pool
    s = _create(job, host)
    try:
        _race_parents(s, "/race", "race", 40, monkeypatch)  # commands run in the home
        uid = s.run("id -u").stdout.strip()
        owners = s.run(["stat", "-c", "%u", "race", "race/0/a/b/c/d/e", "race/0/a/b/c/d/e/f.bin"]).stdout.split()
        assert owners == [uid] * 3
    finally:
        s.kill()


E2E = """
import json, time
from huggingface_hub import HfApi, Sandbox, SandboxPool
out = {}
t0 = time.monotonic()
pool = SandboxPool("IMAGE", sandboxes_per_host=2, warm_up=1, name="NAME", idle_timeout=300)
out["pool_ready_s"] = time.monotonic() - t0
try:
    t0 = time.monotonic()
    a = pool.create(env={"WHO": "a"})
    out["warm_create_s"] = time.monotonic() - t0
    b = pool.create()
    out["same_host"] = a.host_id == b.host_id
    a.files.write("/note.txt", "from a")
    home_a = a.run("pwd").stdout.strip()
    out["a_reads_own"] = a.run('echo "$(cat note.txt) $WHO"').stdout
    out["b_reads_a"] = b.run(f"cat {home_a}/note.txt", check=False).exit_code
    out["b_writes_var_tmp"] = b.run("touch /var/tmp/x", check=False).exit_code
    again = Sandbox.connect(a.id)  # by id: host lookup via the Jobs API, token recovery with the host credential
    out["connect_reads"] = again.files.read_text("/note.txt")
    again.close()
    c = pool.create()  # the host is full (2): a second host boots
    out["hosts"] = pool.num_hosts
    c.kill()
    a.kill()
    out["a_home_left"] = b.run(f"test -e {home_a}", check=False).exit_code == 0
finally:
    pool.close()
t0 = time.monotonic()
sbx = Sandbox.create("IMAGE", idle_timeout=3)
out["dedicated_ready_s"] = time.monotonic() - t0
sbx.run("true")
job_id = sbx.id
sbx.close()
api = HfApi()
deadline = time.monotonic() + 60
while time.monotonic() < deadline and api.inspect_job(job_id=job_id).status.stage == "RUNNING":
    time.sleep(0.5)
out["idle_stage"] = api.inspect_job(job_id=job_id).status.stage
print(json.dumps(out))
"""


def test_real_sdk_pool_isolation_connect_and_idle_timeout(hf_emulator) -> None:
    """`SandboxPool`, `Sandbox.connect` by a pool sandbox's id and an idle `Sandbox.create`, through the emulator."""
    code = E2E.replace("IMAGE", IMAGE).replace("NAME", f"sbxtest-{RUN_ID}")
    done = hf_emulator.run_sdk(code, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(out)
    assert out["same_host"] and out["hosts"] == 2
    assert out["a_reads_own"] == "from a a\n" and out["connect_reads"] == "from a"
    assert out["b_reads_a"] != 0 and out["b_writes_var_tmp"] != 0
    assert out["a_home_left"] is False and out["idle_stage"] == "COMPLETED"
    assert not hf_emulator.jobs("RUNNING")
