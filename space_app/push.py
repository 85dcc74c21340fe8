"""`swe-gym-env push --repo-id OWNER/NAME`: create or update a Docker Space running this server.

What it sends, in order (``--dry-run`` prints exactly this, secret values redacted, and sends nothing):
1. ``create_repo(repo_type="space", space_sdk="docker", exist_ok=True)``, then ``space_info`` to learn whether the
   Space is private: a private Space is refused when sandboxes outside it (HF Sandbox) must reach its /capture,
   because an agent in such a sandbox cannot send a private Space's auth header;
2. ``add_space_secret`` for each credential found in *this* process's environment (never from the command line):
   the access token (generated when missing, unless ``--open``), the admin key, the engine key, and with
   ``--hf-sandboxes`` an HF token for sandboxes;
3. ``add_space_variable`` for each configuration value (environment or ``--var KEY=VALUE``), and with ``--open``
   (no access token) ``SWE_GYM_OPEN_ACCESS=1``: a Space with no secret is otherwise locked (server/security.py);
4. ``upload_folder`` of the project (tracked files, without tests) with the Space README (front matter from
   space_app/README.md, then the project README) and ``delete_patterns=["*"]`` so the Space mirrors the project;
5. ``request_space_hardware`` when ``--hardware`` is given.

The project is read from a source checkout (``root``: ``--root``, else ``$SWE_GYM_CHECKOUT``, else the current directory
or a parent of it; see `swe_gym_env.core.procs.checkout_dir`), never from where this module happens to be installed.
The HF client is injected (``api``), so tests pass a recording fake checked against the real ``HfApi``.
"""

from __future__ import annotations

import os
import re
import secrets as pysecrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swe_gym_env.core import procs
from swe_gym_env.core.settings import describe, secret_names

REPO_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$"

# Space secrets: name on the Space -> where it comes from in this process's environment, and what it is for: every
# secret of the settings model (swe_gym_env/settings.py) the server reads (SWE_GYM_SPACE_HF_TOKEN is push's own: it
# becomes the Space's HF_TOKEN, below).
_SPACE_HF_TOKEN = "SWE_GYM_SPACE_HF_TOKEN"
_ON_THE_SPACE = {  # the description the Space shows beside the secret (else the setting's own)
    "SWE_GYM_ACCESS_TOKEN": "needed to start work (run_rollout, /ws, UI runs)",
    "SWE_GYM_ADMIN_KEY": "admin routes",
    "SWE_GYM_ENGINE_API_KEY": "the default engine's API key",
}
SECRETS: dict[str, tuple[tuple[str, ...], str]] = {
    r["name"]: ((r["name"],), _ON_THE_SPACE.get(r["name"]) or str(r["description"]))
    for r in sorted(describe(), key=lambda r: r["name"])
    if r["secret"] and r["name"] != _SPACE_HF_TOKEN
}
HF_SANDBOX_SECRET = ("HF_TOKEN", (_SPACE_HF_TOKEN, "HF_TOKEN"), "creates HF Sandboxes (billable)")
# Space variables taken from the environment when set (plain configuration, visible to anyone who can see them).
VARIABLES = (
    "SWE_GYM_ENGINE_URL",
    "SWE_GYM_ENGINE_MODEL",
    "SWE_GYM_ENGINE_URL_ALLOWLIST",
    "SWE_GYM_RATE_LIMIT_PER_MIN",
    "SWE_GYM_MAX_ROLLOUTS",
    "SWE_GYM_MAX_REQUEST_BYTES",
    "SWE_GYM_VLLM_MODEL",
    "SWE_GYM_VLLM_TOOL_PARSER",
    "SWE_GYM_PUBLIC_READS",  # 1: rollouts readable without the access token (server/security.py)
)
OPEN_VARIABLE = "SWE_GYM_OPEN_ACCESS"  # `--open`: a Space with no secret is open on purpose, not locked
SECRET_HINTS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
EXCLUDE_TOP = {"tests", ".github", ".ci", "artifacts", "build"}


class PushError(Exception):
    """A push refused before anything unsafe was sent (the message says why)."""


@dataclass
class Call:
    method: str
    kwargs: dict[str, Any]
    secret: bool = False  # redact kwargs["value"] when printing

    def render(self) -> str:
        shown = {k: ("<redacted>" if self.secret and k == "value" else v) for k, v in self.kwargs.items()}
        if "folder_path" in shown:
            shown["folder_path"] = "<staged folder>"
        return f"{self.method}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


@dataclass
class Plan:
    repo_id: str
    calls: list[Call]
    files: list[tuple[str, Path | bytes]]  # path in the Space -> local file or content
    needs_public: bool
    generated_token: str | None = None
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        out = [f"push to Space {self.repo_id}: {len(self.calls)} calls, {len(self.files)} files"]
        out += [f"note: {n}" for n in self.notes]
        for c in self.calls:
            out.append(c.render())
            if c.method == "upload_folder":
                for path, src in self.files:
                    size = len(src) if isinstance(src, bytes) else src.stat().st_size
                    out.append(f"  + {path} ({size} bytes)")
        return "\n".join(out)


