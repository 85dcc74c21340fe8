"""Deploying to a Space: `push` (dry run pinned; a recording fake of huggingface_hub that refuses any call or argument
the real HfApi lacks), the OpenEnv manifest, the image (built with a real Docker engine where one runs, /health
answered), and `serve --vllm-model` with the CPU build of vLLM."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import BASE_IMAGE, docker_ready, require
from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoUrl, SpaceInfo

from swe_gym_env.cli import free_port
from swe_gym_env.space_app import push as push_mod
from swe_gym_env.space_app.push import push
from swe_gym_env.trace.forms import request_of

REPO = Path(__file__).resolve().parent.parent
SECRETS = {
    "SWE_GYM_ACCESS_TOKEN": "tok-SECRET-111",
    "SWE_GYM_ADMIN_KEY": "adm-SECRET-222",
    "SWE_GYM_ENGINE_API_KEY": "ek-SECRET-333",
    "HF_TOKEN": "hf_SECRET444",
}
CONFIG = {"SWE_GYM_ENGINE_URL": "https://engine.example.com/v1", "SWE_GYM_ENGINE_MODEL": "Qwen/Qwen3-8B"}


class RecordingHfApi:
    """Records calls; any method or keyword the real ``HfApi`` lacks fails (the contract against drift)."""

    def __init__(self, private: bool = False) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.uploaded: dict[str, bytes] = {}
        self.private = private

    def __getattr__(self, name: str):
        real = getattr(HfApi, name, None)
        if real is None or name.startswith("_"):
            raise AttributeError(f"HfApi has no method {name!r}")
        signature = inspect.signature(real)

        def call(*args, **kwargs):
            signature.bind(self, *args, **kwargs)  # TypeError on any argument the real method does not take
            self.calls.append((name, kwargs))
            if name == "create_repo":
                return RepoUrl(f"https://huggingface.co/spaces/{kwargs['repo_id']}")
            if name == "space_info":
                return SpaceInfo(id=kwargs["repo_id"], private=self.private)
            if name == "upload_folder":
                root = Path(kwargs["folder_path"])
                self.uploaded = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
            return None

        return call


def test_fake_rejects_what_the_real_api_lacks():
    api = RecordingHfApi()
    with pytest.raises(AttributeError):
        api.add_space_secrets(repo_id="a/b")
    with pytest.raises(TypeError):
        api.add_space_secret(repo_id="a/b", key="K", value="v", private=True)
    assert "private" in SpaceInfo.__dataclass_fields__  # what push reads from space_info


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small project tree (no git: the plain walk) so the pinned output does not move with the repo."""
    (tmp_path / "space_app").mkdir()
    (tmp_path / "space_app" / "README.md").write_text("---\nsdk: docker\napp_port: 8000\n---\n# Space\n")
    (tmp_path / "space_app" / "start.sh").write_text("exec swe-gym-env serve\n")
    (tmp_path / "README.md").write_text("# project\n")
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("assert True\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "big").write_text("x")
    return tmp_path


PINNED = """\
dry run: nothing is sent
push to Space me/gym: 11 calls, 4 files
create_repo(repo_id='me/gym', repo_type='space', space_sdk='docker', private=False, exist_ok=True)
space_info(repo_id='me/gym')
add_space_secret(repo_id='me/gym', key='SWE_GYM_ACCESS_TOKEN', value='<redacted>', \
description='needed to start work (run_rollout, /ws, UI runs)')
add_space_secret(repo_id='me/gym', key='SWE_GYM_ADMIN_KEY', value='<redacted>', description='admin routes')
add_space_secret(repo_id='me/gym', key='SWE_GYM_ENGINE_API_KEY', value='<redacted>', \
description="the default engine's API key")
add_space_secret(repo_id='me/gym', key='HF_TOKEN', value='<redacted>', description='creates HF Sandboxes (billable)')
add_space_variable(repo_id='me/gym', key='SWE_GYM_ENGINE_MODEL', value='Qwen/Qwen3-8B')
add_space_variable(repo_id='me/gym', key='SWE_GYM_ENGINE_URL', value='https://engine.example.com/v1')
add_space_variable(repo_id='me/gym', key='SWE_GYM_MAX_ROLLOUTS', value='4')
upload_folder(repo_id='me/gym', repo_type='space', folder_path='<staged folder>', \
commit_message='swe-gym-env push', delete_patterns=['*'])
  + Dockerfile (7 bytes)
  + README.md (59 bytes)
  + space_app/README.md (43 bytes)
  + space_app/start.sh (23 bytes)
request_space_hardware(repo_id='me/gym', hardware='t4-small')"""


def test_push_dry_run_output_is_pinned_and_redacted(tree):
    lines: list[str] = []
    rc = push(
        "me/gym",
        dry_run=True,
        hardware="t4-small",
        hf_sandboxes=True,
        extra_vars=["SWE_GYM_MAX_ROLLOUTS=4"],
        env={**SECRETS, **CONFIG},
        root=tree,
        log=lines.append,
    )
    out = "\n".join(lines)
    assert rc == 0
    assert out == PINNED
    assert not any(v in out for v in SECRETS.values())


def test_push_sends_exactly_the_plan(tree):
    api = RecordingHfApi()
    lines: list[str] = []
    rc = push("me/gym", hardware="t4-small", env={**SECRETS, **CONFIG}, root=tree, api=api, log=lines.append)
    assert rc == 0, lines
    names = [n for n, _ in api.calls]
    assert names == ["create_repo", "space_info"] + ["add_space_secret"] * 3 + ["add_space_variable"] * 2 + [
        "upload_folder",
        "request_space_hardware",
    ]
    create = api.calls[0][1]
    assert create["space_sdk"] == "docker" and create["repo_type"] == "space" and create["private"] is False
    sent = {k["key"]: k["value"] for n, k in api.calls if n == "add_space_secret"}
    assert sent == {k: SECRETS[k] for k in ("SWE_GYM_ACCESS_TOKEN", "SWE_GYM_ADMIN_KEY", "SWE_GYM_ENGINE_API_KEY")}
    assert "HF_TOKEN" not in sent  # only with --hf-sandboxes
    variables = {k["key"]: k["value"] for n, k in api.calls if n == "add_space_variable"}
    assert variables == CONFIG
    assert sorted(api.uploaded) == ["Dockerfile", "README.md", "space_app/README.md", "space_app/start.sh"]
    readme = api.uploaded["README.md"].decode()
    assert readme.startswith("---\nsdk: docker\napp_port: 8000\n---\n") and readme.endswith("# project\n")
    assert not any(v in "\n".join(lines) for v in SECRETS.values())


def test_push_generates_an_access_token_into_a_private_file(tree, tmp_path, monkeypatch):
    monkeypatch.setenv("SWE_GYM_ENV_HOME", str(tmp_path / "home"))
    api = RecordingHfApi()
    lines: list[str] = []
    assert push("me/gym", env={}, root=tree, api=api, log=lines.append) == 0
    token = next(k["value"] for n, k in api.calls if n == "add_space_secret" and k["key"] == "SWE_GYM_ACCESS_TOKEN")
    saved = push_mod.token_file("me/gym")
    assert saved.read_text().strip() == token and len(token) >= 40
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert token not in "\n".join(lines)
    open_api = RecordingHfApi()
    assert push("me/gym", open_access=True, env={}, root=tree, api=open_api, log=lines.append) == 0
    assert not [k for n, k in open_api.calls if n == "add_space_secret"]


def test_push_refuses_a_private_space_that_sandboxes_must_reach(tree):
    lines: list[str] = []
    api = RecordingHfApi()
    env = {**SECRETS}
    assert push("me/gym", private=True, hf_sandboxes=True, env=env, root=tree, api=api, log=lines.append) == 2
    assert api.calls == [] and "cannot send a private Space's auth header" in lines[-1]
    # an existing Space that turns out to be private: refused before any secret is sent
    api = RecordingHfApi(private=True)
    assert push("me/gym", hf_sandboxes=True, env=env, root=tree, api=api, log=lines.append) == 2
    assert [n for n, _ in api.calls] == ["create_repo", "space_info"] and "private Space" in lines[-1]
    # private without remote sandboxes is fine: the local sandbox reaches /capture through a unix socket
    api = RecordingHfApi(private=True)
    assert push("me/gym", private=True, env=env, root=tree, api=api, log=lines.append) == 0


@pytest.mark.parametrize("pair", ["SWE_GYM_ADMIN_KEY=x", "MY_API_TOKEN=x", "HF_TOKEN=x", "no-equals", "1BAD=x"])
def test_push_refuses_credentials_or_junk_on_the_command_line(tree, pair):
    lines: list[str] = []
    assert push("me/gym", dry_run=True, extra_vars=[pair], env={}, root=tree, log=lines.append) == 2
    assert lines[-1].startswith("push refused:")


def test_push_cli_dry_run_on_this_repo():
    env = {**os.environ, **SECRETS, **CONFIG}
    out = subprocess.run(
        [str(REPO / ".venv/bin/swe-gym-env"), "push", "--repo-id", "me/gym", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    files = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("  + ")}
    assert {"Dockerfile", "README.md", "uv.lock", "pyproject.toml", "openenv.yaml", "space_app/start.sh"} <= files
    assert "server/app.py" in files and not any(f.startswith(("tests/", ".venv", ".git/")) for f in files)
    assert not any(v in out.stdout + out.stderr for v in SECRETS.values())


# -- the manifest and the image definition -----------------------------------------------------------------------
def test_openenv_yaml_fields():
    m = yaml.safe_load((REPO / "openenv.yaml").read_text())
    assert m["spec_version"] == 1 and m["name"] == "swe_gym_env" and m["type"] == "space"
    assert m["runtime"] == "fastapi" and m["app"] == "swe_gym_env.asgi:app"
    module, attr = m["app"].split(":")
    assert re.search(rf"^{attr} = ", (REPO / "asgi.py").read_text(), re.M) and module.endswith(".asgi")
    front = yaml.safe_load((REPO / "space_app" / "README.md").read_text().split("---")[1])
    assert front["sdk"] == "docker" and "openenv" in front["tags"]
    assert m["port"] == front["app_port"] == 8000
    assert re.search(r"^EXPOSE 8000$", (REPO / "Dockerfile").read_text(), re.M)
    from swe_gym_env.server.mcp_tools import build_mcp
    from swe_gym_env.tasks.catalog import bundled_tasks

    caps = m["validation"]["capabilities"]
    assert caps["declared_task_count"] == {"bundled": len(bundled_tasks())}
    import asyncio

    tools = asyncio.run(build_mcp(service=None).list_tools())  # type: ignore[arg-type]
    assert sorted(caps["declared_tools"]) == sorted(t.name for t in tools)


def test_openenv_yaml_parses_with_openenvs_own_validator():
    py = REPO / ".openenv-venv" / "bin" / "python"
    require(py.is_file(), "OpenEnv venv missing: run `bash scripts/setup_openenv.sh`")
    code = (
        "import sys, json; from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser; "
        "m = OpenEnvYamlParser().parse(sys.argv[1]); print(json.dumps(m.model_dump(mode='json')))"
    )
    out = subprocess.run([str(py), "-c", code, str(REPO)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    manifest = json.loads(out.stdout)
    assert manifest["name"] == "swe_gym_env" and manifest["reward"]["range"] == [0.0, 1.0]
    assert manifest["capabilities"]["task_api"] is True


def test_dockerfile_rules():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim", text, re.M) and "FROM ${BASE}" in text
    assert "useradd --create-home --uid 1000 user" in text and re.search(r"^USER user$", text, re.M)
    assert text.count("uv sync --frozen --no-dev") == 2  # pinned from the lockfile, deps layer then project
    assert "HEALTHCHECK" in text and "/health" in text and "swe-gym-env setup" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", ".vllm-venv", "tests"} <= set(ignored)


def _stage_setup_sources(dest: Path) -> list[str]:
    """Copy what the Dockerfile's `COPY … ${SETUP_SRC}/…` lines copy into ``dest``/swe_gym_env, as docker does (a
    folder source copies its contents); returns the sources."""
    sources = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        m = re.fullmatch(r"COPY --chown=user (.+) \$\{SETUP_SRC\}(/\S*)", line)
        if not m:
            continue
        target = dest / "swe_gym_env" / m.group(2).strip("/")
        target.mkdir(parents=True, exist_ok=True)
        for src in m.group(1).split():
            sources.append(src)
            if src.endswith("/"):
                shutil.copytree(REPO / src, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(REPO / src, target)
    return sources


@pytest.mark.slow
def test_the_images_setup_layer_stages_every_module_setup_needs(tmp_path):
    """The Dockerfile runs `swe-gym-env setup --harness image` on the modules its COPY lines stage, before the rest of
    the code, so a code change elsewhere does not rebuild ~2 GB of bundles. Staged the same way, the command must run
    to its end and name the very bundles the whole package finds: a module the list misses fails here, not in a
    Space's build, and a staged setup that keyed its bundles differently would show here too."""
    from swe_gym_env.core.names import IMAGE_HARNESSES
    from swe_gym_env.server.agents.bundle import find_bundle
    from swe_gym_env.server.agents.registry import get_harness

    assert "setup --harness image" in (REPO / "Dockerfile").read_text()
    bundles = {name: find_bundle(get_harness(name)) for name in IMAGE_HARNESSES}
    require(all(bundles.values()), "not every harness is bundled: run `swe-gym-env setup --all`")
    sources = _stage_setup_sources(tmp_path)
    assert "server/agents/" in sources and "cli.py" in sources
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    code = "import runpy, sys, swe_gym_env; print('FROM', swe_gym_env.__file__, flush=True); "
    code += "sys.argv = ['swe-gym-env', 'setup', '--harness', 'image']; "
    code += "runpy.run_module('swe_gym_env.cli', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"FROM {tmp_path}/swe_gym_env/__init__.py" in r.stdout  # the staged copy ran, not the checkout
    named = dict(re.findall(r"^setup: (\S+) [^:]+: bundle (\S+) ", r.stdout, re.M))
    assert named == {name: str(b.path) for name, b in bundles.items() if b}, r.stdout


# -- the image, built and run with a real Docker engine --------------------------------------------------------
@pytest.mark.integration
@pytest.mark.slow
def test_space_image_builds_and_answers_health(space_image):
    port = free_port()
    name = f"swe-gym-space-test-{port}"
    run = subprocess.run(
        ["docker", "run", "-d", "--name", name, "--network", "host", "-e", f"PORT={port}", space_image],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    try:
        deadline, health = time.monotonic() + 120, None
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(1)
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True).stdout
        assert health is not None and health.status_code == 200, logs[-3000:]
        assert health.json()["status"] == "healthy"
        # no secret, on all interfaces (a Space duplicated in the browser): locked, saying which secret to set
        assert (
            health.json()["access"]["mode"] == "locked" and "SWE_GYM_ACCESS_TOKEN" in health.json()["access"]["notice"]
        )
        uid = subprocess.run(["docker", "exec", name, "id", "-u"], capture_output=True, text=True, timeout=120)
        assert uid.stdout.strip() == "1000"
        tools = subprocess.run(
            [
                "docker",
                "exec",
                name,
                "sh",
                "-c",
                "node --version && bwrap --version && swe-gym-env --help >/dev/null && "
                "curl -fsS http://127.0.0.1:$PORT/health",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert tools.returncode == 0 and tools.stdout.startswith("v22."), tools.stderr
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


@pytest.mark.integration
@pytest.mark.slow
def test_hf_sandbox_image_has_no_agent_and_what_bundle_delivery_needs():
    """Agents reach HF sandboxes as bundles uploaded at boot (tests/test_agent_bundles.py runs that delivery): the
    image bakes none, has no Node, and lets its non-root user unpack and check a bundle."""
    require(docker_ready(), f"no docker daemon with {BASE_IMAGE}: run `bash scripts/setup_docker.sh`")
    image = "swe-gym-env/sandbox:test"
    argv = ["docker", "build", "--network", "host", "-f", str(REPO / "space_app" / "sandbox.Dockerfile")]
    argv += ["--build-arg", f"BASE={BASE_IMAGE}", "-t", image]
    build = subprocess.run([*argv, str(REPO / "space_app")], capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    script = (
        "id -u; command -v node || echo no-node; ls -A /opt/swe-gym-agent | wc -l; "
        "touch /opt/swe-gym-agent/x && rm /opt/swe-gym-agent/x && echo writable; "
        "for t in git tar gzip sha256sum python3; do command -v $t >/dev/null && echo $t; done"
    )
    run = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["1000", "no-node", "0", "writable", "git", "tar", "gzip", "sha256sum", "python3"]


# -- one Space, whole stack: `serve --vllm-model` with the CPU build of vLLM ----------------------------------
async def _train_rollout(mcp_url: str):
    from swe_gym_env.client.mcp_client import SweGymClient

    async with SweGymClient(mcp_url, timeout_s=600) as c:
        return await c.run_rollout(purpose="train", max_model_calls=2, max_tokens=48, deadline_s=400, seed=1)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.xdist_group("vllm")  # a real vLLM: one at a time, per run (tests/conftest.py)
def test_serve_vllm_model_makes_vllm_the_default_engine(tmp_path, need_pi):
    import asyncio

    from swe_gym_env.core.assets import TEMPLATE_PATH, tokenizer_dir

    from helpers import ME, MODEL

    vllm_python = REPO / ".vllm-venv" / "bin" / "python"
    model = tokenizer_dir()
    require(vllm_python.is_file(), f"{vllm_python} missing: run `bash scripts/setup_vllm.sh`")
    require((model / "model.safetensors").is_file(), f"SmolLM2 weights missing in {model}: run scripts/setup_vllm.sh")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWE_GYM_ENGINE_")}
    env.update(SWE_GYM_DATA_DIR=str(tmp_path), SWE_GYM_VLLM_PYTHON=str(vllm_python), HF_HUB_OFFLINE="1")
    env["TRANSFORMERS_OFFLINE"] = "1"
    # the server's and vLLM's temp folder, to see what they leave there (short: unix socket paths live in it)
    tmp = Path(tempfile.mkdtemp(prefix="sgt-", dir="/tmp"))
    env["TMPDIR"] = str(tmp)
    argv = [*ME, "serve", "--port", str(port), "--vllm-model", str(model), "--vllm-served-name", MODEL]
    argv += ["--vllm-chat-template", str(TEMPLATE_PATH), "--vllm-startup-timeout", "540"]
    argv += ["--vllm-args", "--dtype float32 --max-model-len 8192 --max-num-seqs 4 --enforce-eager"]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    vllm_url = None
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, log_path.read_text()[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        text = log_path.read_text()
        assert "--return-tokens-as-token-ids --logprobs-mode processed_logprobs --enable-auto-tool-choice" in text
        vllm_url = re.search(r"vLLM ready in [\d.]+ s at (http://127\.0\.0\.1:\d+)", text).group(1)
        result = asyncio.run(_train_rollout(f"http://127.0.0.1:{port}/mcp"))
        # purpose=train is refused unless certification found token ids with processed logprobs: vLLM's flags work
        assert result.phase != "validate", result.error
        assert result.capture_level == "tokens" and result.logprobs_mode == "processed", result
        assert result.turns and all(len(t.completion_token_ids) == len(t.logprobs) > 0 for t in result.turns)
        assert all(request_of(result, t.index)["model"] == MODEL for t in result.turns)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    if vllm_url:  # the server took its vLLM down with it
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{vllm_url}/health", timeout=2)
    # vLLM's ZMQ sockets (default: $TMPDIR/<uuid>) went into a folder of the launcher's, removed with it
    left = sorted(tmp.rglob("*"))
    sockets = [str(p) for p in left if p.is_socket() or "swe-gym-vllm-rpc-" in str(p)]
    shutil.rmtree(tmp, ignore_errors=True)
    assert not sockets, [str(p) for p in left]
