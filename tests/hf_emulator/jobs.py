"""The Hub/Jobs side of the HF emulator: whoami and the Jobs API the huggingface_hub SDK calls, where a job is a
docker container on the local dockerd.

Routes, payload fields and JobInfo fields follow `huggingface_hub/_jobs_api.py` and `hf_api.py` (2.4). A sandbox
job (its env carries the bootstrap's ``SBX_SERVER_SHA256``) runs ``sandbox_server.py`` instead of the downloaded
binary and is RUNNING once that server answers ``/health`` over TLS; any other job runs its command as given. Live
state comes from ``docker inspect``; what docker cannot say (the spec, a cancel, a failed launch) is kept in
``<state>/jobs/<id>.json`` so a restarted emulator sees its jobs again. Secrets are never written anywhere: docker
gets them through its own environment (``-e NAME``), never argv. The HTTP routes are in `api`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from swe_gym_env.core.procs import free_port

SERVER_PORT = 49983  # the SDK's SANDBOX_SERVER_PORT: expose URLs must contain "--49983."
USER_ID = "6650f0c0ffee0000000000e1"  # whoami's id; every job's owner and initiator
USER_NAME = "hfemu-user"
JOB_ID = re.compile(r"[0-9a-f]{24}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")
LOG_KEEPALIVE_S = 30.0
MAX_SPEC_BYTES = 1 << 20
DOCKER = shutil.which("docker") or "docker"  # absolute: a job's own PATH travels in the CLI's environment
Stage = Literal["SCHEDULING", "RUNNING", "COMPLETED", "CANCELED", "ERROR", "DELETED"]


def now_iso() -> str:
    """A time in the Hub's format (``2025-07-22T16:06:25.079Z``, what `parse_datetime` reads)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def docker_time(value: str | None) -> str | None:
    """Docker's RFC 3339 nanosecond time as the Hub's millisecond one; None for docker's zero time."""
    if not value or value.startswith("0001-"):
        return None
    date, _, frac = value.rstrip("Z").partition(".")
    return f"{date}.{(frac + '000')[:3]}Z"


