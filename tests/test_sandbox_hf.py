"""The `hf` and `hf-pool` backends for real, against the HF emulator (tests/hf_emulator): the real SDK, a job per
docker container of a stand-in task image, the emulator's sandbox server inside.

The backends run in a subprocess (`hf_emulator.run_sdk`): the SDK must resolve `<job>--49983.<domain>` to
loopback, which needs the emulator's hosts file mounted over /etc/hosts. Each snippet prints one JSON line last.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid

import pytest
from conftest import docker_has, require
from test_sandbox_contracts import tiny_bundle

pytestmark = [pytest.mark.slow]
IMAGE = "swe-gym-env-standin/sweb.eval.x86_64.tkem_s_cachetools-3.1.0"  # /testbed is a git repo; python3; no curl
PRELUDE = """\
import asyncio, json, os, sys, time
os.environ["SWE_GYM_PUBLIC_URL"] = "http://127.0.0.1:9"
os.environ["SWE_GYM_SERVER_ID"] = {server_id!r}
from swe_gym_env.server.sandbox import hf_pool
from swe_gym_env.server.sandbox.base import SandboxError, SandboxSpec
from swe_gym_env.server.sandbox.registry import create_sandbox
IMAGE = {image!r}
out = {{}}
"""


@pytest.fixture(scope="module")
def emu(hf_emulator):
    require(docker_has(IMAGE), f"stand-in image {IMAGE} missing (see the real task images setup)")
    return hf_emulator


def run(emu, code: str, timeout: float = 400, server_id: str | None = None) -> dict:
    """Run `code` (after PRELUDE; it fills `out`) with the SDK pointed at the emulator; `out` comes back."""
    sid = server_id or f"h2t{uuid.uuid4().hex[:12]}"
    body = PRELUDE.format(server_id=sid, image=IMAGE) + textwrap.dedent(code) + "\nprint(json.dumps(out))\n"
    done = emu.run_sdk(body, timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def base_commit() -> str:
    argv = ["docker", "run", "--rm", "--network", "none", "--entrypoint", "git", IMAGE, "-C", "/testbed"]
    return subprocess.run([*argv, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=120).stdout.strip()


CONTRACT = """\
async def main():
    spec = SandboxSpec(
        image=IMAGE, base_commit={base!r}, secrets={{"CAPTURE_KEY": "s3cr3t-value"}}, env={{"FOO": "x y"}},
        ro_mounts={{{bundle!r}: "/opt/swe-gym-agent"}}, deadline_s=900,
    )
    t = time.monotonic()
    sbx = await create_sandbox({backend!r}, spec)
    out["create_s"] = time.monotonic() - t
    out["workdir"], out["bundle_bytes"], out["job"] = sbx.agent_workdir, sbx.bundle_bytes, sbx.job_id
    r = await sbx.exec(["printf", "%s|", "a b", "$HOME", "'q'"], timeout=30, cwd="/tmp")
    out["argv"] = r.stdout
    r = await sbx.exec("pwd; echo $FOO; echo $CAPTURE_KEY; cat", timeout=30, cwd="/home/agent", stdin=b"in")
    out["env"] = r.stdout.split("\\n")
    r = await sbx.exec(
        "git rev-parse --show-toplevel; git log --all --oneline | wc -l; echo x >> setup.py; git status --porcelain",
        timeout=60,
    )
    out["git"] = r.stdout.split()
    find = "import importlib.util as u; print(u.find_spec('cachetools').origin)"
    env = "source /opt/miniconda3/bin/activate && conda activate testbed && python -c " + json.dumps(find)
    out["imports"] = (await sbx.exec(["bash", "-c", env], timeout=60, cwd="/")).stdout.strip()
    await sbx.write_file("/home/agent/secret.env", b"K=V\\n", 0o600)
    r = await sbx.exec(
        "stat -c %a /home/agent/secret.env; cat /home/agent/secret.env; ls /opt/swe-gym-agent", timeout=30
    )
    out["files"] = r.stdout.split()
    out["read"] = (await sbx.read_file("/home/agent/secret.env")).decode()
    try:
        await sbx.read_file("/tmp/no-such-file")
        out["missing"] = "read"
    except SandboxError as e:
        out["missing"] = str(e)
    p = await sbx.start("sleep 0.5; echo done; exit 3")
    out["first_poll"] = await p.poll()
    r = await p.wait(30)
    out["background"] = [r.exit_code, r.stdout]
    t = time.monotonic()
    r = await sbx.exec("sleep 30", timeout=2)
    out["timeout"] = [r.exit_code, r.timed_out, time.monotonic() - t]
    p = await sbx.start("sleep 2715")
    await asyncio.sleep(1)
    await p.kill()
    out["killed"] = await p.poll()
    procs = "for f in /proc/[0-9]*/cmdline; do tr '\\\\0' ' ' < $f 2>/dev/null; echo; done"
    procs += " | grep -c '^sleep 2715' || true"
    out["left"] = (await sbx.exec(procs, timeout=30)).stdout.strip()
    await sbx.close()
    try:
        await sbx.exec("true", timeout=5)
        out["after_close"] = "ran"
    except SandboxError as e:
        out["after_close"] = str(e)
    out["pools_closed"] = hf_pool.close_pools()
asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["hf", "hf-pool"])
def test_backend_contract_against_the_emulator(emu, backend, tmp_path):
    bundle, _meta = tiny_bundle(tmp_path)
    out = run(emu, CONTRACT.format(backend=backend, base=base_commit(), bundle=bundle))
    work = out["workdir"]
    if backend == "hf":
        assert work == "/testbed"
    else:  # its own copy, under its home
        assert work.endswith("/testbed") and work != "/testbed"
    assert out["argv"].split("|")[0] == "a b" and out["argv"].endswith("|'q'|"), out["argv"]
    assert out["env"][1:4] == ["x y", "s3cr3t-value", "in"], out["env"]
    assert out["env"][0] == (work.removesuffix("/testbed") + "/home/agent" if backend == "hf-pool" else "/home/agent")
    assert out["git"] == [work, "1", "M", "setup.py"], out["git"]  # history stripped to the base; the tree writable
    assert out["imports"] == f"{work}/cachetools/__init__.py"  # the image's editable install: the sandbox's copy
    assert out["files"][:2] == ["600", "K=V"] and "node" in out["files"], out["files"]
    assert out["read"] == "K=V\n" and out["bundle_bytes"] > 0
    assert "no such file" in out["missing"], out["missing"]
    assert out["first_poll"] is None and out["background"] == [3, "done\n"]
    assert out["timeout"][:2] == [124, True] and out["timeout"][2] < 20, out["timeout"]
    assert out["killed"] == 137 and out["left"] == "0", out
    assert "closed" in out["after_close"]
    assert out["pools_closed"] == ([IMAGE] if backend == "hf-pool" else [])
    stages = {j["id"]: j["stage"] for j in emu.jobs()}
    assert stages[out["job"]] == "CANCELED"  # the dedicated job, or the pool host once the pool closed


def test_three_pool_sandboxes_two_per_host_use_exactly_two_hosts(emu):
    out = run(
        emu,
        """
        os.environ["SWE_GYM_HF_POOL_SANDBOXES_PER_HOST"] = "2"
        async def main():
            spec = SandboxSpec(image=IMAGE, deadline_s=600)
            sbxs = await asyncio.gather(*[create_sandbox("hf-pool", spec) for _ in range(3)])
            out["hosts"] = [s.job_id for s in sbxs]
            out["workdirs"] = [s.agent_workdir for s in sbxs]
            for i, s in enumerate(sbxs):
                await s.exec(f"echo {i} > mine.txt", timeout=30)
            seen = [await s.exec("cat mine.txt; ls /testbed/mine.txt 2>&1 | wc -l", timeout=30) for s in sbxs]
            out["seen"] = [r.stdout.split() for r in seen]
            others = await sbxs[0].exec(f"cat {sbxs[1].agent_workdir}/mine.txt", timeout=30)
            out["other"] = [others.exit_code, others.stderr.strip()[-200:]]
            for s in sbxs:
                await s.close()
            out["closed"] = hf_pool.close_pools()
        asyncio.run(main())
        """,
    )
    assert len(set(out["hosts"])) == 2 and sorted(out["hosts"].count(h) for h in set(out["hosts"])) == [1, 2]
    assert len(set(out["workdirs"])) == 3
    assert out["seen"] == [["0", "1"], ["1", "1"], ["2", "1"]]  # each its own copy; the image's /testbed untouched
    assert out["other"][0] != 0  # another sandbox's copy is out of reach
    stages = {j["id"]: j["stage"] for j in emu.jobs()}
    assert {stages[h] for h in out["hosts"]} == {"CANCELED"}


