"""What the Python agents (mini-swe-agent, OpenHands, Kimi CLI, Mistral Vibe, Aider, Hermes, Terminus-2) share: a
launcher script of ours run by the bundle's own Python (`pyruntime`), which logs every socket the agent's Python opens
(`AUDIT`, read back by the network tests), the agent's config as a 0600 file, the session key in a 0600 env file sourced
by the command (never argv), and the variables that keep the agent and litellm offline (`quiet`) exported, those that
would turn telemetry on (`unset`) removed. The ones that need Python >= 3.12 share the Debian runtime's install
(`DebianPythonAgent`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar

from swe_gym_env.server.agents import pyruntime
from swe_gym_env.server.agents.base import (
    AGENT_HOME,
    BUNDLE_MOUNT,
    KEY_FILE,
    LOAD_KEY,
    AgentConfig,
    AgentError,
    key_file,
)
from swe_gym_env.server.agents.bundle import PRUNE_SUFFIXES, SKIP_DIRS, BundledHarness, bundles_dir
from swe_gym_env.server.agents.provision import pip_downloads

# what litellm and the Hugging Face hub client beneath the litellm-based agents honour: no fetch, no telemetry
LITELLM_QUIET = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else a fetch of model_prices_and_context_window.json from GitHub
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOG": "ERROR",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}
# the launcher's first lines: every connect / name lookup / datagram of the agent's Python, one JSON line each, to
# the file $SWE_GYM_NET_LOG names (the variable is taken out before the agent runs)
AUDIT = """import json, os, sys
NET = os.environ.pop("SWE_GYM_NET_LOG")
def _audit(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.sendto"):
        try:
            with open(NET, "a") as f:
                f.write(json.dumps([event, repr(args[1] if event == "socket.connect" else args[:2])]) + "\\n")
        except OSError:
            pass
sys.addaudithook(_audit)
"""


class PythonAgent(BundledHarness):
    """A Python agent run by its launcher (`launcher`, written to `launch_path` per rollout) on the bundle's Python
    `python_version`, its output to `log_path`, its sockets to `net_path`."""

    installer: ClassVar[str] = "pip install"
    needs_node: ClassVar[bool] = False
    min_glibc: ClassVar[str] = "2.17"  # its own loader and C library: the image's glibc is never used
    bundle_verifier: ClassVar[str | None] = None
    python_version: ClassVar[str] = pyruntime.VERSION
    key_env: ClassVar[str] = "OPENAI_API_KEY"  # litellm's openai provider reads it at call time
    launcher: ClassVar[str]  # the script: AUDIT, then the agent's own start
    launch_path: ClassVar[str]
    config_path: ClassVar[str]
    net_path: ClassVar[str]
    log_path: str
    quiet: ClassVar[dict[str, str]] = {}
    unset: ClassVar[tuple[str, ...]] = ()
    unset_prefix: ClassVar[str] = ""  # every variable of the image's environment with this prefix is unset too

    def finished_install(self) -> Path:
        """Its install directory, holding a finished install (`ensure_installed` marks it last), else AgentError."""
        root = self.install_dir()
        if not (root / ".installed").is_file():
            raise AgentError("install", f"{root} holds no finished install of {self.name}")
        return root

    def install_key(self) -> tuple[str, ...]:
        """What its install is made from, the mark `.installed` holds: a change reinstalls it."""
        return self.bundle_inputs

    def build_install(self, root: Path, log=print) -> None:
        """Builds its install into ``root`` (made, its mark taken away)."""
        raise NotImplementedError

    def ensure_installed(self, log=print) -> Path:
        """Its install directory: as it is where it holds a finished install of the same `install_key`, else built
        afresh by `build_install` and marked finished last."""
        root = self.install_dir()
        done = root / ".installed"
        key = "\n".join(self.install_key())
        if done.is_file() and done.read_text() == key:
            return root
        root.mkdir(parents=True, exist_ok=True)
        done.unlink(missing_ok=True)
        self.build_install(root, log)
        done.write_text(key)
        return root

    def config_text(self, cfg: AgentConfig, prompt: str) -> bytes:
        raise NotImplementedError

    def extra_files(self) -> dict[str, tuple[bytes, int]]:
        return {}

    def launch_args(self, cfg: AgentConfig) -> str:
        raise NotImplementedError

    def config_files(self, cfg: AgentConfig, key: str, prompt: str) -> dict[str, tuple[bytes, int]]:
        return {
            self.config_path: (self.config_text(cfg, prompt), 0o600),
            self.launch_path: (self.launcher.encode(), 0o600),
            **self.extra_files(),
            KEY_FILE: key_file({self.key_env: key}),
        }

    def environment(self) -> str:
        """The shell lines before the agent starts: the key sourced, what would turn telemetry on unset, what keeps it
        offline exported, its socket log named."""
        quiet = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.quiet.items())
        unset = f"unset {' '.join(self.unset)}\n" if self.unset else ""
        if self.unset_prefix:  # the agent's own config layer from the environment: none of the image's reaches it
            p = self.unset_prefix
            unset += f"for v in $(env | sed -n 's/^\\({p}[A-Za-z0-9_]*\\)=.*/\\1/p'); do unset \"$v\"; done\n"
        return (
            f"{LOAD_KEY}{unset}"
            f"export {quiet} SWE_GYM_NET_LOG={self.net_path} XDG_CONFIG_HOME={AGENT_HOME}/.config "
            f"XDG_CACHE_HOME={AGENT_HOME}/.cache\n"
        )

    def command(self, cfg: AgentConfig) -> str:
        return (
            self.environment()
            + f"{pyruntime.python_command(BUNDLE_MOUNT, self.python_version)} {self.launch_path} "
            + f"{self.launch_args(cfg)} < /dev/null > {self.log_path} 2>&1"
        )


class DebianPythonAgent(PythonAgent):
    """A Python agent that needs a newer Python than the host's (OpenHands, Kimi CLI, Mistral Vibe: >= 3.12): Debian
    trixie's CPython 3.13 with trixie's own loader and C library (`pyruntime.TRIXIE_PYTHON`), its packages (`pins`, a
    full list: no resolution at install time) by that runtime's pip, every module compiled, its libraries shipped;
    `imports` is what its self-test imports after the build. A subclass sets `bundle_inputs` to
    `(*RUNTIME.recipe(), *pins)` (plus whatever else its install is built from)."""

    python_runtime: ClassVar[str | None] = "debian"
    python_version: ClassVar[str] = pyruntime.TRIXIE_PYTHON.version
    package: ClassVar[str]  # its PyPI name, pinned in `pins` at `version`
    pins: ClassVar[tuple[str, ...]]
    sdists: ClassVar[tuple[str, ...]] = ()  # pinned packages the index has no wheel of: built from their sdist
    imports: ClassVar[str]
    debian: ClassVar[pyruntime.DebianPython] = pyruntime.TRIXIE_PYTHON  # its runtime's packages (and any binaries')

    def add_binaries(self, root: Path, unpacked: Path, log=print) -> tuple[Path, ...]:
        """Executables of its own it takes from ``unpacked`` (the `debian` packages, unpacked) into ``root``, before
        the libraries are shipped (theirs go into the runtime's lib/ too); none by default."""
        return ()

    def build_install(self, root: Path, log=print) -> None:
        downloads, runtime, py = bundles_dir() / ".downloads", self.debian, self.python_version
        pyruntime.build_debian_runtime(root, runtime, downloads / "debian", log)
        log(f"pip install {len(self.pins)} pinned packages ({self.package}=={self.version}) into its bundle")
        pyruntime.pip_install(root, self.pins, downloads / "pip", log, py, self.sdists)
        lister = pyruntime.debian_lister(root / pyruntime.RUNTIME, runtime, downloads / "debian")
        binaries = self.add_binaries(root, downloads / "debian" / runtime.folder / "root", log)
        n = pyruntime.ship_libraries(
            root / pyruntime.RUNTIME, root / pyruntime.SITE, version=py, lister=lister, binaries=binaries
        )
        log(f"agent runtime: {n} libraries")
        pyruntime.compile_all(root, py)
        log(f"agent runtime: {pyruntime.self_test(root, self.imports, py)}")

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        root = self.finished_install()
        return {pyruntime.RUNTIME: root / pyruntime.RUNTIME, pyruntime.SITE: root / pyruntime.SITE}


def without(src: Path, rel: str, pruned: tuple[str, ...]) -> dict[str, Path]:
    """The directory ``src`` as bundle contents at ``rel`` (bundle-relative path -> host path), less the ``pruned``
    paths under it: each directory on the way to one is listed entry by entry, taking of it what a whole-tree copy
    (`bundle._copy_in`) would (no links to directories, no `SKIP_DIRS`, no `PRUNE_SUFFIXES`, no dangling links); the
    rest is listed whole."""
    if not pruned:
        return {rel: src}
    out: dict[str, Path] = {}
    for child in sorted(src.iterdir()):
        if child.name in pruned:
            continue
        if child.is_dir():
            if not child.is_symlink() and child.name not in SKIP_DIRS:
                below = tuple(p.split("/", 1)[1] for p in pruned if p.startswith(child.name + "/"))
                out.update(without(child, f"{rel}/{child.name}", below))
        elif child.is_file() and not child.name.endswith(PRUNE_SUFFIXES):
            out[f"{rel}/{child.name}"] = child
    return out


class HostPythonAgent(PythonAgent):
    """A Python agent on the host's CPython 3.11 made relocatable (`pyruntime.build_runtime`: its own loader and C
    library): mini-swe-agent, Aider. `pins` is a full list (no resolution at install time), installed by that
    runtime's pip; `pruned` are paths under `site/` its bundle leaves out (never loaded by the agent); `imports` is
    what its self-test imports. A subclass sets `install_inputs` to `(*pyruntime.recipe(), *pins)` and
    `bundle_inputs` to `(*install_inputs, *(f"prune {p}" for p in pruned))`."""

    python_runtime: ClassVar[str | None] = "host"
    package: ClassVar[str]
    pins: ClassVar[tuple[str, ...]]
    pruned: ClassVar[tuple[str, ...]] = ()
    imports: ClassVar[str]
    install_inputs: ClassVar[tuple[str, ...]]  # what its install is made from (a change reinstalls it)

    def install_key(self) -> tuple[str, ...]:
        return self.install_inputs  # its pruning is the bundle's, not the install's: a change of it reinstalls nothing

    def build_install(self, root: Path, log=print) -> None:
        pyruntime.build_runtime(root, log)
        log(f"pip install {len(self.pins)} pinned packages ({self.package}=={self.version}) into its bundle")
        pyruntime.pip_install(root, self.pins, pip_downloads(), log)
        log(f"agent runtime: {pyruntime.ship_libraries(root / pyruntime.RUNTIME, root / pyruntime.SITE)} libraries")
        pyruntime.compile_all(root)
        log(f"agent runtime: {pyruntime.self_test(root, self.imports)}")

    def bundle_contents(self, artifacts: dict[str, Path]) -> dict[str, Path]:
        root = self.finished_install()
        return {
            pyruntime.RUNTIME: root / pyruntime.RUNTIME,
            **without(root / pyruntime.SITE, pyruntime.SITE, self.pruned),
        }
