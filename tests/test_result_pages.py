"""Pages of a stored result and the bounded summary (server/results/pages.py), without a server: the pages' texts
joined are the file byte for byte, each page's JSON-escaped text stays within its limit, and a summary of a result with
pathological findings and pages stays within the tool-result bound."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from swe_gym_env.server.results import pages as result_pages
from swe_gym_env.server.results.pages import SUMMARY_BYTES, Manifest, Manifests, parse_range, scan, summarize
from swe_gym_env.wire import Finding, ResultSummary, RolloutResult

TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "a", "é", "日", "\n", "\t", "1", "😀", " "]), max_size=3000)


@settings(max_examples=40, deadline=None)
@given(st.lists(TEXT, max_size=30), st.integers(min_value=40_000, max_value=90_000))
def test_pages_join_to_the_file_and_each_fits_escaped(tmp_path_factory, parts, page_bytes):
    path = tmp_path_factory.mktemp("pages") / "r.json"
    data = json.dumps(parts, ensure_ascii=False).encode()
    path.write_bytes(data)
    m = scan(path, "r", page_bytes=page_bytes)
    assert m.size == len(data) and m.sha256 == hashlib.sha256(data).hexdigest()
    texts = []
    for k in range(m.pages):
        start, end = m.span(k)
        text = data[start:end].decode()  # never a split character
        assert len(json.dumps(text, ensure_ascii=False).encode()) - 2 <= page_bytes
        texts.append(text)
    assert "".join(texts).encode() == data


def test_read_page_rescans_a_file_stored_again(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b'{"a": 1}')
    pages = Manifests()
    assert pages.read_page(path, "r", 0)[0] == '{"a": 1}'
    path.write_bytes(b'{"a": 2, "b": 3}')
    text, m = pages.read_page(path, "r", 0)
    assert text == '{"a": 2, "b": 3}' and m.size == 16


def test_parse_range():
    assert parse_range(None, 100) is None
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=90-", 100) == (90, 100)
    assert parse_range("bytes=-10", 100) == (90, 100)
    assert parse_range("bytes=95-200", 100) == (95, 100)
    assert parse_range("bytes=100-", 100) == "unsatisfiable"
    assert parse_range("bytes=0-1,5-6", 100) is None  # several ranges: the whole
    assert parse_range("items=0-1", 100) is None and parse_range("bytes=x-y", 100) is None


def test_a_summary_stays_bounded_and_is_never_taken_for_a_result(tmp_path):
    result = RolloutResult(
        rollout_id="r1",
        ok=False,
        error="E" * 100_000,
        harness="pi",
        sandbox="local",
        findings=[Finding(severity="warning", code="c", message="m" * 5000) for _ in range(5000)],
        cross_check_detail="d" * 100_000,
    )
    pages = tuple(range(0, 10_000 * 1000, 1000))
    m = Manifest("r1", tmp_path / "r1.json", pages[-1], 0, "0" * 64, pages)
    s = summarize(result, m)
    assert len(s.model_dump_json()) <= SUMMARY_BYTES // 2 and s.pages == m.pages and s.findings_total == 5000
    assert s.findings and s.findings[0].severity == "warning"
    try:
        RolloutResult.model_validate(json.loads(s.model_dump_json()))
    except ValueError as e:
        assert "summary" in str(e)
    else:
        raise AssertionError("a summary validated as a result")
    assert ResultSummary.model_validate_json(s.model_dump_json()) == s
    assert result_pages.page_uri("r1", 3) == "swe-gym://rollouts/r1/result/pages/3"
