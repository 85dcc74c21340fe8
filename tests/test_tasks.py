import json

import pytest
from pydantic import ValidationError

from swe_gym_env.tasks.catalog import TaskNotFound, bundled_tasks, find_by_problem_statement, get_task
from swe_gym_env.tasks.models import Task

ROW = {
    "instance_id": "o__r-1",
    "repo": "o/r",
    "base_commit": "a" * 40,
    "problem_statement": "bug",
    "test_patch": "diff --git a/tests/t.py b/tests/t.py\n",
    "FAIL_TO_PASS": ["tests/t.py::test_a"],
}


def test_bundled_task_is_valid_and_complete():
    task = bundled_tasks()[0]
    assert len(bundled_tasks()) >= 5 and len({t.instance_id for t in bundled_tasks()}) == len(bundled_tasks())
    assert task.patch and task.test_patch and task.FAIL_TO_PASS and task.PASS_TO_PASS
    assert task.repo_source and task.repo_source.endswith(".bundle")
    assert task.test_files() == ["tests/test_chunks.py"]
    assert get_task("bundled", 0) == task == get_task(instance_id=task.instance_id)
    assert find_by_problem_statement("prefix\n" + task.problem_statement + "\nsuffix") == task


def test_swe_bench_json_string_lists_are_decoded():
    t = Task.model_validate({**ROW, "FAIL_TO_PASS": json.dumps(["a::b"]), "PASS_TO_PASS": "[]"})
    assert t.FAIL_TO_PASS == ["a::b"] and t.PASS_TO_PASS == []


@pytest.mark.parametrize(
    "field,value",
    [
        ("repo", "o/r; rm -rf /"),
        ("base_commit", "HEAD"),
        ("base_commit", "$(id)"),
        ("instance_id", "../x"),
        ("FAIL_TO_PASS", []),
        ("FAIL_TO_PASS", ["a\nb"]),
    ],
)
def test_malformed_rows_are_rejected_naming_the_field(field, value):
    with pytest.raises(ValidationError) as e:
        Task.model_validate({**ROW, field: value})
    assert field in str(e.value)


def test_unknown_task_is_a_clear_error():
    with pytest.raises(TaskNotFound, match="out of range"):
        get_task("bundled", 99)
    with pytest.raises(TaskNotFound, match="unknown split"):
        get_task("nope", 0)


def test_setup_commands_are_single_lines_and_run_in_the_workdir():
    import pytest
    from pydantic import ValidationError

    from swe_gym_env.tasks.loaders import normalise_row

    row = {**bundled_tasks()[0].model_dump(), "setup_commands": '["echo one", "touch ready"]'}
    task = Task.model_validate(normalise_row(row, "swe-gym", "local"))
    assert task.setup_commands == ["echo one", "touch ready"]
    script = task.setup_script()
    assert script.startswith("set -e\n") and "cd /testbed\n" in script and script.endswith("touch ready\n")
    with pytest.raises(ValidationError):
        Task.model_validate({**row, "setup_commands": ["echo a\nrm -rf /"]})
