import subprocess
import sys


def imported_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print('\\n'.join(m for m in sys.modules if m.startswith('swe_gym_env')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_client_never_imports_the_server():
    mods = imported_after(
        "import swe_gym_env.client.mcp_client, swe_gym_env.client.ws_client, swe_gym_env.client.trainer"
    )
    assert {"swe_gym_env.client.mcp_client", "swe_gym_env.client.ws_client", "swe_gym_env.client.trainer"} <= mods
    assert not any(m.startswith("swe_gym_env.server") for m in mods), mods


def test_capture_proxy_knows_nothing_of_sandboxes_agents_or_tasks():
    mods = imported_after("import swe_gym_env.server.capture")
    assert not any(m.split(".")[2:3] in (["sandbox"], ["agents"], ["rollout"]) for m in mods), mods
    assert not any(m.startswith("swe_gym_env.tasks") for m in mods), mods


def test_sandbox_backends_know_nothing_of_agents():
    mods = imported_after("import swe_gym_env.server.sandbox.registry")
    assert not any(m.startswith(("swe_gym_env.server.agents", "swe_gym_env.tasks")) for m in mods), mods
