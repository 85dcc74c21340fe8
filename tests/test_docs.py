"""Docs that cannot rot: README.md and docs/ checked against the code.

- README is short, in the issue's order, with the screenshot and the two commands exactly;
- every relative link and anchor in README.md and docs/ resolves;
- every `swe-gym-env …` command they quote parses with the real CLI parser (`cli.build_parser`; `parity` with
  client/parity.py's own);
- docs/configuration.md is what `swe-gym-env config --markdown` prints (tests/test_settings.py);
- README's Python snippets run against a real server (built-in engine, real Pi, real sandbox).
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swe_gym_env.cli import FIRST_STEPS, build_parser
from swe_gym_env.client.parity import build_parser as parity_parser

from helpers import Stack

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
TWO_COMMANDS = ("bash scripts/setup.sh && .venv/bin/swe-gym-env demo", "bash scripts/test.sh")


def test_readme_is_short_and_in_order():
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0] == "# swe_gym_env"
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150: the reference is in docs/)"
    assert max(len(line) for line in lines) <= 160
    image = re.search(r"!\[[^\]]*\]\((docs/img/[^)]+\.png)\)", text)
    assert image and (REPO / image[1]).stat().st_size > 20_000, "the screenshot of /web (tests/test_docs_screenshot.py)"
    heads = [line for line in lines if line.startswith("## ")]
    order = ["## Two commands", "## From an MCP client", "## From a trainer", "## Deploy to a Space", "## Reference"]
    assert heads == order
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert [b.strip() for b in blocks[:2]] == list(TWO_COMMANDS)
    for c in TWO_COMMANDS:  # scripts that exist, and the first screen repeats them
        assert (REPO / c.split()[1]).is_file()
        assert any(step.startswith(c) for step in FIRST_STEPS)
    assert re.search(r"test budget.*\d+ tests in \d+ min", text), "a line with the latest test-budget figure"
    for page in ("architecture", "capture", "grading", "harnesses", "sandboxes", "space", "clients", "benchmarks"):
        assert f"(docs/{page}.md)" in text, page
    assert "(docs/configuration.md)" in text


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_slug_is_githubs():
    assert slug("Sandboxes in HF Jobs") == "sandboxes-in-hf-jobs"
    assert slug("Access modes: a public Space is never open by accident") == (
        "access-modes-a-public-space-is-never-open-by-accident"
    )
    assert slug("The rollout graph: the one source of training data") == (
        "the-rollout-graph-the-one-source-of-training-data"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page):
    assert links(README), "the link collector finds README's links"
    for link in links(page):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: not ours to check offline
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} → {target} does not exist"
        if anchor:
            assert target.suffix == ".md", f"{page.name}: {link}: an anchor into a file that is not markdown"
            assert anchor in anchors(target), f"{page.name}: {link}: no heading #{anchor} in {target.name}"


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\nsee [x](missing.md) and [y](#nowhere)\n")
    assert links(page) == ["missing.md", "#nowhere"]
    assert "nowhere" not in anchors(page) and "title" in anchors(page)


# ---- every quoted `swe-gym-env …` command parses ---------------------------------------------------------------

COMMAND = re.compile(r"(?:\.venv/bin/)?swe-gym-env(?: [^`\n]*)?")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_/.=-]*|.*….*)$")


def quoted_commands(page: Path) -> list[str]:
    """Commands in code spans and code blocks (prose mentioning the name is not a command)."""
    text = page.read_text()
    out = []
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
        out += [m.group(0) for line in block.splitlines() for m in [COMMAND.search(line)] if m]
    for span in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S)):
        if m := COMMAND.match(span.strip()):
            out.append(m.group(0))
    return out


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _fill(parser: argparse.ArgumentParser, option: str | None) -> str:
    """A value for a placeholder: the option's first choice, a number for a number, else a word."""
    action = parser._option_string_actions.get(option or "")
    if action is None:
        return "x"
    if action.choices:
        return str(next(iter(action.choices)))
    return "1" if action.type in (int, float) else "x"


def normalise(cmd: str) -> list[str]:
    """`swe-gym-env bench {capture,graph} [--json]` → argv the parser takes; alternatives: the first one."""
    cmd = cmd.split(" #")[0].split(" && ")[0].split(" | ")[0].split("`")[0]
    cmd = re.sub(r"\{([^},]+)(?:,[^}]*)?\}", r"\1", cmd)  # {a,b,c} → a
    cmd = cmd.replace("[", " ").replace("]", " ").replace("\\|", "|")
    words = shlex.split(cmd)[1:]
    return [w.split("|")[0] if "|" in w else w for w in words]