def project_files(root: Path) -> list[str]:
    """The files a Space needs: git's tracked and unignored files (a plain walk without git), minus tests."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
        names = [n for n in out.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        names = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
        names = [n for n in names if not any(part.startswith(".") and part != ".dockerignore" for part in n.split("/"))]
    keep = []
    for n in sorted(set(names)):
        top = n.split("/", 1)[0]
        if top in EXCLUDE_TOP or "__pycache__" in n or n.endswith(".pyc") or not (root / n).is_file():
            continue
        keep.append(n)
    return keep


def space_readme(root: Path) -> bytes:
    """space_app/README.md (front matter: sdk docker, app_port, tags) followed by the project README."""
    head = (root / "space_app" / "README.md").read_text(encoding="utf-8").rstrip() + "\n"
    body = (root / "README.md").read_text(encoding="utf-8") if (root / "README.md").is_file() else ""
    return (head + ("\n---\n\n" + body if body else "")).encode()


def _parse_vars(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.replace("_", "").isalnum() or not key[0].isalpha():
            raise PushError(f"--var needs KEY=VALUE with a plain KEY, got {pair.split('=')[0]!r}")
        secret = key in SECRETS or key in secret_names() or key == HF_SANDBOX_SECRET[0]
        if secret or any(h in key.upper() for h in SECRET_HINTS):
            raise PushError(
                f"{key} looks like a credential: credentials never go on the command line (visible in `ps` and "
                f"shell history); export it in the environment and push sends it as a Space secret"
            )
        out[key] = value
    return out


def _check_request(repo_id: str, private: bool, hf_sandboxes: bool) -> None:
    if not re.match(REPO_ID_RE, repo_id):
        raise PushError(f"--repo-id must be OWNER/NAME, got {repo_id!r}")
    if private and hf_sandboxes:
        raise PushError(
            "refusing a private Space with --hf-sandboxes: agents in HF Sandboxes call this Space's /capture over "
            "its public URL and cannot send a private Space's auth header. The capture proxy itself refuses unknown "
            "keys (per-rollout keys, no open relay), so a public Space is safe for /capture; guard starting work "
            "with SWE_GYM_ACCESS_TOKEN instead"
        )


def _secret_calls(
    repo_id: str, env: dict[str, str], hf_sandboxes: bool, open_access: bool, token_factory: Callable[[], str]
) -> tuple[list[Call], list[str], str | None]:
    """The `add_space_secret` calls for the secrets the environment holds, the notes on those it does not, and the
    access token generated where none was given (unless --open)."""
    calls, notes = [], []
    generated = None
    table = dict(SECRETS)
    if hf_sandboxes:
        table[HF_SANDBOX_SECRET[0]] = HF_SANDBOX_SECRET[1:]
    for name, (sources, description) in table.items():
        value = next((env[s] for s in sources if env.get(s)), None)
        if value is None and name == "SWE_GYM_ACCESS_TOKEN" and not open_access:
            value = generated = token_factory()
            notes.append("no SWE_GYM_ACCESS_TOKEN in the environment: a new one is generated")
        if value is None:
            if name == "SWE_GYM_ACCESS_TOKEN":
                notes.append(f"--open: anyone may start rollouts on this Space ({OPEN_VARIABLE}=1 is set)")
            elif name == HF_SANDBOX_SECRET[0]:
                raise PushError("--hf-sandboxes needs an HF token in SWE_GYM_SPACE_HF_TOKEN or HF_TOKEN")
            continue
        kwargs = {"repo_id": repo_id, "key": name, "value": value, "description": description}
        calls.append(Call("add_space_secret", kwargs, secret=True))
    return calls, notes, generated


def _variable_calls(
    repo_id: str, env: dict[str, str], extra_vars: list[str], open_access: bool, has_token: bool
) -> list[Call]:
    """The `add_space_variable` calls, sorted by name: the environment's, --var's, and the openness flag."""
    variables = {k: env[k] for k in VARIABLES if env.get(k)}
    variables.update(_parse_vars(extra_vars))
    if open_access and not has_token:
        # openness asked for explicitly: without it, a Space with no secret refuses work (server/security.py)
        variables[OPEN_VARIABLE] = "1"
    return [
        Call("add_space_variable", {"repo_id": repo_id, "key": k, "value": variables[k]}) for k in sorted(variables)
    ]


def _staged_files(root: Path, files: list[str] | None) -> list[tuple[str, Path | bytes]]:
    """What the Space gets, by path: the project's files, with the Space's own README."""
    names = project_files(root) if files is None else files
    staged: list[tuple[str, Path | bytes]] = [(n, root / n) for n in names if n != "README.md"]
    staged.append(("README.md", space_readme(root)))
    staged.sort(key=lambda item: item[0])
    return staged


def build_plan(
    repo_id: str,
    *,
    env: dict[str, str],
    root: Path,
    hardware: str | None = None,
    private: bool = False,
    hf_sandboxes: bool = False,
    open_access: bool = False,
    extra_vars: list[str] | None = None,
    files: list[str] | None = None,
    token_factory: Callable[[], str] = lambda: pysecrets.token_urlsafe(32),
) -> Plan:
    _check_request(repo_id, private, hf_sandboxes)
    space = {"repo_id": repo_id, "repo_type": "space"}
    calls = [
        Call("create_repo", {**space, "space_sdk": "docker", "private": private, "exist_ok": True}),
        Call("space_info", {"repo_id": repo_id}),
    ]
    secret_calls, notes, generated = _secret_calls(repo_id, env, hf_sandboxes, open_access, token_factory)
    calls += secret_calls
    has_token = any(c.kwargs.get("key") == "SWE_GYM_ACCESS_TOKEN" for c in secret_calls)
    calls += _variable_calls(repo_id, env, extra_vars or [], open_access, has_token)
    staged = _staged_files(root, files)
    upload = {"folder_path": "", "commit_message": "swe-gym-env push", "delete_patterns": ["*"]}
    calls.append(Call("upload_folder", {**space, **upload}))
    if hardware:
        calls.append(Call("request_space_hardware", {"repo_id": repo_id, "hardware": hardware}))
    return Plan(repo_id, calls, staged, needs_public=hf_sandboxes, generated_token=generated, notes=notes)


def _stage(files: list[tuple[str, Path | bytes]], into: Path) -> None:
    for path, src in files:
        dest = into / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, bytes):
            dest.write_bytes(src)
        else:
            shutil.copyfile(src, dest)


def token_file(repo_id: str) -> Path:
    from swe_gym_env.core.assets import cache_dir

    return cache_dir() / "spaces" / (repo_id.replace("/", "__") + ".access-token")


def execute(plan: Plan, api: Any, log: Callable[[str], None] = print) -> None:
    """Send the plan with ``api`` (an ``HfApi``). Refuses, before any secret is sent, a private Space that
    sandboxes must reach."""
    with tempfile.TemporaryDirectory(prefix="swe-gym-space-") as tmp:
        _stage(plan.files, Path(tmp))
        for call in plan.calls:
            kwargs = dict(call.kwargs)
            if call.method == "upload_folder":
                kwargs["folder_path"] = tmp
            log(call.render())
            result = getattr(api, call.method)(**kwargs)
            if call.method == "space_info" and plan.needs_public and getattr(result, "private", False):
                raise PushError(
                    f"{plan.repo_id} is a private Space and --hf-sandboxes needs /capture reachable from sandboxes "
                    "outside it: make the Space public (the capture proxy refuses unknown keys; starting work needs "
                    "the access token) or deploy without --hf-sandboxes"
                )
    if plan.generated_token is not None:
        path = token_file(plan.repo_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(plan.generated_token + "\n")
        log(f"access token saved to {path} (mode 600): send it as `Authorization: Bearer <token>`")


def push(
    repo_id: str,
    *,
    dry_run: bool = False,
    hardware: str | None = None,
    private: bool = False,
    hf_sandboxes: bool = False,
    open_access: bool = False,
    extra_vars: list[str] | None = None,
    api: Any = None,
    env: dict[str, str] | None = None,
    root: Path | None = None,
    files: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """The `push` command: 0 on success, 2 when refused (the reason printed). ``root``: the checkout to upload
    (default: `swe_gym_env.core.procs.checkout_dir`)."""
    try:
        root = root or _checkout()
        plan = build_plan(
            repo_id,
            env=dict(os.environ) if env is None else env,
            root=root,
            hardware=hardware,
            private=private,
            hf_sandboxes=hf_sandboxes,
            open_access=open_access,
            extra_vars=extra_vars,
            files=files,
        )
        if dry_run:
            log("dry run: nothing is sent")
            log(plan.render())
            return 0
        if api is None:
            from huggingface_hub import HfApi

            api = HfApi()
        for note in plan.notes:
            log(f"note: {note}")
        execute(plan, api, log)
    except PushError as e:
        log(f"push refused: {e}")
        return 2
    log(f"done: https://huggingface.co/spaces/{repo_id}")
    return 0


def _checkout() -> Path:
    try:
        root = procs.checkout_dir()
    except ValueError as e:
        raise PushError(str(e)) from e
    if root is None:
        raise PushError(
            "push uploads the project's source tree and none was found: run it inside a checkout of swe_gym_env, "
            f"or pass --root DIR (or set ${procs.CHECKOUT_ENV})"
        )
    return root
