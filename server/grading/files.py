"""The file filter: what of the model patch reaches the grading tree (threat model item 1 in
`swe_gym_env.server.grading`). An allowlist, not a denylist: a change is kept only where a fix may make it.

Kept: changes to the project's files under folders that exist at base_commit, new modules included, and changes to
`pyproject.toml` / `setup.cfg` / `tox.ini` whose parsed content (tomllib, configparser: never a line scan) differs
from base_commit's only in keys nothing at test time reads (a release's version, its metadata, its dependency
list). Dropped (`protected_files`): everything else. Every path is compared after Unicode normalisation (NFKC) and
case folding, so `.DIST-INFO`, `PyTest.py` or a full-width letter is the name it imitates.
"""

from __future__ import annotations

import configparser
import re
import shlex
import sys
import tomllib
import unicodedata
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from swe_gym_env.server.grading import integrity
from swe_gym_env.tasks.models import Task, patch_files

# Files Python or pytest read as configuration, plugins or start-up code, whatever the folder: never the patch's.
NEVER_NAMES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "sitecustomize.py",
        "usercustomize.py",
        "setup.py",
        "noxfile.py",
        ".coveragerc",
        "manifest.in",
        ".gitattributes",
        ".gitmodules",
    }
)
NEVER_SUFFIXES = (".pth", ".pyc", ".pyo", ".so", ".pyd", ".egg-link")
NEVER_PARTS_SUFFIXES = (".egg-info", ".dist-info", ".egg")
# Parsed, never line-scanned: a change is kept only where every key that differs is under one of these.
PARSED_CONFIGS = {"pyproject.toml": "toml", "setup.cfg": "ini", "tox.ini": "ini"}
HARMLESS_KEYS = {
    "toml": (
        "project.version",
        "project.description",
        "project.readme",
        "project.authors",
        "project.maintainers",
        "project.classifiers",
        "project.keywords",
        "project.urls",
        "project.license",
        "project.requires-python",
        "project.dependencies",
        "project.optional-dependencies",
        "tool.poetry.version",
        "tool.poetry.description",
        "tool.poetry.dependencies",
        "tool.poetry.group",
        "tool.black",
        "tool.ruff",
        "tool.isort",
        "tool.mypy",
        "tool.pylint",
        "tool.bumpversion",
        "tool.towncrier",
        "tool.codespell",
    ),
    "ini": (
        "metadata",
        "options.install_requires",
        "options.extras_require",
        "options.python_requires",
        "flake8",
        "isort",
        "mypy",
        "pycodestyle",
        "pydocstyle",
        "bdist_wheel",
        "bumpversion",
    ),
}
# Top-level names a new module must never take (beyond what the task's environment can import, measured per task):
# the runner, its plugins and helpers, the grader's own modules.
RUNNER_NAMES = frozenset(
    {
        "pytest",
        "_pytest",
        "py",
        "pluggy",
        "iniconfig",
        "packaging",
        "exceptiongroup",
        "tomli",
        "tomllib",
        "_distutils_hack",
        "distutils",
        "setuptools",
        "pkg_resources",
        "pip",
        "typing_extensions",
        "six",
        "attr",
        "attrs",
        "hypothesis",
        "coverage",
        "xdist",
        "mock",
        "nose",
        "importlib_metadata",
        "zipp",
        "swe_gym_guard",
        "swe_gym_launch",
    }
)


def norm(path: str) -> str:
    """How paths compare: NFKC, then case folded."""
    return unicodedata.normalize("NFKC", path).casefold()


@dataclass(frozen=True)
class BaseTree:
    """What base_commit's tree and the task's environment hold, measured once per task (`grader.base_tree`)."""

    files: frozenset[str]  # normalised paths of every file
    dirs: frozenset[str]  # normalised folders ('' is the root)
    packages: frozenset[str]  # normalised folders with an __init__.py
    importable: frozenset[str]  # normalised top-level names the environment imports (stdlib and installed)
    configs: dict[str, str] = field(default_factory=dict)  # path -> text of pyproject.toml / setup.cfg / tox.ini

    @classmethod
    def of(cls, files: list[str], importable: list[str], configs: dict[str, str]) -> BaseTree:
        normed = [norm(f) for f in files]
        dirs = {""}
        for f in normed:
            parts = f.split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        packages = {str(PurePosixPath(f).parent) if "/" in f else "" for f in normed if f.endswith("/__init__.py")}
        packages |= {"" for f in normed if f == "__init__.py"}
        return cls(frozenset(normed), frozenset(dirs), frozenset(packages), frozenset(map(norm, importable)), configs)


