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
    assert xr.test_cmd.endswith("-n0") and xr.log_parser == "parse_log_pytest" and xr.env_activation is None
    assert "test_cmd: Value error, must be a single line" in report.skipped[0]


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