def test_dead_job_and_silent_server_are_clear_errors_never_a_hang(emu):
    out = run(
        emu,
        """
        import httpx
        admin = httpx.Client(base_url=os.environ["HF_ENDPOINT"], timeout=60, trust_env=False,
                             headers={"Authorization": "Bearer " + os.environ["HF_TOKEN"]})
        async def fault(backend, action):
            sbx = await create_sandbox(backend, SandboxSpec(image=IMAGE, deadline_s=600))
            p = await sbx.start("sleep 300")
            admin.post(f"/_emulator/jobs/{sbx.job_id}/{action}").raise_for_status()
            t = time.monotonic()
            try:
                await p.wait(200)
                got = "no error"
            except SandboxError as e:
                got = str(e)
            took = time.monotonic() - t
            t = time.monotonic()
            try:
                await sbx.exec("true", timeout=30)
                again = "ran"
            except SandboxError as e:
                again = str(e)
            again_s = time.monotonic() - t
            t = time.monotonic()
            await sbx.close()
            return {"job": sbx.job_id, "error": got, "took": took, "again": again, "again_s": again_s,
                    "close_s": time.monotonic() - t}
        async def main():
            out["killed"], out["paused"], out["pool_killed"] = await asyncio.gather(
                fault("hf", "kill"), fault("hf", "pause"), fault("hf-pool", "kill"))
            hf_pool.close_pools()
        asyncio.run(main())
        """,
        timeout=500,
    )
    for case in ("killed", "pool_killed"):
        r = out[case]
        assert f"HF sandbox job {r['job']} is ERROR" in r["error"] and "it failed" in r["error"], r
        assert r["took"] < 60 and r["again"] == r["error"] and r["again_s"] < 1 and r["close_s"] < 70, r
    r = out["paused"]
    assert f"HF sandbox job {r['job']} is RUNNING but its sandbox server stopped answering" in r["error"], r
    assert r["took"] < 90 and r["again"] == r["error"] and r["again_s"] < 1 and r["close_s"] < 70, r


def test_idle_timeout_is_named(emu):
    out = run(
        emu,
        """
        async def main():
            # the real idle timer, made short by the floor's setting (60 s by default): 8 s
            os.environ["SWE_GYM_REMOTE_TIMEOUT_FLOOR_S"] = "8"
            spec = SandboxSpec(image=IMAGE, deadline_s=8)
            sbxs = await asyncio.gather(create_sandbox("hf", spec), create_sandbox("hf-pool", spec))
            await asyncio.sleep(20)
            for name, sbx in zip(("hf", "pool"), sbxs):
                sbx.expires_at = time.time() + 600  # past its deadline the base refuses before asking
                try:
                    await sbx.exec("true", timeout=30)
                    out[name] = "ran"
                except SandboxError as e:
                    out[name] = str(e)
                await sbx.close()
            hf_pool.close_pools()
        asyncio.run(main())
        """,
        timeout=400,
    )
    assert "is COMPLETED (it exited by itself (the sandbox server's idle timeout fired" in out["hf"], out
    assert "no longer exists on job" in out["pool"] and "idle timeout fired" in out["pool"], out


def test_a_restarted_server_reaps_its_dead_predecessors_pool_hosts(emu):
    sid = f"h2reap{uuid.uuid4().hex[:10]}"
    first = run(
        emu,
        """
        async def main():
            sbx = await create_sandbox("hf-pool", SandboxSpec(image=IMAGE, deadline_s=600))
            out["host"] = sbx.job_id
        asyncio.run(main())  # and exits without closing anything, as a killed server would
        """,
        server_id=sid,
    )
    assert {j["id"]: j["stage"] for j in emu.jobs()}[first["host"]] == "RUNNING"
    second = run(emu, 'out["reaped"] = hf_pool.reap_orphans()\n', server_id=sid)
    other = run(emu, 'out["reaped"] = hf_pool.reap_orphans()\n')  # another server id: nothing of its own
    assert second["reaped"] == [f"hf-pool:{first['host']}"] and other["reaped"] == []
    assert {j["id"]: j["stage"] for j in emu.jobs()}[first["host"]] == "CANCELED"