def shadowed_names(tree: BaseTree | None) -> frozenset[str]:
    names = RUNNER_NAMES | {norm(n) for n in sys.stdlib_module_names}
    return names | tree.importable if tree is not None else names


def split_patch(patch: str) -> list[tuple[str, str]]:
    """(path, section) per file of a git diff; text before the first file header is kept with path ''."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    return [((patch_files(s) or [""])[0], s) for s in sections if s]


def task_verdict_files(task: Task) -> list[str]:
    return integrity.verdict_files(task.test_files(), [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])


def _module_name(n: str) -> str | None:
    """The top-level name a file would be imported as from its folder (None: not importable by name)."""
    name = PurePosixPath(n).name
    if name.endswith(".py"):
        return name[:-3]
    return None


def path_reason(path: str, verdict: set[str], tree: BaseTree | None, new: bool) -> str | None:
    """Why a model patch may not touch ``path`` (None: it may). ``new``: the patch creates it (or renames onto it)."""
    n = norm(path)
    p = PurePosixPath(n)
    if not path or path.startswith("/") or ".." in p.parts or ".git" in p.parts or "\\" in path:
        return "outside the project's tree"
    if n in verdict:
        return "a test file of the verdict"
    if p.name == "__init__.py" and any(str(PurePosixPath(v).parent / "__init__.py") == n for v in verdict):
        return "the package init of a test file of the verdict (it runs before the tests are imported)"
    if p.name in NEVER_NAMES:
        return "a file Python or pytest reads as configuration or start-up code"
    if p.name.endswith(NEVER_SUFFIXES) or "__pycache__" in p.parts:
        return "Python start-up, bytecode or extension file"
    if any(part.endswith(NEVER_PARTS_SUFFIXES) for part in p.parts):
        return "installed-package metadata (entry points)"
    if tree is None:  # base_commit not measured: judged by name alone, as a top-level module
        top = p.parts[0]
        mod = top[:-3] if top.endswith(".py") else top if len(p.parts) > 1 else None
        if new and mod is not None and (mod in shadowed_names(None) or mod.startswith("pytest_")):
            return f"a new top-level module that could be imported in place of {mod!r}"
        return None
    if not new:
        return None
    parent = str(p.parent) if "/" in n else ""
    if parent not in tree.dirs:
        return "a folder base_commit does not have"
    if parent not in tree.packages:  # a folder that can be on sys.path: a new name there is a top-level module
        if p.name == "__init__.py":
            return "turns a folder into a package (it changes what pytest imports, and how)"
        mod = _module_name(n)
        if mod is not None and (mod in shadowed_names(tree) or mod.startswith("pytest_")):
            return f"a new top-level module that could be imported in place of {mod!r}"
    return None


def protected_reason(path: str, verdict_files: set[str], tree: BaseTree | None = None, new: bool = True) -> str | None:
    """Why a model patch may not touch ``path`` (None: it may); without ``tree``, as if the path were new."""
    return path_reason(path, {norm(v) for v in verdict_files}, tree, new)


# -- configuration files, compared by their parsers -----------------------------------------------------------------
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_section(base: str, section: str) -> str | None:
    """The file one git diff section makes of ``base`` (exact context, as `git apply`); None where it does not
    apply."""
    old = base.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    lines = section.splitlines(keepends=True)
    i = next((k for k, line in enumerate(lines) if line.startswith("@@")), len(lines))
    if "new file mode" in section.split("\n@@", 1)[0]:
        old = []
    while i < len(lines):
        m = HUNK.match(lines[i])
        if not m:
            return None
        start = max(int(m.group(1)) - 1, 0) if (m.group(2) or "1") != "0" else int(m.group(1))
        if start < pos:
            return None
        out += old[pos:start]
        pos = start
        i += 1
        while i < len(lines) and not lines[i].startswith("@@"):
            line = lines[i]
            tag, text = line[:1], line[1:]
            if tag == "\\":  # "\ No newline at end of file": the previous line lost its newline
                if out and out[-1].endswith("\n") and lines[i - 1][:1] in "+ ":
                    out[-1] = out[-1][:-1]
                i += 1
                continue
            if tag in (" ", "-"):
                if pos >= len(old) or old[pos].rstrip("\r\n") != text.rstrip("\r\n"):
                    return None
                if tag == " ":
                    out.append(old[pos])
                pos += 1
            elif tag == "+":
                out.append(text if text.endswith("\n") else text + "\n")
            elif line.strip():
                return None
            i += 1
    return "".join(out + old[pos:])


def _flatten(value: object, prefix: str, out: dict[str, object]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif prefix:
        out[prefix] = value


def _parsed(kind: str, text: str) -> dict[str, object]:
    if kind == "toml":
        data: dict = tomllib.loads(text)
    else:
        cp = configparser.RawConfigParser(strict=False, interpolation=None)
        cp.read_string(text)
        data = {s: dict(cp.items(s)) for s in cp.sections()}
    flat: dict[str, object] = {}
    _flatten(data, "", flat)
    return flat


def config_change_reason(path: str, base: str | None, section: str) -> str | None:
    """Why a change to a parsed configuration file is dropped (None: every key it changes is harmless)."""
    kind = PARSED_CONFIGS[PurePosixPath(norm(path)).name]
    if base is None and "new file mode" not in section:
        return "a configuration file base_commit's record does not hold"
    new = apply_section(base or "", section)
    if new is None:
        return "a configuration file change that does not apply to base_commit's copy"
    if "deleted file mode" in section:
        return "deletes a configuration file"
    try:
        before, after = _parsed(kind, base or ""), _parsed(kind, new)
    except (tomllib.TOMLDecodeError, configparser.Error, UnicodeError, ValueError) as e:
        return f"a configuration file its parser rejects ({type(e).__name__})"
    changed = {k for k in before.keys() | after.keys() if before.get(k, None) != after.get(k, None)}
    allowed = HARMLESS_KEYS[kind]
    bad = sorted(k for k in changed if not any(norm(k) == a or norm(k).startswith(a + ".") for a in allowed))
    if bad:
        return f"changes configuration keys read at test time or build time: {bad[:5]}"
    return None


def filter_model_patch(patch: str, task: Task, tree: BaseTree | None = None) -> tuple[str, list[str]]:
    """(kept patch, dropped paths): every file section that names a path the allowlist does not keep is dropped
    whole (a rename by both its names). Without ``tree`` (base_commit not measured), new files are judged by name
    alone and configuration files are dropped."""
    verdict = {norm(v) for v in task_verdict_files(task)}
    configs = {norm(k): v for k, v in (tree.configs if tree is not None else {}).items()}
    kept, dropped = [], []
    for path, section in split_patch(patch):
        if not path:
            continue  # text before the first file header: nothing `git apply` acts on
        paths = integrity.section_paths(section) or [path]
        head = section.split("\n@@", 1)[0]
        why = "a symlink" if integrity.is_symlink_section(section) else None
        for p in paths:
            if why:
                break
            new = tree is not None and norm(p) not in tree.files
            why = path_reason(p, verdict, tree, new)
            if why is None and PurePosixPath(norm(p)).name in PARSED_CONFIGS:
                if "rename from" in head or "copy from" in head or tree is None:
                    why = "a configuration file renamed, copied or not measured at base_commit"
                else:
                    why = config_change_reason(p, configs.get(norm(p)), section)
        if why:
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def reset_verdict_files(task: Task) -> list[str]:
    """After the model patch: the verdict's files reset to base_commit one by one (a file new in the test patch is
    removed: the test patch creates it)."""
    q, base = shlex.quote, shlex.quote(task.base_commit)
    files = " ".join(q(f) for f in task_verdict_files(task))
    if not files:
        return []
    return [f'for f in {files}; do git checkout -q {base} -- "$f" 2>/dev/null || rm -rf -- "$f"; done']