def parse_quoted(cmd: str) -> None:
    argv = normalise(cmd)
    if argv[:1] == ["parity"]:
        parser, argv = parity_parser(), argv[1:]
    else:
        parser = build_parser()
    current, last_option, filled = parser, None, []
    for word in argv:
        if word in _subparsers(current):
            current = _subparsers(current)[word]
        elif PLACEHOLDER.match(word) and not word.startswith("-"):
            word = _fill(current, last_option)
        last_option = word if word.startswith("-") else None
        filled.append(word)
    try:
        parser.parse_args(filled)
    except SystemExit as e:
        if e.code == 0:  # --help
            return
        raise AssertionError(f"{cmd!r} does not parse (as {filled})") from e


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_command_parses(page, capsys):
    for cmd in quoted_commands(page):
        parse_quoted(cmd)


def test_quoted_commands_are_found_and_a_wrong_one_fails():
    cmds = {c for p in PAGES for c in quoted_commands(p)}
    assert ".venv/bin/swe-gym-env demo" in cmds and "swe-gym-env config --markdown" in cmds
    assert len(cmds) >= 15
    parse_quoted("swe-gym-env setup --harness X")  # a placeholder takes the option's first choice
    parse_quoted("swe-gym-env bench {capture,graph,rollouts,server} [--json] [--quick]")
    for wrong in ("swe-gym-env serve --no-such-flag", "swe-gym-env deploy", "swe-gym-env setup --harness nope"):
        with pytest.raises(AssertionError):
            parse_quoted(wrong)


# ---- README's Python snippets, against a real server ------------------------------------------------------------


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.integration
@pytest.mark.usefixtures("need_pi")
def test_readme_python_snippets_run_against_a_server(tmp_path):
    code = snippets()
    assert len(code) == 2 and all(10 <= len(c.splitlines()) <= 20 for c in code), [len(c.splitlines()) for c in code]
    stack = Stack("oracle", env={"SWE_GYM_DATA_DIR": str(tmp_path / "data")})
    try:
        base = f"http://127.0.0.1:{stack.server_port}"
        outputs = []
        for snippet in code:
            t0 = time.monotonic()
            assert "http://127.0.0.1:8000" in snippet
            run = subprocess.run(
                [sys.executable, "-c", snippet.replace("http://127.0.0.1:8000", base)],
                capture_output=True,
                text=True,
                timeout=600,
                cwd=tmp_path,
            )
            assert run.returncode == 0, run.stderr[-3000:]
            outputs.append(run.stdout)
            print(f"snippet {len(outputs)}: {time.monotonic() - t0:.1f}s")
    finally:
        stack.stop()
    mcp, trainer = outputs
    first = mcp.splitlines()[0].split()
    assert first[0] == "True" and first[2] == "1.0", mcp  # ok, phase, reward 1.0 (the oracle applies the fix)
    assert len(mcp.splitlines()) >= 2, "at least one captured turn printed"
    rows = [line.split() for line in trainer.splitlines()]
    assert len({r[0] for r in rows}) == 2, trainer  # two rollouts, each with its rows
    assert all(r[2] == "1.0" and float(r[3]) == 0.0 and int(r[4]) > 0 for r in rows), trainer


def test_harness_table_has_a_row_per_harness_matching_the_classes():
    from swe_gym_env.core.names import HARNESSES
    from swe_gym_env.server.agents.registry import harness_class

    rows = [line for line in (REPO / "docs" / "harnesses.md").read_text().splitlines() if line.startswith("| ")][2:]
    assert len(rows) == len(HARNESSES)
    for name in HARNESSES:
        cls = harness_class(name)
        row = next(
            (
                r
                for r in rows
                if r.split(" | ")[0].strip("| ").lower().replace(" ", "") == name.replace("-", "")
                or r.split(" | ")[0].strip("| ").lower() == name
            ),
            None,
        )
        assert row is not None, name
        cells = row.split(" | ")
        assert cls.version in cells[1], (name, cls.version, cells[1])
        assert f"{cls.min_context_tokens:,}" == cells[4].strip(), (name, cls.min_context_tokens, cells[4])
