import json
import time
from pathlib import Path

import pytest

from swe_gym_env.tasks.loaders import DatasetError, guess_kind, load_tasks

FIX = Path(__file__).parent / "fixtures" / "datasets"


def test_swe_gym_rows_get_the_image_convention_and_conda():
    report = load_tasks(str(FIX / "swe_gym.jsonl"))
    assert report.kind == "swe-gym" and len(report.tasks) == 2 and len(report.skipped) == 1
    moto = report.tasks[0]
    assert moto.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752"
    assert moto.env_activation.startswith("source /opt/miniconda3/bin/activate")
    assert moto.FAIL_TO_PASS == ["tests/test_ssm/test_ssm_boto3.py::test_get_parameters_includes_label"]
    assert "row 2 (bad__row-1): base_commit" in report.skipped[0]
    assert "1 rows skipped" in report.summary()


def test_swe_bench_json_string_lists_and_bad_rows():
    report = load_tasks(str(FIX / "swe_bench_verified.jsonl"))
    assert report.kind == "swe-bench"
    (astropy,) = report.tasks
    assert astropy.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"
    assert astropy.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    assert report.skipped == [report.skipped[0]] and "row 1 (django__django-11099): PASS_TO_PASS" in report.skipped[0]


def test_swe_rebench_image_test_cmd_and_parser():
    report = load_tasks(str(FIX / "swe_rebench.jsonl"))
    assert report.kind == "swe-rebench"
    (xr,) = report.tasks
    assert xr.image == "swerebench/sweb.eval.x86_64.pydata_1776_xarray-7444"
    assert xr.test_cmd.endswith("-n0") and xr.log_parser == "parse_log_pytest"
    # SWE-rebench images are built like SWE-bench's: conda `testbed`, activated where the image has it
    assert xr.env_activation == (
        "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate && conda activate testbed; fi"
    )
    assert xr.install_config is not None and xr.install_config.python == "3.10"
    assert xr.install_config.install == "pip install -e ."
    assert "test_cmd: Value error, must be a single line" in report.skipped[0]


def rebench_row(**cfg) -> dict:
    row = json.loads((FIX / "swe_rebench.jsonl").read_text().splitlines()[0])
    return {**row, "install_config": {**row["install_config"], **cfg}}


def load_rows(tmp_path, *rows) -> object:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_tasks(str(path))


def test_swe_rebench_install_config_in_full(tmp_path):
    cfg = {
        "python": 3.9,
        "pip_packages": ["pytest-cov==6.2.1", "numpy<2"],
        "pre_install": ["apt-get update && apt-get install -y libxml2-dev"],
        "install": "pip install -e .[test]",
    }
    local = {**rebench_row(**cfg), "instance_id": "pydata__xarray-1", "repo_source": "xarray.bundle"}
    bad = {**rebench_row(pip_packages=["--index-url=https://evil.invalid/simple"]), "instance_id": "pydata__xarray-2"}
    report = load_rows(tmp_path, rebench_row(**cfg), local, bad)
    image_only, with_repo = report.tasks
    c = image_only.install_config
    assert (c.python, c.pip_packages, c.install) == ("3.9", ["pytest-cov==6.2.1", "numpy<2"], "pip install -e .[test]")
    assert c.pre_install == cfg["pre_install"] and c.requirement_names() == ["pytest-cov", "numpy"]
    # a row with a local repository: the image's conda env where there is one, else its own venv on `local`
    act = with_repo.env_activation
    assert act.startswith("if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate")
    assert "else SWE_GYM_TASK_ENV=/opt/swe-gym/runtime/envs/" in act and "exit 86" in act
    assert len(report.skipped) == 1 and "pip_packages" in report.skipped[0] and "pydata__xarray-2" in report.skipped[0]


def test_repo_runners_and_rows_with_their_own_eval_script(tmp_path):
    base = json.loads((FIX / "swe_bench_verified.jsonl").read_text().splitlines()[0])
    django = {**base, "instance_id": "django__django-1", "repo": "django/django"}
    django["test_patch"] = "diff --git a/tests/admin_views/test_forms.py b/tests/admin_views/test_forms.py\n"
    sympy = {**base, "instance_id": "sympy__sympy-1", "repo": "sympy/sympy"}
    own = {**base, "instance_id": "astropy__astropy-2", "eval_script": "#!/bin/bash\necho hi\n", "log_parser": "x"}
    own["eval_type"] = "fail_only"
    path = tmp_path / "swe_bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (django, sympy, own)))
    report = load_tasks(str(path))
    d, s, o = report.tasks
    assert d.test_cmd.startswith("./tests/runtests.py --verbosity 2") and d.test_targets() == ["admin_views.test_forms"]
    assert "bin/test -C --verbose" in s.test_cmd and s.test_args == "files"
    assert o.eval_script == "#!/bin/bash\necho hi\n" and o.eval_type == "fail_only" and o.log_parser == "x"
    assert o.test_cmd.startswith("python -m pytest") and d.log_parser is None  # None: the repo's parser, at grading


def test_a_local_file_under_a_swe_gym_folder_is_read_by_its_rows(tmp_path):
    folder = tmp_path / "swe_gym_env" / "tasks"
    folder.mkdir(parents=True)
    (folder / "tasks.jsonl").write_text(json.dumps(rebench_row()) + "\n")
    assert load_tasks(str(folder / "tasks.jsonl")).kind == "swe-rebench"


def test_parquet_and_kind_detection(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in (FIX / "swe_gym.jsonl").read_text().splitlines()][:2]
    path = tmp_path / "train-00000.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    report = load_tasks(str(path), kind="swe-gym")
    assert [t.instance_id for t in report.tasks] == ["getmoto__moto-5752", "python__mypy-11213"]
    assert guess_kind("SWE-Gym/SWE-Gym-Lite") == "swe-gym"
    assert guess_kind("princeton-nlp/SWE-bench_Verified") == "swe-bench"
    assert guess_kind("nebius/SWE-rebench") == "swe-rebench"
    assert guess_kind("x.jsonl", {"docker_image": "i"}) == "swe-rebench"


def test_hub_id_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(DatasetError, match="HF_HUB_OFFLINE"):
        load_tasks("SWE-Gym/SWE-Gym", "train")
    assert time.monotonic() - t0 < 1.0
    with pytest.raises(DatasetError, match="neither an existing file"):
        load_tasks("/no/such/file.jsonl")


def test_non_json_lines_are_reported_not_fatal(tmp_path):
    good = (FIX / "swe_gym.jsonl").read_text().splitlines()[0]
    path = tmp_path / "rows.jsonl"
    path.write_text(good + "\n{broken\n")
    report = load_tasks(str(path))
    assert len(report.tasks) == 1 and "row 1: line 2 is not JSON" in report.skipped[0]


def test_public_view_never_carries_the_patches():
    task = load_tasks(str(FIX / "swe_gym.jsonl")).tasks[0]
    view = task.public_view()
    assert "patch" not in view and "test_patch" not in view and view["instance_id"] == task.instance_id
