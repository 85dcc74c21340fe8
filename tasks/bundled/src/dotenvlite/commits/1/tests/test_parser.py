import pytest

from dotenvlite import ParseError, load, parse


def test_basic_pairs():
    assert parse("A=1\nB = two\n") == {"A": "1", "B": "two"}


def test_comments_and_blank_lines_are_skipped():
    assert parse("# settings\n\nA=1\n   # indented comment\n") == {"A": "1"}


def test_quotes_are_removed():
    assert parse("A=\"hello world\"\nB='x'\n") == {"A": "hello world", "B": "x"}


def test_export_prefix():
    assert parse("export TOKEN=abc\n") == {"TOKEN": "abc"}


def test_later_assignment_wins():
    assert parse("A=1\nA=2\n") == {"A": "2"}


def test_bad_line_names_the_line():
    with pytest.raises(ParseError, match="line 2"):
        parse("A=1\nnot a pair\n")


def test_load_reads_utf8(tmp_path):
    path = tmp_path / ".env"
    path.write_text("CITY=Zürich\n", encoding="utf-8")
    assert load(path) == {"CITY": "Zürich"}
