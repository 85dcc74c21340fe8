"""Contract test of the HF emulator: the installed huggingface_hub SDK, unmodified, drives it in a subprocess.

Nothing here lists the SDK's routes or payload fields: each test calls the SDK, so when the SDK's routes, payloads
or the fields it reads change, the emulator answers 404/400 or the SDK fails to parse it, and these tests fail.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from conftest import docker_has, require
from hf_emulator.fixture import HFEmulator

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IMAGE = "swe-gym-env-standin/sweb.eval.x86_64.uiri_s_toml-0.10.2"  # has python3
SERVER = Path(__file__).resolve().parent / "hf_emulator" / "sandbox_server.py"


def sdk(emu: HFEmulator, code: str, timeout: float = 300) -> dict:
    """Run ``code`` (which prints one JSON object as its last line) through the SDK; that object."""
    prelude = f"import json, time\nfrom huggingface_hub import HfApi\nIMAGE = {IMAGE!r}\napi = HfApi()\n"
    done = emu.run_sdk(prelude + code, timeout)
    assert done.returncode == 0, f"SDK snippet failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def emu(hf_emulator: HFEmulator) -> HFEmulator:
    require(docker_has(IMAGE), f"stand-in image {IMAGE} missing (see the real task images setup)")
    return hf_emulator


WAIT = """
def wait(job_id, stages, limit=120):
    end = time.time() + limit
    while time.time() < end:
        job = api.inspect_job(job_id=job_id)
        if job.status.stage in stages:
            return job
        time.sleep(0.3)
    raise AssertionError(f"{job_id} never reached {stages}: {job.status}")
"""


def test_jobs_api_whoami_run_inspect_list_logs_cancel(emu: HFEmulator) -> None:
    tag = secrets.token_hex(4)
    out = sdk(
        emu,
        WAIT
        + f"""
me = api.whoami()
short = api.run_job(image=IMAGE, env={{"GREETING": "world"}}, secrets={{"SECRET_X": "s3cr3t-{tag}"}},
    command=["python3", "-c", "import os, sys; print('hello', os.environ['GREETING'], len(os.environ['SECRET_X']))"
             "; print('to stderr', file=sys.stderr)"],
    labels={{"suite": "{tag}", "kind": "short"}}, timeout="5m")
long = api.run_job(image=IMAGE, command=["sleep", "300"], labels={{"suite": "{tag}", "kind": "long"}})
fails = api.run_job(image=IMAGE, command=["sh", "-c", "echo failing; exit 3"], labels={{"suite": "{tag}"}})
logs = list(api.fetch_job_logs(job_id=short.id, follow=True))
done = wait(short.id, ("COMPLETED", "ERROR"))
wait(long.id, ("RUNNING",))
failed = wait(fails.id, ("COMPLETED", "ERROR"))
by_label = [j.id for j in api.list_jobs(labels={{"suite": "{tag}", "kind": "long"}})]
running = [j.id for j in api.list_jobs(status="RUNNING", labels={{"suite": "{tag}"}})]
suite = sorted(j.id for j in api.list_jobs(labels={{"suite": "{tag}"}}))
api.cancel_job(job_id=long.id)
canceled = api.inspect_job(job_id=long.id)
print(json.dumps({{
    "me": me, "submitted": short.status.stage, "short": short.id, "long": long.id, "fails": fails.id,
    "logs": logs, "done": [done.status.stage, done.status.message], "failed": [failed.status.stage,
    failed.status.message], "by_label": by_label, "running": running, "suite": suite,
    "canceled": canceled.status.stage, "initiator": done.initiator.id, "owner": done.owner.name,
    "command": done.command, "image": done.docker_image, "flavor": str(done.flavor), "labels": done.labels,
    "env": done.environment, "secret_names": sorted(done.secrets or {{}}), "created": bool(done.created_at),
    "started": bool(done.started_at), "finished": bool(done.finished_at), "url": done.url,
}}))
""",
    )
    assert out["submitted"] == "SCHEDULING"
    assert out["initiator"] == out["me"]["id"] and out["owner"] == out["me"]["name"]
    assert sorted(out["logs"]) == ["hello world 15", "to stderr"]  # stdout and stderr: order not kept
    assert out["done"] == ["COMPLETED", None]
    assert out["failed"][0] == "ERROR" and "3" in out["failed"][1]
    assert out["by_label"] == [out["long"]] and out["running"] == [out["long"]]
    assert out["suite"] == sorted([out["short"], out["long"], out["fails"]])
    assert out["canceled"] == "CANCELED"
    assert out["command"][0] == "python3" and out["image"] == IMAGE and out["flavor"] == "cpu-basic"
    assert {"suite": tag, "kind": "short"}.items() <= out["labels"].items() and out["env"] == {"GREETING": "world"}
    assert out["secret_names"] == ["SECRET_X"] and out["created"] and out["started"] and out["finished"]
    assert out["url"].endswith(f"/jobs/hfemu-user/{out['short']}")
    leaked = [p for p in emu.state_dir.rglob("*") if p.is_file() and f"s3cr3t-{tag}".encode() in p.read_bytes()]
    assert not leaked, f"a secret value was written to the emulator's state: {leaked}"
    assert {j["id"]: j["stage"] for j in emu.jobs()}[out["long"]] == "CANCELED"
    assert not any(out["long"] in c for c in emu.containers()), "a canceled job's container must be removed"


def test_missing_image_wrong_token_and_killed_job(emu: HFEmulator) -> None:
    out = sdk(
        emu,
        WAIT
        + """
