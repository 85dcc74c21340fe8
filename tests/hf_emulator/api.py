"""The HTTP face of the HF emulator: the Hub routes the huggingface_hub SDK calls (whoami, run/inspect/list/cancel
a job, its logs as SSE) over an `Emulator`, plus fault hooks under ``/_emulator/`` (same token; health is open)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .jobs import JOB_ID, MAX_SPEC_BYTES, USER_ID, USER_NAME, Emulator, JobRecord, JobSpec, docker


def create_app(emu: Emulator) -> FastAPI:
    """The FastAPI app: the Hub routes the SDK calls, plus ``/_emulator/…`` fault hooks (same token)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for record in emu.records.values():  # a restart: keep watching the jobs still starting
            if record.stage is None and record.launched and record.sandbox and not record.started_at:
                emu.spawn(emu.wait_server(record))
        yield
        for task in list(emu.tasks):
            task.cancel()
        removed = await emu.remove_all()
        print(f"hf-emulator: stopped, removed {len(removed)} container(s)", flush=True)

    app = FastAPI(lifespan=lifespan)

    @app.middleware("http")
    async def auth(request: Request, call_next: Any) -> Any:
        if request.url.path != "/_emulator/health":
            header = request.headers.get("authorization", "")
            if header != f"Bearer {emu.token}":
                error = "Invalid credentials in Authorization header" if header else "Unauthorized"
                return JSONResponse({"error": error}, status_code=401)
        return await call_next(request)

    def job(namespace: str, job_id: str) -> JobRecord:
        if namespace != USER_NAME:
            raise HTTPException(403, f"You don't have access to namespace '{namespace}'")
        record = emu.records.get(job_id) if JOB_ID.fullmatch(job_id) else None
        if record is None:
            raise HTTPException(404, f"Job {job_id} not found")
        return record

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)

    @app.get("/_emulator/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "instance": emu.instance, "jobs": len(emu.records)}

    @app.get("/api/whoami-v2")
    async def whoami() -> dict[str, Any]:
        token = {"displayName": "hfemu", "role": "write"}
        return {"type": "user", "id": USER_ID, "name": USER_NAME, "fullname": "HF emulator", "orgs": [],
                "auth": {"type": "access_token", "accessToken": token}}  # fmt: skip

    @app.post("/api/jobs/{namespace}")
    async def run_job(namespace: str, request: Request) -> dict[str, Any]:
        if namespace != USER_NAME:
            raise HTTPException(403, f"You don't have access to namespace '{namespace}'")
        body = await request.body()
        if len(body) > MAX_SPEC_BYTES:
            raise HTTPException(413, "job spec too large")
        try:
            spec = JobSpec.model_validate_json(body)
        except ValueError as e:
            raise HTTPException(400, f"invalid job spec: {e}") from e
        if (spec.docker_image is None) == (spec.space_id is None) or not spec.command:
            raise HTTPException(400, "a job needs a command and exactly one of dockerImage or spaceId")
        if (spec.docker_image or spec.space_id or "").startswith("-"):
            raise HTTPException(400, "invalid image name")
        return await emu.info(emu.submit(spec))

    @app.get("/api/jobs/{namespace}")
    async def list_jobs(
        namespace: str,
        stage: Annotated[list[str] | None, Query()] = None,
        label: Annotated[list[str] | None, Query()] = None,
    ) -> list[dict[str, Any]]:
        if namespace != USER_NAME:
            raise HTTPException(403, f"You don't have access to namespace '{namespace}'")
        wanted = dict(item.partition("=")[::2] for item in label or [])
        records = sorted(emu.records.values(), key=lambda r: r.created_at, reverse=True)
        labelled = [r for r in records if all((r.spec.get("labels") or {}).get(k) == v for k, v in wanted.items())]
        batch = await emu.states([r.id for r in labelled if r.stage is None and r.launched])
        infos = [await emu.info(record, batch) for record in labelled]
        return [info for info in infos if not stage or info["status"]["stage"] in stage]

    @app.get("/api/jobs/{namespace}/{job_id}")
    async def inspect_job(namespace: str, job_id: str) -> dict[str, Any]:
        return await emu.info(job(namespace, job_id))

    @app.post("/api/jobs/{namespace}/{job_id}/cancel")
    async def cancel_job(namespace: str, job_id: str) -> dict[str, Any]:
        record = job(namespace, job_id)
        await emu.cancel(record)
        return await emu.info(record)

    @app.get("/api/jobs/{namespace}/{job_id}/logs")
    async def job_logs(namespace: str, job_id: str, tail: int | None = Query(None, ge=0)) -> StreamingResponse:
        record = job(namespace, job_id)
        return StreamingResponse(emu.logs(record, tail), media_type="text/event-stream")

    @app.get("/_emulator/jobs")
    async def emulator_jobs() -> list[dict[str, Any]]:
        out = []
        batch = await emu.states([r.id for r in emu.records.values() if r.stage is None and r.launched])
        for record in emu.records.values():
            stage, message = await emu.stage(record, batch)
            out.append({"id": record.id, "stage": stage, "message": message, "sandbox": record.sandbox,
                        "labels": record.spec.get("labels") or {}, "container": emu.container(record.id)})  # fmt: skip
        return out

    @app.post("/_emulator/jobs/{job_id}/{action}")
    async def fault(job_id: str, action: Literal["kill", "pause", "unpause", "expire"]) -> dict[str, Any]:
        """kill: the job dies; pause: its server stops answering; expire: its idle timeout fires now (SIGUSR1)."""
        record = job(USER_NAME, job_id)
        argv = ("kill", "-s", "USR1") if action == "expire" else (action,)
        rc, _, err = await docker(*argv, emu.container(record.id))
        if rc != 0:
            raise HTTPException(409, f"docker {action} failed: {err.strip()[-300:]}")
        return {"id": job_id, "done": action, "stage": (await emu.stage(record))[0]}

    return app
