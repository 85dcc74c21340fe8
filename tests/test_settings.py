"""The one settings model (swe_gym_env/core/settings.py): every SWE_GYM_* name the code uses is in it (or internal), bad
values stop the CLI before anything starts, misspelt names warn, `swe-gym-env config` tells values and sources and
never shows a secret, docs/configuration.md is what the generator prints."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swe_gym_env.core import settings as S
from swe_gym_env.server.results.retention import parse_bytes
from swe_gym_env.space_app import push

REPO = Path(__file__).resolve().parent.parent
ME = [sys.executable, "-m", "swe_gym_env.cli"]
SKIP_DIRS = {".venv", ".vllm-venv", ".openenv-venv", ".trl-venv", "tests", "docs", ".git", "node_modules", "artifacts"}
SUFFIXES = {".py", ".sh", ".toml", ".yaml", ".yml", ".html", ".js", ".mjs", ".jinja", ".cfg"}
NAME = re.compile(r"SWE_GYM_[A-Z0-9_]*[A-Z0-9_]")


def code_files() -> list[Path]:
    """The repo's own files (git's list: tracked, or new and not ignored), so a stale build/ or a venv never counts."""
    listed = (
        subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    out = []
    for rel in filter(None, listed):
        p = REPO / rel
        if set(Path(rel).parts[:-1]) & SKIP_DIRS or not p.is_file():
            continue
        if p.suffix in SUFFIXES or p.name in ("Dockerfile",) or p.name.endswith(".Dockerfile"):
            out.append(p)
    return out


def names_in_code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for p in code_files():
        for name in NAME.findall(p.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(p.relative_to(REPO)))
    return found


def test_every_swe_gym_name_in_the_code_is_a_setting_internal_or_a_marker():
    found = names_in_code()
    assert len(found) >= 60, sorted(found)  # the scan sees the code (settings, families, internals, markers)
    known = S.known_names()
    unknown = {}
    for name, where in found.items():
        if name in known:
            continue
        if name.endswith("_") and any(k.startswith(name) for k in known):  # a prefix: names built at run time
            continue
        unknown[name] = sorted(where)
    assert not unknown, f"SWE_GYM_* names the settings model does not know (add them to core/settings.py): {unknown}"


def test_families_are_built_from_the_backend_list():
    from swe_gym_env.core.names import SANDBOXES

    assert set(S.FAMILIES) == {f"SWE_GYM_MAX_ROLLOUTS_{b.upper().replace('-', '_')}" for b in SANDBOXES}
    s = S.build({"SWE_GYM_MAX_ROLLOUTS": "3", "SWE_GYM_MAX_ROLLOUTS_HF_POOL": "16"})
    assert s.max_rollouts_for("hf-pool") == 16 and s.max_rollouts_for("local") == 3
    with pytest.raises(S.SettingsError, match=r"SWE_GYM_MAX_ROLLOUTS_DOCKER='0': a positive integer"):
        S.build({"SWE_GYM_MAX_ROLLOUTS_DOCKER": "0"})


def test_configuration_page_is_the_generators_output_and_names_every_name():
    page = (REPO / "docs" / "configuration.md").read_text()
    assert page == S.markdown(), "docs/configuration.md is stale: run `swe-gym-env config --markdown`"
    for name in [*S.setting_names(), *S.FAMILIES, *S.INTERNAL, *S.MARKERS]:
        assert f"`{name}`" in page, name
    for name in names_in_code():  # every name the code uses, settings and internal ones alike
        assert name in page or name.endswith("_"), name


def test_cli_writes_the_same_page():
    out = subprocess.run([*ME, "config", "--markdown"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == S.markdown()


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"SWE_GYM_CONTEXT_WINDOW": "abc"}, "SWE_GYM_CONTEXT_WINDOW='abc': Input should be a valid integer"),
        ({"SWE_GYM_CONTEXT_WINDOW": "0"}, "SWE_GYM_CONTEXT_WINDOW='0': Input should be greater than 0"),
        ({"SWE_GYM_RETENTION_CAPTURE_BYTES": "lots"}, "SWE_GYM_RETENTION_CAPTURE_BYTES='lots': a size in bytes"),
        ({"SWE_GYM_UI": "maybe"}, "SWE_GYM_UI='maybe': a flag is needed"),
        ({"SWE_GYM_UPSTREAM": "curl"}, "SWE_GYM_UPSTREAM='curl': Input should be 'aiohttp' or 'httpx'"),
        ({"SWE_GYM_E2B_TEMPLATES": "{x"}, "SWE_GYM_E2B_TEMPLATES='{x': a JSON object is needed"),
        ({"SWE_GYM_HF_POOL_IDLE_TIMEOUT_S": "5"}, "SWE_GYM_HF_POOL_IDLE_TIMEOUT_S='5': Input should be greater"),
    ],
)
def test_a_bad_value_names_the_variable_the_value_and_what_is_expected(env, line):
    with pytest.raises(S.SettingsError) as e:
        S.build(env)
    assert str(e.value).startswith(line), str(e.value)
    assert "\n" not in str(e.value)


def test_every_bad_value_is_reported_at_once_and_a_secret_is_never_echoed():
    with pytest.raises(S.SettingsError) as e:
        S.build({"SWE_GYM_CONTEXT_WINDOW": "x", "SWE_GYM_PRISTINE_MAX": "-1", "SWE_GYM_MAX_ROLLOUTS_HF": "y"})
    assert len(str(e.value).splitlines()) == 3
    assert S.secret_names() == {
        "SWE_GYM_ACCESS_TOKEN",
        "SWE_GYM_ADMIN_KEY",
        "SWE_GYM_ENGINE_API_KEY",
        "SWE_GYM_SPACE_HF_TOKEN",
    }


def test_empty_values_mean_unset_and_defaults_match_the_code():
    s = S.build({"SWE_GYM_CONTEXT_WINDOW": "", "SWE_GYM_ENGINE_URL": ""})
    assert s.context_window == 8192 and s.engine_url is None
    assert s.max_rollouts == 8 and s.retention_min_free_bytes == 2 * 1024**3 and s.ui is True
    from swe_gym_env.server.results.retention import RetentionSettings
    from swe_gym_env.server.results.store import CACHE_BYTES, CACHE_ITEMS

    d = RetentionSettings()
    assert (s.result_cache_items, s.result_cache_bytes) == (CACHE_ITEMS, CACHE_BYTES)
    assert (s.retention_results_bytes, s.retention_capture_bytes) == (d.results_max_bytes, d.capture_max_bytes)
    assert (s.retention_grace_s, s.retention_interval_s, s.retention_max_age_h * 3600) == (
        d.grace_s,
        d.interval_s,
        d.max_age_s,
    )


@given(
    st.floats(min_value=0, max_value=4096, allow_nan=False).map(lambda v: round(v, 2)),
    st.sampled_from(["", "K", "M", "G", "T", "k", "MiB", "GB", "g"]),
)
def test_sizes_parse_as_the_retention_code_reads_them(value, unit):
    raw = f"{value}{unit}"
    assert S.parse_size(raw) == parse_bytes(raw)


def test_unknown_names_warn_with_the_closest_setting():
    warnings = S.unknown_warnings(
        {"SWE_GYM_MAX_ROLOUTS": "4", "SWE_GYM_MAX_ROLLOUTS_HFPOOL": "2", "SWE_GYM_GUARD_FD": "5", "SWE_GYM_UI": "0"}
    )
    assert len(warnings) == 2, warnings
    assert "SWE_GYM_MAX_ROLOUTS" in warnings[1] and warnings[1].endswith("did you mean SWE_GYM_MAX_ROLLOUTS?")
    assert warnings[0].endswith("did you mean SWE_GYM_MAX_ROLLOUTS_HF_POOL?")
    assert S.unknown_warnings({"SWE_GYM_PTYS": "1:2", "SWE_GYM_PATCH_EOF": "x"}) == []  # internal, marker


def test_current_follows_the_environment(monkeypatch):
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS", "3")
    assert S.current().max_rollouts == 3
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS", "5")
    assert S.current().max_rollouts == 5
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS", "nope")
    with pytest.raises(S.SettingsError, match="SWE_GYM_MAX_ROLLOUTS='nope'"):
        S.current()


def test_push_tells_secrets_from_variables_with_the_model():
    assert set(push.SECRETS) == S.secret_names() - {"SWE_GYM_SPACE_HF_TOKEN"}
    assert push.HF_SANDBOX_SECRET[1][0] == "SWE_GYM_SPACE_HF_TOKEN"
    names = S.setting_names()
    for v in (*push.VARIABLES, push.OPEN_VARIABLE):
        assert v in names and v not in S.secret_names(), v


# ---- the command line ------------------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWE_GYM_")}
    return subprocess.run(
        [*ME, *args], capture_output=True, text=True, timeout=timeout, env={**clean, **(env or {})}, cwd=cwd
    )


def test_serve_with_a_bad_value_fails_at_once_in_one_line():
    t = time.monotonic()
    out = cli("serve", "--port", "0", env={"SWE_GYM_CONTEXT_WINDOW": "abc"})
    took = time.monotonic() - t
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert lines == [
        "swe-gym-env: bad setting SWE_GYM_CONTEXT_WINDOW='abc': Input should be a valid integer, unable to parse "
        "string as an integer"
    ], out.stderr
    assert "Traceback" not in out.stderr and "sandbox" not in out.stderr  # before any probe
    assert took < 30, took


def test_a_misspelt_setting_warns_naming_the_right_one(tmp_path):
    out = cli("config", env={"SWE_GYM_MAX_ROLOUTS": "4"}, cwd=tmp_path)
    assert out.returncode == 0
    assert "SWE_GYM_MAX_ROLOUTS" in out.stderr and "did you mean SWE_GYM_MAX_ROLLOUTS?" in out.stderr


def test_config_shows_values_sources_and_only_whether_a_secret_is_set(tmp_path):
    (tmp_path / ".env").write_text("SWE_GYM_MAX_ROLLOUTS=5\nSWE_GYM_ADMIN_KEY=adm-from-dotenv-XYZ\nOTHER=1\n")
    env = {"SWE_GYM_ACCESS_TOKEN": "tok-SECRET-123", "SWE_GYM_CONTEXT_WINDOW": "32768", "SWE_GYM_MAX_ROLLOUTS_HF": "2"}
    out = cli("config", "--json", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "SECRET-123" not in out.stdout + out.stderr and "XYZ" not in out.stdout + out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["settings"]}
    assert set(S.setting_names()) <= set(rows)
    assert (rows["SWE_GYM_CONTEXT_WINDOW"]["value"], rows["SWE_GYM_CONTEXT_WINDOW"]["source"]) == (32768, "environment")
    assert (rows["SWE_GYM_MAX_ROLLOUTS"]["value"], rows["SWE_GYM_MAX_ROLLOUTS"]["source"]) == (5, ".env")
    assert (rows["SWE_GYM_ACCESS_TOKEN"]["value"], rows["SWE_GYM_ACCESS_TOKEN"]["source"]) == ("set", "environment")
    assert (rows["SWE_GYM_ADMIN_KEY"]["value"], rows["SWE_GYM_ADMIN_KEY"]["source"]) == ("set", ".env")
    assert (rows["SWE_GYM_ENGINE_API_KEY"]["value"], rows["SWE_GYM_ENGINE_API_KEY"]["source"]) == ("unset", "default")
    assert rows["SWE_GYM_MAX_ROLLOUTS_HF"]["value"] == 2
    text = cli("config", env=env, cwd=tmp_path)
    assert text.returncode == 0 and "SECRET-123" not in text.stdout
    line = next(x for x in text.stdout.splitlines() if x.startswith("SWE_GYM_ACCESS_TOKEN "))
    assert line.split()[1:] == ["set", "(environment)"]


def test_startup_keeps_dotenv_values_the_environment_wins_and_os_environ_is_left_alone(tmp_path, monkeypatch):
    env_file = tmp_path / ".env"
    env_file.write_text("SWE_GYM_MAX_ROLLOUTS=5\nSWE_GYM_STALL_TIMEOUT_S=7\n")
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS", "2")
    monkeypatch.delenv("SWE_GYM_STALL_TIMEOUT_S", raising=False)
    monkeypatch.setattr(S, "_from_file", {})  # put back after the test, as startup replaces it
    seen: list[str] = []
    s = S.startup(env_file=env_file, warn=seen.append)
    assert s.max_rollouts == 2 and s.stall_timeout_s == 7.0
    assert "SWE_GYM_STALL_TIMEOUT_S" not in os.environ and os.environ["SWE_GYM_MAX_ROLLOUTS"] == "2"
    # what the server's modules read, and what a child process that reads the settings itself is given
    assert S.setting("stall_timeout_s") == 7.0 and S.setting("max_rollouts") == 2 and S.max_rollouts("local") == 2
    assert S.current().stall_timeout_s == 7.0
    assert S.environ()["SWE_GYM_STALL_TIMEOUT_S"] == "7" and S.environ()["SWE_GYM_MAX_ROLLOUTS"] == "2"
    monkeypatch.setenv("SWE_GYM_STALL_TIMEOUT_S", "9")  # the environment still wins, as it changes
    assert S.setting("stall_timeout_s") == 9.0


# writes to this process's environment: the code that talks to itself through os.environ
ENV_WRITE = re.compile(r"os\.environ\[[^\]]*\]\s*=[^=]|os\.environ\.(?:update|setdefault|pop)\(|environ\.pop\(")
# where writing it is the point: the code that builds a child's environment (agents, sandboxes, the grading guard);
CHILD_ENV_CODE = ("server/agents/", "server/sandbox/", "server/grading/guard")


def test_configuration_flows_one_way_nothing_writes_os_environ_to_talk_to_itself():
    found = []
    for p in REPO.rglob("*.py"):
        rel = p.relative_to(REPO).as_posix()
        if set(p.relative_to(REPO).parts) & SKIP_DIRS or rel.startswith(("build/", *CHILD_ENV_CODE)):
            continue
        found += [
            f"{rel}:{n}"
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if ENV_WRITE.search(line)
        ]
    assert not found, f"pass configuration down (ServerConfig, a returned value), not through os.environ: {found}"


def test_help_lists_the_commands_in_a_newcomers_order_one_line_each():
    out = cli("--help")
    assert out.returncode == 0
    order = "demo serve rollout info config validate bench push setup engine export parity".split()
    lines = [line.split()[0] for line in out.stdout.splitlines() if line.startswith("    ") and line.split()]
    assert lines == order, out.stdout
    bare = cli()
    assert bare.returncode == 0 and bare.stdout.startswith(out.stdout)
    assert "bash scripts/setup.sh && .venv/bin/swe-gym-env demo" in bare.stdout
    assert "bash scripts/test.sh" in bare.stdout


def test_one_setting_is_read_alone_so_a_bad_neighbour_fails_only_its_reader(monkeypatch):
    from swe_gym_env.server.sandbox import hf, pristine

    monkeypatch.setenv("SWE_GYM_HF_POOL_SANDBOXES_PER_HOST", "0")  # bad, but not what these read
    monkeypatch.setenv("SWE_GYM_PUBLIC_URL", "https://space.example")
    monkeypatch.setenv("SWE_GYM_PRISTINE_MAX", "3")
    assert hf.public_url() == "https://space.example" and pristine.max_trees() == 3
    monkeypatch.setenv("SWE_GYM_PRISTINE_MAX", "-1")
    with pytest.raises(S.SettingsError, match=r"^SWE_GYM_PRISTINE_MAX='-1': Input should be greater than or equal"):
        pristine.max_trees()
    monkeypatch.delenv("SWE_GYM_PRISTINE_MAX")
    assert pristine.max_trees() == 64 and S.setting("engine_api_key") is None
    monkeypatch.setenv("SWE_GYM_ENGINE_API_KEY", "k-SECRET")
    assert S.setting("engine_api_key").get_secret_value() == "k-SECRET"
    assert "SECRET" not in repr(S.setting("engine_api_key"))


# ---- the server reads its settings through the model -----------------------------------------------------------

READ = re.compile(r"environ(?:\.get\(\s*|\[\s*)[\"'](SWE_GYM_[A-Z0-9_]+)[\"'](?!\s*\]\s*=[^=])")


def test_no_server_code_reads_a_setting_from_os_environ_directly():
    settings_and_families = {*S.setting_names(), *S.FAMILIES}
    found: dict[str, set[str]] = {}
    for p in [*(REPO / "server").rglob("*.py"), REPO / "cli.py"]:  # what the server and its CLI run
        rel = str(p.relative_to(REPO))
        for name in READ.findall(p.read_text(errors="replace")):
            if name in settings_and_families:
                found.setdefault(rel, set()).add(name)
    assert not found, f"read these through swe_gym_env.core.settings.setting: {found}"
    source = (REPO / "server" / "security.py").read_text() + (REPO / "server" / "rollout" / "config.py").read_text()
    assert source.count("os.environ") == 1 and "os.environ.get(SPACE_ENV)" in source  # Hugging Face's, not ours


def test_security_reads_the_model_with_its_defaults_and_names_a_bad_value(monkeypatch):
    from swe_gym_env.server import security

    for name in S.setting_names():
        if name.startswith(("SWE_GYM_ACCESS", "SWE_GYM_ADMIN", "SWE_GYM_RATE", "SWE_GYM_MAX_REQ", "SWE_GYM_OPEN")):
            monkeypatch.delenv(name, raising=False)
    for name in ("SWE_GYM_PUBLIC_READS", "SWE_GYM_BIND_HOST", "SWE_GYM_ENGINE_URL_ALLOWLIST", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SWE_GYM_ALLOW_ENGINE_URLS", raising=False)
    default_body = S.Settings.model_fields["max_request_bytes"].default
    assert security.max_request_bytes() == security.DEFAULT_MAX_BODY == default_body
    assert (security.rate_per_minute(), security.access_mode(), security.read_mode()) == (0, "open", "open")
    assert security.engine_allowlist() == () and not security.open_on_purpose()
    monkeypatch.setenv("SWE_GYM_ACCESS_TOKEN", "tok-SECRET-1")
    assert security.rate_per_minute() == security.DEFAULT_RATE_WITH_TOKEN and security.access_mode() == "token"
    assert security.access_ok("tok-SECRET-1") and not security.access_ok("tok-SECRET-2")
    monkeypatch.setenv("SWE_GYM_ACCESS_TOKEN", "")  # empty is unset, as before
    assert security.access_mode() == "open"
    # the model's spellings: sizes and flags as every other setting takes them
    monkeypatch.setenv("SWE_GYM_MAX_REQUEST_BYTES", "1M")
    monkeypatch.setenv("SWE_GYM_PUBLIC_READS", "yes")
    monkeypatch.setenv("SWE_GYM_ALLOW_ENGINE_URLS", "true")
    monkeypatch.setenv("SWE_GYM_ENGINE_URL_ALLOWLIST", " http://a:1/v1 , ")
    assert security.max_request_bytes() == 1024**2 and security.read_mode() == "public"
    assert security.engine_allowlist() == ("http://a:1/v1", "*")
    for name, raw, reader, says in [
        ("SWE_GYM_RATE_LIMIT_PER_MIN", "-3", security.rate_per_minute, "Input should be greater than or equal"),
        ("SWE_GYM_PUBLIC_READS", "maybe", lambda: security.read_refusal("x"), "a flag is needed"),
        ("SWE_GYM_OPEN_ACCESS", "sure", security.lock_reason, "a flag is needed"),
        ("SWE_GYM_MAX_REQUEST_BYTES", "big", security.max_request_bytes, "a size in bytes"),
    ]:
        monkeypatch.setenv(name, raw)
        with pytest.raises(S.SettingsError, match="^" + re.escape(f"{name}={raw!r}: {says}")):  # loud, never open
            reader()
        monkeypatch.delenv(name)


def test_a_secret_read_by_security_never_shows_in_an_error_or_in_config(monkeypatch):
    from swe_gym_env.server import security

    monkeypatch.setenv("SWE_GYM_ADMIN_KEY", "adm-SECRET-9")
    assert security.admin_ok("adm-SECRET-9") and not security.admin_ok("adm")
    monkeypatch.setenv("SWE_GYM_CONTEXT_WINDOW", "x")
    with pytest.raises(S.SettingsError) as e:
        S.build()
    assert "SECRET" not in str(e.value)
    rows = {r["name"]: r for r in S.describe(S.build({"SWE_GYM_ADMIN_KEY": "adm-SECRET-9"}))}
    assert rows["SWE_GYM_ADMIN_KEY"]["value"] == "set" and "SECRET" not in json.dumps(list(rows.values()))


def test_max_rollouts_family_through_the_model_with_the_servers_own_message(monkeypatch):
    from swe_gym_env.core.names import SANDBOXES
    from swe_gym_env.server.rollout.config import concurrency_from_env

    for name in ("SWE_GYM_MAX_ROLLOUTS", *S.FAMILIES):
        monkeypatch.delenv(name, raising=False)
    assert concurrency_from_env() == dict.fromkeys(SANDBOXES, 8)
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS", "3")
    monkeypatch.setenv("SWE_GYM_MAX_ROLLOUTS_HF_POOL", "16")
    assert concurrency_from_env() == {**dict.fromkeys(SANDBOXES, 3), "hf-pool": 16}
    assert concurrency_from_env() == {b: S.build().max_rollouts_for(b) for b in SANDBOXES}  # the same reading
    for name, raw in [("SWE_GYM_MAX_ROLLOUTS_DOCKER", "0"), ("SWE_GYM_MAX_ROLLOUTS", "two")]:
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=f"^{name}={raw!r}: a positive integer is needed$"):
            concurrency_from_env()
        with pytest.raises(S.SettingsError, match=f"^{name}={raw!r}: a positive integer is needed$"):
            S.build()
        monkeypatch.delenv(name)