from huggingface_hub.errors import HfHubHTTPError
missing = api.run_job(image="swe-gym-env-standin/no-such-image:never", command=["true"])
gone = wait(missing.id, ("ERROR", "COMPLETED"), 60)
try:
    HfApi(token="hf_not_the_emulators").whoami()
    wrong = None
except HfHubHTTPError as e:
    wrong = e.response.status_code
victim = api.run_job(image=IMAGE, command=["sleep", "300"])
slow = api.run_job(image=IMAGE, command=["sleep", "300"], timeout=2)
wait(victim.id, ("RUNNING",))
late = wait(slow.id, ("ERROR", "COMPLETED"), 60)
print(json.dumps({"missing": [gone.status.stage, gone.status.message], "wrong": wrong, "victim": victim.id,
                  "late": [late.status.stage, late.status.message]}))
""",
    )
    assert out["missing"][0] == "ERROR" and "no-such-image" in out["missing"][1]
    assert out["wrong"] == 401
    assert out["late"][0] == "ERROR" and "timeout" in out["late"][1].lower()
    emu.kill_job(out["victim"])
    stages = {j["id"]: (j["stage"], j["message"]) for j in emu.jobs()}
    assert stages[out["victim"]][0] == "ERROR" and "137" in stages[out["victim"]][1]
    with pytest.raises(RuntimeError, match="404"):
        emu.kill_job("0" * 24)


def test_unknown_payload_field_is_refused(emu: HFEmulator) -> None:
    """The emulator refuses fields it does not know, so a new SDK field shows up here rather than being dropped."""
    import httpx

    body = {"command": ["true"], "dockerImage": IMAGE, "flavor": "cpu-basic", "somethingNew": 1}
    headers = {"Authorization": f"Bearer {emu.token}"}
    r = httpx.post(f"{emu.endpoint}/api/jobs/hfemu-user", json=body, headers=headers, trust_env=False)
    assert r.status_code == 400 and "somethingNew" in r.json()["error"]


def need_server() -> None:
    require(SERVER.is_file(), f"{SERVER} (the emulated sandbox server) does not exist yet")


def test_sandbox_create_run_files_connect_kill(emu: HFEmulator) -> None:
    need_server()
    out = sdk(
        emu,
        """
