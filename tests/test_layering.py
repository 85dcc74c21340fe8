"""The architecture as checks: import-linter's contracts and pyright (basic) over the package, both configured in
pyproject.toml (scripts/lint.sh runs the same), plus what import-linter cannot express: which third-party modules
the light modules load at run time, the one list of harness and backend names, and the agent versions' one place."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# -- ruff, import-linter and pyright ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["check", "."], ["format", "--check", "."]])
def test_ruff_is_clean(argv):
    out = subprocess.run([str(BIN / "ruff"), *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_import_contracts_are_kept():
    contracts = PYPROJECT["tool"]["importlinter"]["contracts"]
    out = subprocess.run(
        [str(BIN / "lint-imports"), "--no-logo", "--cache-dir", str(REPO / "build" / "import_linter_cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in out.stdout, out.stdout[-3000:]


def _function_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every `from swe_gym_env... import` inside a function."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("swe_gym_env"):
                    found.append((node.lineno, node.module or ""))
    return found


def test_no_import_inside_a_function_dodges_a_loop():
    """An import inside a function is there for a heavy or optional dependency (gradio, transformers), never to
    hide a cycle: for every one, the module it imports does not import, through any chain, the module it sits in
    (the graph import-linter builds, function-level imports included). The modules with such imports are listed."""
    import grimp

    graph = grimp.build_graph("swe_gym_env", cache_dir=None)
    files = subprocess.run(
        ["git", "ls-files", "-c", "-o", "--exclude-standard", "*.py"], cwd=REPO, capture_output=True, text=True
    ).stdout.split()
    lazy, loops = [], []
    for f in files:
        if f.startswith(("tests/", "tasks/bundled/", "scripts/")):
            continue
        mod = "swe_gym_env." + f[:-3].replace("/", ".").removesuffix(".__init__")
        for line, target in _function_level_imports(ast.parse((REPO / f).read_text())):
            if target not in graph.modules or target == mod or mod.startswith(target + "."):
                continue
            lazy.append(f"{f}:{line} {target}")
            if graph.chain_exists(importer=target, imported=mod):
                chain = graph.find_shortest_chain(importer=target, imported=mod)
                loops.append(f"{f}:{line} imports {target} in a function, and {' -> '.join(chain or ())}")
    assert lazy, "the scan found no function-level import at all: it is not reading the tree"
    assert not loops, "\n".join(loops)


def pyright_root() -> None:
    """build/pyright/swe_gym_env -> the repo root: how pyright resolves `swe_gym_env.*` (see [tool.pyright])."""
    link = REPO / "build" / "pyright" / "swe_gym_env"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and link.resolve() == REPO.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..") / "..", target_is_directory=True)


@pytest.mark.slow
def test_pyright_basic_finds_no_errors():
    assert PYPROJECT["tool"]["pyright"]["typeCheckingMode"] == "basic"
    pyright_root()
    out = subprocess.run([str(BIN / "pyright"), "--outputjson"], cwd=REPO, capture_output=True, text=True, timeout=900)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"pyright gave no report (rc {out.returncode}): {out.stdout[-3000:]} {out.stderr[-3000:]}")
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    shown = "\n".join(
        f"{Path(d['file']).relative_to(REPO)}:{d['range']['start']['line'] + 1}: [{d.get('rule', '')}] "
        f"{d['message'].splitlines()[0]}"
        for d in errors
    )
    assert report["summary"]["filesAnalyzed"] > 50, report["summary"]  # it did see the package
    assert not errors, f"{len(errors)} pyright errors:\n{shown}"


# -- what import-linter cannot express --------------------------------------------------------------------------
def loaded_after(stmt: str) -> set[str]:
    """Top-level names of the modules ``stmt`` loads into a fresh interpreter, beyond the stdlib and what the
    interpreter loads at start anyway (site hooks such as the editable install's finder)."""

    def top_level(statement: str) -> set[str]:
        code = f"import sys; {statement}; print('\\n'.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
        return set(out.stdout.split())

    new = top_level(stmt) - top_level("pass") - set(sys.stdlib_module_names)
    return {m for m in new if not m.startswith("_sysconfigdata")}  # stdlib, named per platform


def test_wire_loads_only_pydantic():
    pydantic = {"pydantic", "pydantic_core", "typing_extensions", "typing_inspection", "annotated_types"}
    assert loaded_after("import swe_gym_env.wire") <= {"swe_gym_env", *pydantic}


@pytest.mark.parametrize("module", ["swe_gym_env.core.names", "swe_gym_env.core.procs"])
def test_names_and_procs_are_stdlib_only(module):
    assert loaded_after(f"import {module}") == {"swe_gym_env"}


def test_runtime_code_reads_no_files_next_to_its_source():
    """Package data comes through importlib.resources; the checkout is an explicit setting (procs.checkout_dir)."""
    packages = PYPROJECT["tool"]["setuptools"]["package-dir"]
    roots = [REPO / d for name, d in packages.items() if name != "swe_gym_env"]
    files = [*REPO.glob("*.py"), *(f for r in roots for f in r.rglob("*.py"))]
    files = [f for f in files if "bundled" not in f.relative_to(REPO).parts]  # offline build scripts, data
    offenders = [str(f.relative_to(REPO)) for f in files if re.search(r"\b__file__\b", f.read_text())]
    assert not offenders, offenders


# -- the one list of names --------------------------------------------------------------------------------------
def test_registries_wire_and_cli_take_the_names_from_one_list():
    from swe_gym_env import cli, wire
    from swe_gym_env.core import names
    from swe_gym_env.server.agents.registry import HARNESSES, harness_class
    from swe_gym_env.server.sandbox.base import SandboxBase
    from swe_gym_env.server.sandbox.registry import BACKENDS, backend_class

    assert typing.get_args(wire.Harness) == tuple(names.HARNESSES) == tuple(HARNESSES)
    assert typing.get_args(wire.SandboxBackend) == tuple(names.SANDBOXES) == tuple(BACKENDS)
    assert names.DEFAULT_HARNESS in names.HARNESSES and names.DEFAULT_SANDBOX in names.SANDBOXES
    for name in names.HARNESSES:
        cls = harness_class(name)
        assert cls.name == name and isinstance(cls.needs_node, bool) and cls.min_context_tokens > 0
        assert isinstance(cls.needs_pty, bool) and cls.python_runtime in (None, "host", "debian")
    for name in ("local", "docker"):  # the others need optional SDKs; their classes load lazily
        cls = backend_class(name)
        assert issubclass(cls, SandboxBase) and cls.host_mounts and cls.takes_repo_source and not cls.needs_image
    assert backend_class("docker").uses_image and not backend_class("local").uses_image
    assert backend_class("local").has_ptys and backend_class("docker").has_ptys  # agents' terminals need one
    assert not backend_class("landlock").has_ptys  # none can be granted there: tests/test_openhands.py
    # argparse's choices come from the same tables
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--harness", "no-such-agent"])
    with pytest.raises(SystemExit):
        cli.main(["rollout", "--sandbox", "no-such-backend"])


def test_agent_versions_live_in_the_harness_classes():
    """Only the harness classes name agent packages and versions: the images get agents as bundles built from them
    (`swe-gym-env setup`), never an install of their own."""
    from swe_gym_env.server.agents.registry import HARNESSES

    images = {p.name: p.read_text() for p in (REPO / "Dockerfile", REPO / "space_app" / "sandbox.Dockerfile")}
    for name, cls in HARNESSES.items():
        for image, text in images.items():
            assert cls.package not in text and cls.version not in text, f"{image} names {name} {cls.version}"


def test_bench_is_reachable_from_the_cli_but_not_from_the_server():
    out = subprocess.run(
        [str(BIN / "swe-gym-env"), "bench", "--help"], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert out.returncode == 0 and "graph" in out.stdout
    assert not (REPO / "server" / "bench").exists()