class JobSpec(BaseModel):
    """The body of ``POST /api/jobs/{namespace}`` as `_create_job_spec` builds it. Unknown fields are refused, so a
    field the SDK starts sending fails the contract test instead of being silently dropped."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    command: list[str]
    arguments: list[str] = []
    environment: dict[str, Any] = {}
    flavor: str = "cpu-basic"
    secrets: dict[str, Any] | None = None
    timeout_seconds: int | None = Field(None, alias="timeoutSeconds")
    attempts: int | None = None
    labels: dict[str, str] | None = None
    volumes: list[dict[str, Any]] | None = None
    expose: dict[str, list[int]] | None = None
    ssh: dict[str, Any] | None = None
    network: dict[str, Any] | None = None
    resource_group_id: str | None = Field(None, alias="resourceGroupId")
    docker_image: str | None = Field(None, alias="dockerImage")
    space_id: str | None = Field(None, alias="spaceId")


class JobRecord(BaseModel):
    """What the emulator keeps of a job in ``<state>/jobs/<id>.json``: no secret values, only their names."""

    id: str
    spec: dict[str, Any]  # JobSpec by alias, secrets replaced by their names
    sandbox: bool
    port: int
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    launched: bool = False
    stage: Stage | None = None  # set once terminal (or for a failed launch); else derived from docker
    message: str | None = None


async def docker(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str, str]:
    """Run the docker CLI; (returncode, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        DOCKER, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, "", f"docker {args[0]} timed out after {timeout:.0f}s"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def is_sandbox(spec: JobSpec) -> bool:
    """A job the SDK's sandbox bootstrap started (it runs our server instead of the pinned binary)."""
    return "SBX_SERVER_SHA256" in spec.environment and "SBX_PORT" in spec.environment


class Emulator:
    """Job lifecycle over docker, with state in ``state_dir`` (made by ``run.prepare_state``)."""

    def __init__(self, state_dir: Path, domain: str, token: str) -> None:
        self.state, self.domain, self.token = state_dir, domain, token
        self.instance = (state_dir / "instance").read_text().strip()
        self.ids = [m.group(1) for m in re.finditer(r"^127\.0\.0\.1 ([0-9a-f]{24})--", self.hosts_text(), re.M)]
        (state_dir / "jobs").mkdir(exist_ok=True)
        self.records: dict[str, JobRecord] = {}
        for path in (state_dir / "jobs").glob("*.json"):
            record = JobRecord.model_validate_json(path.read_text())
            self.records[record.id] = record
        self.locks: dict[str, asyncio.Lock] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.tls = ssl.create_default_context(cafile=str(state_dir / "tls" / "ca.pem"))

    def hosts_text(self) -> str:
        return (self.state / "hosts").read_text()

    def lock(self, job_id: str) -> asyncio.Lock:
        return self.locks.setdefault(job_id, asyncio.Lock())

    def save(self, record: JobRecord) -> None:
        path = self.state / "jobs" / f"{record.id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(record.model_dump_json())
        os.replace(tmp, path)

    def container(self, job_id: str) -> str:
        return f"hfemu-{job_id}"

    def host(self, job_id: str) -> str:
        return f"{job_id}--{SERVER_PORT}.{self.domain}"

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> JobRecord:
        free = next((i for i in self.ids if i not in self.records), None)
        if free is None:
            raise HTTPException(429, f"the emulator's {len(self.ids)} pre-allocated job ids are all used")
        busy = {r.port for r in self.records.values() if r.stage is None}
        port = next(p for p in iter(free_port, None) if p not in busy)
        saved = spec.model_dump(by_alias=True, exclude_none=True)
        if spec.secrets:
            saved["secrets"] = sorted(spec.secrets)
        record = JobRecord(id=free, spec=saved, sandbox=is_sandbox(spec), port=port, created_at=now_iso())
        self.records[free] = record
        self.save(record)
        self.spawn(self.launch(record, spec))
        return record

    def fail(self, record: JobRecord, stage: Stage, message: str | None) -> None:
        record.stage, record.message, record.finished_at = stage, message, record.finished_at or now_iso()
        self.save(record)

    async def launch(self, record: JobRecord, spec: JobSpec) -> None:
        image = spec.docker_image or f"hf.co/spaces/{spec.space_id}"
        async with self.lock(record.id):
            if record.stage is not None:  # canceled before it was scheduled
                return
            rc, _, err = await docker("image", "inspect", "--format", "{{.Id}}", image)
            if record.sandbox and not (self.state / "sandbox_server.py").is_file():
                self.fail(record, "ERROR", f"the emulator has no sandbox_server.py in {self.state}")
                return
            if rc != 0:
                self.fail(record, "ERROR", f"Failed to pull image '{image}': manifest unknown (image not found)")
                return
            values = {k: str(v) for k, v in {**spec.environment, **(spec.secrets or {})}.items()}
            bad = [k for k in values if not ENV_NAME.fullmatch(k) or k.startswith(("HFEMU_", "DOCKER_"))]
            if bad:
                self.fail(record, "ERROR", f"invalid environment variable name(s): {', '.join(sorted(bad))[:200]}")
                return
            argv = ["run", "-d", "--network", "host", "--name", self.container(record.id)]
            argv += ["--label", f"hfemu.instance={self.instance}", "--label", f"hfemu.job={record.id}"]
            values |= {"HFEMU_PORT": str(record.port), "HFEMU_JOB_ID": record.id}
            values["HFEMU_COMMAND"] = json.dumps(spec.command + spec.arguments)
            for name in values:
                argv += ["-e", name]  # the value travels in docker's environment, never in argv
            if record.sandbox:
                argv += ["--user", "0:0", "-v", f"{self.state / 'sandbox_server.py'}:/.hfemu/sandbox_server.py:ro"]
                argv += ["-v", f"{self.state / 'tls'}:/.hfemu/tls:ro", "--entrypoint", "/bin/sh", image, "-c"]
                argv.append('exec "$(command -v python3 || command -v python)" /.hfemu/sandbox_server.py')
            else:
                argv += ["--entrypoint", spec.command[0], image, *spec.command[1:], *spec.arguments]
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG")}
            rc, _, err = await docker(*argv, env={**env, **values})
            if rc != 0:
                await docker("rm", "-f", self.container(record.id))
                self.fail(record, "ERROR", f"the job's container failed to start: {err.strip()[-500:]}")
                return
            record.launched = True
            if not record.sandbox:
                record.started_at = now_iso()
            self.save(record)
        if record.sandbox:
            await self.wait_server(record)
        if spec.timeout_seconds:
            self.spawn(self.expire(record, spec.timeout_seconds))

    async def probe(self, record: JobRecord) -> bool:
        """Whether the job's server answers over TLS (any HTTP status; the certificate checked against the job's own
        hostname); the first answer makes the job RUNNING."""
        try:
            async with httpx.AsyncClient(verify=self.tls, timeout=2.0, trust_env=False) as client:
                url = f"https://127.0.0.1:{record.port}/health"
                await client.get(url, extensions={"sni_hostname": self.host(record.id)})
        except (httpx.HTTPError, ssl.SSLError, OSError):
            return False
        if record.started_at is None:
            record.started_at = now_iso()
            self.save(record)
        return True

    async def wait_server(self, record: JobRecord) -> None:
        """Poll the job's server until it answers, or its container stops."""
        while record.stage is None and not await self.probe(record):
            state = await self.inspect(record.id)
            if state is None or not state.get("Running"):
                return
            await asyncio.sleep(0.1)

    async def expire(self, record: JobRecord, timeout: int) -> None:
        created = datetime.strptime(record.created_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
        await asyncio.sleep(max(0.0, timeout - (datetime.now(UTC) - created).total_seconds()))
        if (await self.stage(record))[0] in ("SCHEDULING", "RUNNING"):
            self.fail(record, "ERROR", f"Job timeout: the job ran longer than its {timeout}s timeout")  # then kill:
            await docker("kill", self.container(record.id))  # its exit code must not be taken for the reason

    async def cancel(self, record: JobRecord) -> None:
        async with self.lock(record.id):
            if (await self.stage(record))[0] in TERMINAL:
                return
            if record.launched:  # keep its logs: the container goes, `fetch_job_logs` still answers
                with (self.state / "jobs" / f"{record.id}.log").open("wb") as f:
                    name = self.container(record.id)
                    p = await asyncio.create_subprocess_exec(DOCKER, "logs", "--timestamps", name, stdout=f, stderr=f)
                    await p.wait()
            self.fail(record, "CANCELED", None)  # before the container goes: never seen as vanished
            if record.launched:
                await docker("rm", "-f", self.container(record.id))

    async def remove_all(self) -> list[str]:
        """Remove every container of this emulator instance; jobs still live become CANCELED. Returns the names."""
        _, out, _ = await docker("ps", "-aq", "--filter", f"label=hfemu.instance={self.instance}")
        ids = out.split()
        if ids:
            await docker("rm", "-f", *ids)
        for record in self.records.values():
            if record.stage is None:
                self.fail(record, "CANCELED", "the emulator shut down")
        return ids

    # -- state -------------------------------------------------------------------------------------------------
    async def inspect(self, job_id: str) -> dict[str, Any] | None:
        return (await self.states([job_id])).get(job_id)

    async def states(self, job_ids: list[str]) -> dict[str, dict[str, Any]]:
        """``docker inspect``'s State of each job's container, in one call; a job without a container is absent."""
        if not job_ids:
            return {}
        names = [self.container(i) for i in job_ids]
        _, out, _ = await docker("inspect", "--type", "container", "--format", "{{.Name}} {{json .State}}", *names)
        found = (line.partition(" ") for line in out.splitlines() if line.startswith("/hfemu-"))
        return {name.removeprefix("/hfemu-"): json.loads(state) for name, _, state in found}

    async def stage(self, record: JobRecord, batch: dict[str, Any] | None = None) -> tuple[Stage, str | None]:
        """The job's stage now (and its message), from the record when it is final, else from docker (``batch``:
        states from `states` for many jobs at once)."""
        if record.stage is not None:
            return record.stage, record.message
        if not record.launched:
            return "SCHEDULING", None
        state = batch.get(record.id) if batch is not None else await self.inspect(record.id)
        if state is None:
            self.fail(record, "ERROR", "the job's container disappeared")
        elif state.get("Running"):  # a sandbox job is RUNNING once its server answers: no later than the SDK sees it
            ready = record.started_at is not None or (record.sandbox and await self.probe(record))
            return ("RUNNING" if ready else "SCHEDULING"), None
        elif state.get("Status") in ("exited", "dead"):
            code = int(state.get("ExitCode") or 0)
            record.finished_at = docker_time(state.get("FinishedAt"))
            if code == 0:
                self.fail(record, "COMPLETED", None)
            else:
                reason = " (killed: out of memory)" if state.get("OOMKilled") else ""
                self.fail(record, "ERROR", f"Job failed with exit code: {code}{reason}")
        else:
            return "SCHEDULING", None
        return await self.stage(record, batch)

    async def info(self, record: JobRecord, batch: dict[str, Any] | None = None) -> dict[str, Any]:
        """The JobInfo JSON the Hub returns (camelCase, as `JobInfo.__init__` reads it)."""
        stage, message = await self.stage(record, batch)
        spec = record.spec
        ports = (spec.get("expose") or {}).get("ports") or []
        urls = [f"https://{self.host(record.id)}:{record.port}"] if SERVER_PORT in ports else None
        urls = (urls or []) + [f"https://{record.id}--{p}.{self.domain}" for p in ports if p != SERVER_PORT]
        user = {"id": USER_ID, "name": USER_NAME}
        return {
            "id": record.id,
            "createdAt": record.created_at,
            "startedAt": record.started_at,
            "finishedAt": record.finished_at,
            "dockerImage": spec.get("dockerImage"),
            "spaceId": spec.get("spaceId"),
            "command": spec["command"],
            "arguments": spec.get("arguments", []),
            "environment": spec.get("environment", {}),
            "secrets": {name: None for name in spec.get("secrets", [])},
            "flavor": spec.get("flavor"),
            "labels": spec.get("labels"),
            "volumes": spec.get("volumes"),
            "timeoutSeconds": spec.get("timeoutSeconds"),
            "expose": spec.get("expose"),
            "status": {"stage": stage, "message": message, "exposeUrls": urls or None},
            "owner": {**user, "type": "user"},
            "initiator": {**user, "type": "user"},
        }

    async def logs(self, record: JobRecord, tail: int | None) -> AsyncIterator[bytes]:
        """Job logs as the Hub's SSE: ``data: {"data": line, "timestamp": t}`` events, then keep-alives while the
        job runs; the stream ends when the container stops (the SDK then checks the job's stage)."""

        def event(line: str) -> bytes:
            stamp, _, text = line.partition(" ")
            return f"data: {json.dumps({'data': text, 'timestamp': docker_time(stamp) or now_iso()})}\n\n".encode()

        waited = 0.0
        while not record.launched and record.stage is None:  # the Hub holds a scheduling job's stream open
            await asyncio.sleep(0.2)
            waited += 0.2
            if waited >= LOG_KEEPALIVE_S:
                waited = 0.0
                yield b": keep-alive\n\n"
        if not record.launched:
            return
        if tail is None:
            at = record.started_at or record.created_at
            yield f"data: {json.dumps({'data': f'===== Job started at {at} =====', 'timestamp': at})}\n\n".encode()
        saved = self.state / "jobs" / f"{record.id}.log"
        if saved.exists():
            lines = saved.read_text(errors="replace").splitlines()
            for line in lines[-tail:] if tail else lines:
                yield event(line)
            return
        argv = ["logs", "--timestamps", *(["--tail", str(tail)] if tail is not None else [])]
        live = record.stage is None
        proc = await asyncio.create_subprocess_exec(
            DOCKER, *argv, *(["--follow"] if live else []), self.container(record.id),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, limit=1 << 20,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(proc.stdout.readline(), LOG_KEEPALIVE_S)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                if not raw:
                    break
                yield event(raw.decode(errors="replace").rstrip("\n"))
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
