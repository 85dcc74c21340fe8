"""codex, claude-code and gemini-cli end to end, each as `swe-gym-env demo --harness X` in a subprocess: the real CLI
(its pinned npm release, from its agent bundle) against the built-in engine's oracle through its own dialect of
/capture (Responses, Anthropic Messages, Gemini), the local bubblewrap sandbox and real grading. Pi and OpenCode are
covered by tests/test_agents.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_five_harnesses import installed_harness

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MORE = ["codex", "claude-code", "gemini-cli"]


@pytest.mark.parametrize("harness", MORE)
def test_demo_solves_the_task_and_matches_the_agents_own_transcript(harness, need_sandbox, need_tokenizer):
    h = installed_harness(harness)
    argv = [sys.executable, "-m", "swe_gym_env.cli", "demo", "--harness", harness, "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0 and result["ok"], (result.get("error"), run.stderr[-2000:])
    assert result["reward"] == 1.0 and result["stop_reason"] == "agent_done"
    assert result["cross_check"] == "match", result["cross_check_detail"]
    assert len(result["turns"]) >= 2 and not any(t["discarded"] for t in result["turns"])
    assert {t["dialect"] for t in result["turns"]} == {h.dialect}
