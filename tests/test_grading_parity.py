"""Our reward equals swebench's own `get_eval_report` on the same real pytest logs, case by case; the JUnit
cross-check turns forged PASSED lines into an infra failure."""

from pathlib import Path

import pytest

from swe_gym_env.server.grading import load_swebench, make_test_spec, parse_junit, score_log
from swe_gym_env.tasks.models import Task

LOGS = Path(__file__).parent / "fixtures" / "pytest_logs"
T = "tests/test_suite.py::"
ALL = [
    "test_pass",
    "test_fail",
    "test_error",
    "test_skipped",
    "test_xfail",
    "test_xpass",
    "test_param[a b]",
    "test_param[x[1]]",
    "test_param[plain]",
    "TestGroup::test_method",
    "TestGroup::test_method_fails",
    "test_missing",
]
CASES = (
    [([t], []) for t in ALL]  # each outcome as the one FAIL_TO_PASS test
    + [(["test_pass"], [t]) for t in ALL]  # each outcome as the one PASS_TO_PASS test
    + [
        (["test_pass", "test_param[plain]", "TestGroup::test_method"], ["test_xfail", "test_skipped"]),
        (["test_param[a b]"], ["test_pass"]),
        (["test_param[x[1]]"], ["test_pass"]),
    ]
)


def task(f2p: list[str], p2p: list[str]) -> Task:
    return Task(
        instance_id="parity__case-1",
        repo="parity/case",
        base_commit="0" * 40,
        problem_statement="x",
        test_patch="diff --git a/tests/test_suite.py b/tests/test_suite.py\n",
        FAIL_TO_PASS=[T + t for t in f2p],
        PASS_TO_PASS=[T + t for t in p2p],
    )


@pytest.fixture(scope="module")
def swebench():
    return load_swebench()


@pytest.mark.parametrize("f2p,p2p", CASES, ids=[f"{'+'.join(a)}|{'+'.join(b)}" for a, b in CASES])
def test_reward_equals_swebench_get_eval_report(f2p, p2p, swebench):
    from swebench.harness.grading import get_eval_report

    t = task(f2p, p2p)
    log_path = LOGS / "mixed.log"
    theirs = get_eval_report(
        make_test_spec(t, swebench),
        {"instance_id": t.instance_id, "model_patch": "x"},
        str(log_path),
        include_tests_status=True,
    )[t.instance_id]
    ours = score_log(t, log_path.read_text(), swebench, parse_junit((LOGS / "mixed.junit.xml").read_bytes()))
    assert ours.reward == (1.0 if theirs["resolved"] else 0.0)
    assert ours.report.fail_to_pass == theirs["tests_status"]["FAIL_TO_PASS"]
    assert ours.report.pass_to_pass == theirs["tests_status"]["PASS_TO_PASS"]


def test_expected_verdicts_on_the_real_log(swebench):
    log = (LOGS / "mixed.log").read_text()
    junit = parse_junit((LOGS / "mixed.junit.xml").read_bytes())
    reward = {t: score_log(task([t], []), log, swebench, junit).reward for t in ALL}
    assert reward == {
        "test_pass": 1.0,
        "test_fail": 0.0,
        "test_error": 0.0,
        "test_skipped": 0.0,
        "test_xfail": 1.0,
        "test_xpass": 0.0,
        "test_param[a b]": 0.0,  # swebench's parser splits the id at the space
        "test_param[x[1]]": 0.0,
        "test_param[plain]": 1.0,
        "TestGroup::test_method": 1.0,
        "TestGroup::test_method_fails": 0.0,
        "test_missing": 0.0,
    }
    assert (
        "JUnit reports passing tests the log parser missed"
        in score_log(task(["test_param[a b]"], []), log, swebench, junit).findings[0]
    )
    assert "XFAIL" in score_log(task(["test_xfail"], []), log, swebench, junit).findings[0]


def test_forged_passed_line_is_tampering_scored_zero_not_a_pass(swebench):
    """A log that passes a test its JUnit report fails: the code under test forged it. Reward 0.0 with a
    `grading_tampered` finding (it was an infra error, reward None, before: a way out of the 0.0)."""
    t = Task(
        instance_id="forged__case-1",
        repo="forged/case",
        base_commit="0" * 40,
        problem_statement="x",
        test_patch="diff --git a/tests/test_suite.py b/tests/test_suite.py\n",
        FAIL_TO_PASS=[T + "test_fixed_behaviour"],
        PASS_TO_PASS=[T + "test_real_failure"],
    )
    log = (LOGS / "forged.log").read_text()
    assert "PASSED tests/test_suite.py::test_fixed_behaviour" in log  # printed by the code under test
    g = score_log(t, log, swebench, parse_junit((LOGS / "forged.junit.xml").read_bytes()))
    assert g.reward == 0.0 and g.report.integrity.startswith("tampered: the log reports 1 test(s) passing")
    assert [f.code for f in g.findings if not isinstance(f, str)] == ["grading_tampered"]
