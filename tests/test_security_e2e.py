"""Security at rollout level: a real server process guarded by an access token and an admin key, a scripted agent
(the real Pi in real bubblewrap) that dumps everything it can see, hostile task rows loaded as a split.

- capture keys: unknown → 401; a rollout's own key (which the agent can read) → 401 once the rollout is over;
- admin routes without the admin key → 401, run_rollout without the access token → refused;
- shell metacharacters in instance ids, repo names, commits, repo sources, test names and test file names: inert;
- oversized payloads → 413; path traversal through the file-backed APIs (results, capture exports) refused;
- no secret (admin key, access token, engine API key, capture key) in sandbox argv or environment, server logs,
  results or tool schemas — searched for by value.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from leaks import descendants

from swe_gym_env.core.procs import wait_healthy
from swe_gym_env.tasks.catalog import BUNDLED_DIR
from swe_gym_env.tasks.loaders import load_tasks
from swe_gym_env.wire import RolloutResult

from helpers import Stack, full_turns

pytestmark = [pytest.mark.anyio, pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("need_pi")]

TOKEN = "acc-e2e-6b1d0f7c2a9e4d3b"
ADMIN = "adm-e2e-91c4e8a0f2d64b7a"
ENGINE_KEY = "eng-e2e-3f5a7c9e1b2d4f6a"
SERVER_SECRETS = (TOKEN, ADMIN, ENGINE_KEY)
INJECTED = "INJ-" + str(6 * 7)  # what a shell would print for `echo INJ-$((6*7))`
INJECT = "`echo INJ-$((6*7))`;$(echo INJ-$((6*7)))|echo INJ-$((6*7))&"
HOSTILE_FILE = f"tests/data {INJECT}.txt"
DUMP = (
    "echo KEYFILE; cat /home/agent/.capture.env; echo ENV; env | sort; echo MODELS; "
    "cat /home/agent/.pi/agent/models.json; echo ARGV; "
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done; sleep 3"
)


class LoggedStack(Stack):
    """Stack whose processes write their output to one log file we can search."""

    def __init__(self, *args, log: Path, **kwargs) -> None:
        self.log = log
        super().__init__(*args, **kwargs)

    def _start(self, argv, health):
        with self.log.open("ab") as out:
            p = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        wait_healthy(health, p)
        return p


def hostile_split(path: Path, marker: Path) -> Path:
    base = json.loads((BUNDLED_DIR / "tasks.jsonl").read_text().splitlines()[0])
    base["repo_source"] = str(BUNDLED_DIR / base["repo_source"])
    test_patch = base["test_patch"] + (
        f"diff --git a/{HOSTILE_FILE} b/{HOSTILE_FILE}\nnew file mode 100644\n--- /dev/null\n"
        f"+++ b/{HOSTILE_FILE}\n@@ -0,0 +1 @@\n+data\n"
    )
    touch = f"touch {marker}"
    rows = [
        {**base, "instance_id": f"x;{touch}"},
        {**base, "instance_id": "bad-repo", "repo": f"a/b;{touch}"},
        {**base, "instance_id": "bad-commit", "base_commit": f"3ef781a;{touch}"},
        {**base, "instance_id": "bad-test-newline", "FAIL_TO_PASS": [f"t.py::x\n{touch}"]},
        {**base, "instance_id": "ext-source", "repo_source": f"ext::sh -c {touch.replace(' ', '% ')}"},
        {**base, "instance_id": "option-source", "repo_source": f"--upload-pack={touch}"},
        {
            **base,
            "instance_id": "hostile-tests",
            "test_patch": test_patch,
            "FAIL_TO_PASS": [*base["FAIL_TO_PASS"], f"tests/test_chunks.py::test_x[{INJECT}]"],
            "PASS_TO_PASS": [*base["PASS_TO_PASS"], f"{HOSTILE_FILE}::{INJECT}"],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    marker = tmp / "PWNED"
    script = tmp / "script.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "bash", "arguments": {"command": DUMP}}]}]))
    env = {
        "SWE_GYM_DATA_DIR": str(tmp / "data"),
        "SWE_GYM_DATASETS": f"hostile={hostile_split(tmp / 'hostile.jsonl', marker)}",
        "SWE_GYM_ACCESS_TOKEN": TOKEN,
        "SWE_GYM_ADMIN_KEY": ADMIN,
        "SWE_GYM_ENGINE_API_KEY": ENGINE_KEY,
        "SWE_GYM_MAX_REQUEST_BYTES": str(1024 * 1024),
        "SWE_GYM_RATE_LIMIT_PER_MIN": "0",
        "SWE_GYM_UI": "0",
    }
    stack = LoggedStack(f"script:{script}", env=env, log=tmp / "server.log")
    stack.marker, stack.tmp = marker, tmp
    stack.base = f"http://127.0.0.1:{stack.server_port}"
    try:
        yield stack
    finally:
        stack.stop()


def client(srv, token: str | None = TOKEN) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(StreamableHttpTransport(srv.mcp_url, headers=headers), timeout=600)


async def run_rollout(srv, token: str | None = TOKEN, **fields) -> RolloutResult:
    async with asyncio.timeout(fields.get("deadline_s", 300) + 120), client(srv, token) as c:
        args = {"harness": "pi", "result_form": "compact", **fields}  # the whole result (fits: a short rollout)
        res = await c.call_tool("run_rollout", args, raise_on_error=False, timeout=600)
    assert not res.is_error, res.content
    return RolloutResult.model_validate(res.structured_content)


def admin(token: str | None = ADMIN) -> dict:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture(scope="module")
def dumped(srv):
    """One rollout whose agent dumps its key file, environment, Pi's config and every process's argv, while the
    test watches the host's process table for secrets in the argv of anything the server started."""
    seen_argv: list[str] = []

    async def go():
        task = asyncio.create_task(run_rollout(srv, deadline_s=300))
        while not task.done():
            seen_argv.extend(descendants(srv.server.pid).values())
            await asyncio.sleep(0.1)
        return await task

    result = asyncio.run(go())
    return result, seen_argv