from huggingface_hub import Sandbox
t0 = time.time()
sbx = Sandbox.create(IMAGE, idle_timeout=300)
ready = time.time() - t0
ran = sbx.run("echo hi-$((40+2))")
sbx.files.write("/tmp/hfemu.txt", b"payload")
again = Sandbox.connect(sbx.id)
read = again.files.read("/tmp/hfemu.txt").decode()
job = api.inspect_job(job_id=sbx.id)
sbx.kill()
after = api.inspect_job(job_id=sbx.id).status.stage
print(json.dumps({"ready": ready, "stdout": ran.stdout, "code": ran.exit_code, "read": read, "id": sbx.id,
    "urls": job.status.expose_urls, "stage": job.status.stage, "after": after}))
""",
    )
    assert out["stdout"].strip() == "hi-42" and out["code"] == 0 and out["read"] == "payload"
    assert out["stage"] == "RUNNING" and out["urls"][0].startswith(f"https://{out['id']}--49983.{emu.domain}:")
    assert out["after"] == "CANCELED"


def test_pool_packs_three_sandboxes_on_two_hosts(emu: HFEmulator) -> None:
    need_server()
    name = f"hfemu-{secrets.token_hex(3)}"
    out = sdk(
        emu,
        f"""
from huggingface_hub import SandboxPool
pool = SandboxPool(IMAGE, sandboxes_per_host=2, name="{name}", warm_up=1)
boxes = [pool.create() for _ in range(3)]
outs = [b.run("echo pooled").stdout.strip() for b in boxes]
hosts = sorted({{b.id.split(".")[0] for b in boxes}})
pool.close()
print(json.dumps({{"outs": outs, "hosts": hosts}}))
""",
    )
    assert out["outs"] == ["pooled"] * 3 and len(out["hosts"]) == 2
    mine = [j for j in emu.jobs() if j["labels"].get("hf-sandbox-pool") == name]
    assert len(mine) == 2 and {j["stage"] for j in mine} == {"CANCELED"}, mine


def test_restarted_emulator_sees_its_jobs_and_sigterm_removes_them(tmp_path: Path) -> None:
    """Job state lives in docker and the state dir: an emulator killed and started again on the same state dir still
    sees its running job (and the fault hooks act on it); SIGTERM then removes every container it started."""
    import httpx
    from hf_emulator.fixture import RUN, TOKEN, HFEmulator, docker_usable, venv_python

    from swe_gym_env.core import procs

    require(docker_usable() and docker_has(IMAGE), f"docker with {IMAGE} needed")
    port = procs.free_port()
    argv = [venv_python(), str(RUN), "--state-dir", str(tmp_path), "--port", str(port), "--ids", "4"]
    health = f"http://127.0.0.1:{port}/_emulator/health"
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/jobs", trust_env=False,
                       headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip

    def stage(job_id: str, want: str) -> dict:
        for _ in range(300):
            info = api.get(f"/hfemu-user/{job_id}").json()
            if info["status"]["stage"] == want:
                return info
            time.sleep(0.2)
        raise AssertionError(f"{job_id} never reached {want}: {info['status']}")

    proc = procs.start(argv, health, stdout=subprocess.DEVNULL, timeout=120)
    emu = HFEmulator(f"http://127.0.0.1:{port}", tmp_path, (tmp_path / "instance").read_text().strip())
    try:
        job = api.post(
            "/hfemu-user", json={"command": ["sleep", "300"], "dockerImage": IMAGE, "labels": {"k": "v"}}
        ).json()
        first = stage(job["id"], "RUNNING")
        proc.kill()  # a crash: its containers outlive it
        proc.wait(timeout=30)
        assert emu.containers(), "a SIGKILLed emulator cannot have removed its job's container"
        proc = procs.start(argv, health, stdout=subprocess.DEVNULL, timeout=120)
        again = stage(job["id"], "RUNNING")
        assert again["createdAt"] == first["createdAt"] and again["labels"] == {"k": "v"}
        assert emu.pause_job(job["id"])["stage"] == "RUNNING" and emu.unpause_job(job["id"])["done"] == "unpause"
    finally:
        emu.close()
        api.close()
        procs.stop(proc, grace=60)
    assert emu.containers() == [], "SIGTERM must remove every container the emulator started"