# -- capture keys and admin routes ----------------------------------------------------------------------------
def test_the_agent_run_is_ok_and_saw_its_own_capture_key(dumped):
    result, seen_argv = dumped
    assert result.ok, result.error
    assert len(result.turns) == 2
    assert any("bwrap" in a for a in seen_argv), "the watcher never saw the sandbox running"


def test_a_capture_key_is_useless_after_its_rollout_and_unknown_keys_are_refused(srv, dumped):
    result, _ = dumped
    keys = set(re.findall(r"sgk-[A-Za-z0-9_-]{20,}", json.dumps(full_turns(result)[-1].request)))
    assert len(keys) == 1, "the agent's dump should show its capture key"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for key in (*keys, "sgk-unknown", ADMIN, TOKEN):
        r = httpx.post(f"{srv.base}/capture/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 401, (key[:8], r.text)
    assert "unknown or closed capture key" in r.text


def test_admin_routes_need_the_admin_key(srv, dumped):
    result, _ = dumped
    sid = result.capture_session_id
    for path in ("/capture/sessions", f"/capture/sessions/{sid}", f"/capture/sessions/{sid}/export"):
        for headers in ({}, admin("wrong"), admin(TOKEN)):
            assert httpx.get(srv.base + path, headers=headers).status_code in (401, 403), (path, headers)
        assert httpx.get(srv.base + path, headers=admin()).status_code == 200, path
    assert httpx.post(f"{srv.base}/capture/sessions", json={}, headers=admin(TOKEN)).status_code in (401, 403)
    assert httpx.delete(f"{srv.base}/capture/sessions/{sid}").status_code in (401, 403)


async def test_run_rollout_without_the_access_token_is_refused_before_anything_runs(srv):
    for token in (None, "wrong", ENGINE_KEY):
        result = await run_rollout(srv, token=token)
        assert not result.ok and result.phase == "validate" and "access token required" in result.error
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{srv.base}/health")).json()["rollouts_in_flight"] == 0


# -- secrets, searched for by value ---------------------------------------------------------------------------
def test_no_server_secret_reaches_the_sandbox_results_or_argv(srv, dumped):
    result, seen_argv = dumped
    everything = result.model_dump_json()
    dump = json.dumps(full_turns(result)[-1].request)
    assert "SWE_GYM_CAPTURE_KEY=" in dump and "PI_CODING_AGENT_DIR" in dump  # the dump ran
    assert "swe_gym_env.cli serve" not in dump  # inside its own pid namespace: the host's processes are hidden
    for secret in SERVER_SECRETS:
        assert secret not in everything, "a server secret is in the result (sandbox env/argv/files or trace)"
        assert not [a for a in seen_argv if secret in a], "a server secret is in a sandbox process's argv"
    assert not [a for a in seen_argv if "sgk-" in a], "the capture key is in a process's argv"
    stored = "".join(p.read_text() for p in (srv.tmp / "data" / "results").glob("*.json"))
    assert stored and not [s for s in SERVER_SECRETS if s in stored]


def test_no_secret_in_server_logs(srv, dumped):
    result, _ = dumped
    key = re.findall(r"sgk-[A-Za-z0-9_-]{20,}", json.dumps(full_turns(result)[-1].request))[0]
    log = srv.log.read_text(errors="replace")
    for secret in (*SERVER_SECRETS, key):
        assert secret not in log


async def test_no_secret_in_tool_schemas_or_public_routes(srv):
    async with client(srv) as c:
        tools = [t.model_dump(mode="json") for t in await c.list_tools()]
    public = [json.dumps(tools)]
    async with httpx.AsyncClient() as http:
        for path in ("/health", "/metadata", "/schema"):
            r = await http.get(srv.base + path)
            if r.status_code == 200:
                public.append(r.text)
    text = "".join(public)
    assert "run_rollout" in text
    for secret in SERVER_SECRETS:
        assert secret not in text


# -- hostile task rows ----------------------------------------------------------------------------------------
def test_hostile_rows_are_refused_at_load(srv):
    report = load_tasks(str(srv.tmp / "hostile.jsonl"))
    loaded = {t.instance_id for t in report.tasks}
    assert loaded == {"ext-source", "option-source", "hostile-tests"}, report.skipped
    assert len(report.skipped) == 4 and all("row" in s for s in report.skipped)


async def test_metacharacters_in_request_fields_are_inert(srv):
    for fields in (
        {"split": "hostile", "instance_id": f"x;touch {srv.marker}"},
        {"split": f"hostile;touch {srv.marker}"},
        {"split": "hostile", "instance_id": "bad-commit"},
    ):
        result = await run_rollout(srv, **fields)
        assert not result.ok and result.phase == "task", result.error
    result = await run_rollout(srv, rollout_id=f"abcdefgh;touch {srv.marker}")
    assert not result.ok and result.phase == "validate" and "invalid arguments" in result.error
    assert not srv.marker.exists()


@pytest.mark.parametrize("instance_id", ["ext-source", "option-source"])
async def test_a_repo_source_cannot_run_commands(srv, instance_id):
    result = await run_rollout(srv, split="hostile", instance_id=instance_id, deadline_s=120)
    assert not result.ok and result.phase == "boot" and result.reward is None, result.error
    assert not srv.marker.exists(), "the repo source ran a command on the host"


async def test_metacharacters_in_test_names_and_test_files_are_inert(srv):
    result = await run_rollout(srv, split="hostile", instance_id="hostile-tests", deadline_s=300)
    assert result.ok, result.error
    assert result.reward == 0.0 and result.grading is not None  # graded; the hostile test names are missing
    log = result.grading.log_tail
    assert "Start Test Output" in log and INJECTED not in log
    assert not srv.marker.exists() and INJECTED not in result.model_dump_json()


# -- sizes and paths ------------------------------------------------------------------------------------------
def test_oversized_payloads_get_413(srv):
    big = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","pad":"' + b"x" * (2 * 1024 * 1024) + b'"}'
    headers = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    assert httpx.post(f"{srv.base}/mcp", content=big, headers=headers).status_code == 413
    r = httpx.post(f"{srv.base}/capture/sessions", content=b"{" + b" " * (100 * 1024) + b"}", headers=admin())
    assert r.status_code == 413


async def test_path_traversal_through_file_backed_apis_is_refused(srv, dumped):
    result, _ = dumped
    victim = srv.tmp / "victim.json"  # a valid result file outside the results dir
    victim.write_text(result.model_copy(update={"rollout_id": "victim", "error": "NOT-FOR-YOU"}).model_dump_json())
    results_dir = srv.tmp / "data" / "results"
    rel = "../" * len(results_dir.parts) + str(victim.with_suffix(""))[1:]
    up = "../../victim"
    async with client(srv) as c:
        for rid in (up, rel, "..", "."):
            res = await c.call_tool("get_rollout", {"rollout_id": rid}, raise_on_error=False)
            assert res.is_error and "NOT-FOR-YOU" not in str(res.content), rid
    async with httpx.AsyncClient() as http:
        for path in (
            "/rollouts/..%2F..%2Fvictim",
            "/rollouts/%2e%2e%2f%2e%2e%2fvictim",
            "/capture/sessions/..%2Fx/export",
        ):
            r = await http.get(srv.base + path, headers=admin())
            assert r.status_code == 404 and "NOT-FOR-YOU" not in r.text, path
