"""Build stand-ins of SWE-Gym task images offline, from the Debian base image of scripts/setup_docker.sh.

    python -m swe_gym_env.tasks.pypi_fixes.standin                 # every task of the pypi split
    python -m swe_gym_env.tasks.pypi_fixes.standin --rows X.jsonl  # rows of another file (install_config + bundle)
    python -m swe_gym_env.tasks.pypi_fixes.standin --force         # rebuild even when present

One shared layer (`swe-gym-env-standin/base:bookworm`): the base image without Node (Debian's nodejs purged), a
Miniconda-shaped /opt/miniconda3 whose `bin/activate` defines a `conda` shell function, so that
`source /opt/miniconda3/bin/activate && conda activate testbed` activates /opt/miniconda3/envs/testbed; no pytest on
the system Python. Then one thin layer per task, tagged with the row's `docker_image`: /opt/miniconda3/envs/testbed
(a venv of the image's Python holding exactly the packages of the task's `local` venv, the row's `install_config`
resolved once with network on the host), the repo at /testbed at base_commit with the row's `install` run in it.
Containers run with `--network none`: packages come from a wheelhouse the host downloads first (pinned by that
venv's `pip freeze`). An image whose recipe label matches is skipped, so a CI run builds each once.
Where a stand-in differs from a real SWE-Gym image: tasks/pypi_fixes/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from swe_gym_env.core.assets import cache_dir
from swe_gym_env.core.procs import pip_download
from swe_gym_env.tasks.envs import EnvError, build_env, read_meta, task_env
from swe_gym_env.tasks.models import Task

BASE_IMAGE = os.environ.get("SWE_GYM_DOCKER_IMAGE", "swe-gym-env/base:bookworm")
STANDIN_BASE = "swe-gym-env-standin/base:bookworm"
LABEL = "swe-gym-env.standin.recipe"
RECIPE = 2  # bump when the recipe below changes (rebuilds every stand-in)
WHEELS = "/opt/swe-gym-wheels"
BUNDLE = "/opt/swe-gym-repo.bundle"

CONDA_SH = r"""# Stand-in for Miniconda's etc/profile.d/conda.sh (swe_gym_env; not conda): a `conda` shell function that
# activates the environments under /opt/miniconda3/envs (plain venvs) and /opt/miniconda3 itself as `base`.
_CONDA_ROOT=/opt/miniconda3
conda() {
    case "${1:-}" in
    activate)
        _conda_env="${2:-base}"
        _conda_prefix="$_CONDA_ROOT/envs/$_conda_env"
        [ "$_conda_env" = base ] && _conda_prefix="$_CONDA_ROOT"
        if [ ! -d "$_conda_prefix" ]; then
            echo "EnvironmentNameNotFound: Could not find conda environment: $_conda_env" >&2
            return 1
        fi
        conda deactivate
        PATH="$_conda_prefix/bin:$PATH"
        CONDA_PREFIX="$_conda_prefix"
        CONDA_DEFAULT_ENV="$_conda_env"
        CONDA_PROMPT_MODIFIER="($_conda_env) "
        CONDA_SHLVL=1
        export PATH CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER CONDA_SHLVL
        hash -r 2>/dev/null || true
        ;;
    deactivate)
        if [ -n "${CONDA_PREFIX:-}" ]; then
            PATH=$(printf '%s' "$PATH" | sed "s#$CONDA_PREFIX/bin:##")
            export PATH
        fi
        unset CONDA_PREFIX CONDA_DEFAULT_ENV CONDA_PROMPT_MODIFIER
        CONDA_SHLVL=0
        export CONDA_SHLVL
        hash -r 2>/dev/null || true
        ;;
    *)
        "$_CONDA_ROOT/bin/conda" "$@"
        ;;
    esac
}
"""

# Miniconda's bin/activate: source conda.sh, then `conda activate "$@"` (no argument: base).
ACTIVATE = """\\. /opt/miniconda3/etc/profile.d/conda.sh || return $?
conda activate "$@"
"""

CONDA_BIN = r"""#!/bin/sh
# Stand-in for the conda executable (swe_gym_env): lists environments; activation needs the shell function.
case "${1:-}" in
env | info)
    echo "# conda environments (swe-gym-env stand-in of Miniconda):"
    echo "base  /opt/miniconda3"
    for d in /opt/miniconda3/envs/*; do [ -d "$d" ] && echo "$(basename "$d")  $d"; done
    ;;
activate | deactivate)
    echo "CondaError: Run 'source /opt/miniconda3/bin/activate' before 'conda $1'." >&2
    exit 1
    ;;
*)
    echo "conda: swe-gym-env's stand-in of Miniconda has only 'activate', 'deactivate' and 'env list'" >&2
    exit 1
    ;;
esac
"""

BASE_SCRIPT = f"""set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get purge -y -qq --auto-remove nodejs 'libnode*' 'node-*' >/dev/null 2>&1 || true
dpkg --purge nodejs >/dev/null 2>&1 || true
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/share/doc/nodejs /usr/include/node
if command -v node >/dev/null || find / -xdev \\( -name node -o -name nodejs \\) -type f 2>/dev/null | grep -q .; then
    echo "node is still present" >&2; exit 1
fi
mkdir -p /opt/miniconda3/bin /opt/miniconda3/envs /opt/miniconda3/etc/profile.d /testbed
ln -sf /usr/bin/python3 /opt/miniconda3/bin/python3
ln -sf /usr/bin/python3 /opt/miniconda3/bin/python
cat > /opt/miniconda3/etc/profile.d/conda.sh <<'SWE_GYM_CONDA_SH'
{CONDA_SH}SWE_GYM_CONDA_SH
cat > /opt/miniconda3/bin/activate <<'SWE_GYM_ACTIVATE'
{ACTIVATE}SWE_GYM_ACTIVATE
cat > /opt/miniconda3/bin/conda <<'SWE_GYM_CONDA'
{CONDA_BIN}SWE_GYM_CONDA
chmod 0755 /opt/miniconda3/bin/activate /opt/miniconda3/bin/conda
echo 'source /opt/miniconda3/etc/profile.d/conda.sh && conda activate testbed' > /root/.bashrc
if ! grep -q '^nonroot:' /etc/passwd; then  # (minbase has no useradd)
    echo 'nonroot:x:1000:1000:dog:/home/nonroot:/bin/bash' >> /etc/passwd
    echo 'nonroot:x:1000:' >> /etc/group
    mkdir -p /home/nonroot && chown 1000:1000 /home/nonroot
fi
if python3 -c 'import pytest' 2>/dev/null; then echo "pytest is on the system Python" >&2; exit 1; fi
git config --system --add safe.directory '*'
"""


# As SWE-bench's images: Miniconda's bin first on PATH, UTC, bash.
BASE_CHANGES = [
    "ENV PATH=/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV TZ=Etc/UTC",
    'CMD ["/bin/bash"]',
]


def docker(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which("docker")
    if exe is None:
        raise SystemExit("docker CLI missing: run scripts/setup_docker.sh")
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"docker {args[0]} failed: {(r.stderr or r.stdout).strip()[-1500:]}")
    return r


def image_label(image: str) -> str | None:
    r = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}"}}}}', image, check=False)
    return r.stdout.strip() if r.returncode == 0 else None


def image_id(image: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()


def run_and_commit(
    from_image: str, script: str, tag: str, recipe: str, mounts: dict[str, str], changes: list[str]
) -> None:
    name = f"swe-gym-standin-build-{os.getpid()}-{hashlib.sha256(tag.encode()).hexdigest()[:8]}"
    args = ["run", "--name", name, "--network", "none", "--workdir", "/"]
    for host, inside in mounts.items():
        args += ["--mount", f"type=bind,source={host},target={inside},readonly"]
    try:
        r = docker(*args, from_image, "/bin/bash", "-c", script, check=False, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"building {tag} failed (exit {r.returncode}): {(r.stdout + r.stderr)[-2500:]}")
        commit = ["commit", "--change", f"LABEL {LABEL}={recipe}"]
        for change in changes:
            commit += ["--change", change]
        docker(*commit, name, tag)
    finally:
        docker("rm", "-f", name, check=False)


def build_base(force: bool = False, log=print) -> str:
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        raise SystemExit(f"base image {BASE_IMAGE} missing: run scripts/setup_docker.sh")
    blob = f"{RECIPE}\n{image_id(BASE_IMAGE)}\n{BASE_SCRIPT}\n{BASE_CHANGES}"
    recipe = hashlib.sha256(blob.encode()).hexdigest()[:16]
    if not force and image_label(STANDIN_BASE) == recipe:
        log(f"{STANDIN_BASE}: present")
        return recipe
    log(f"{STANDIN_BASE}: building from {BASE_IMAGE}")
    run_and_commit(BASE_IMAGE, BASE_SCRIPT, STANDIN_BASE, recipe, {}, BASE_CHANGES)
    return recipe


def wheelhouse(task: Task, log=print) -> Path:
    """Wheels (an sdist where a release has none) of exactly what the task's local venv holds, and its pip: the
    image build is offline."""
    env = task_env(task)
    assert env is not None
    build_env(task, log=log)
    freeze = [
        line
        for line in read_meta(env.host_path).get("freeze", [])
        if line and not line.startswith(("-e ", "#")) and "==" in line and " @ " not in line
    ]
    dest = cache_dir() / "wheelhouse" / env.key
    marker = dest / ".complete"
    if marker.is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "constraints.txt").write_text("\n".join(freeze) + "\n")
    log(f"{task.instance_id}: downloading {len(freeze)} wheels")
    platforms = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "any")
    r = pip_download(
        dest,
        freeze,
        "--prefer-binary",
        "--python-version",
        f"{sys.version_info.major}.{sys.version_info.minor}",
        *(arg for platform in platforms for arg in ("--platform", platform)),
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"},
    )
    if r.returncode != 0:
        raise EnvError(f"{task.instance_id}: could not download the wheels of its environment: {r.stderr[-800:]}")
    marker.write_text("ok\n")
    return dest


def task_script(task: Task) -> str:
    cfg = task.install_config
    assert cfg is not None
    q = shlex.quote
    reqs = " ".join(q(r) for r in cfg.pip_packages)
    lines = [
        "set -eu",
        "python3 -m venv --without-pip /opt/miniconda3/envs/testbed",
        f'/opt/miniconda3/envs/testbed/bin/python "$(ls {WHEELS}/pip-*.whl | head -1)/pip" install -q --no-index '
        f"--find-links {WHEELS} -c {WHEELS}/constraints.txt pip",
        "set +u; source /opt/miniconda3/bin/activate && conda activate testbed; set -u",
        f"export PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_CONSTRAINT={WHEELS}/constraints.txt "
        "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
        *([f"pip install -q {reqs}"] if reqs else []),
        *[f"pip install -q -r {q(p)}" for p in cfg.reqs_path],
        f"git clone -q {BUNDLE} {q(task.workdir)}",
        f"cd {q(task.workdir)}",
        f"git reset -q --hard {q(task.base_commit)}",
        "git remote remove origin",
        *[line for line in cfg.pre_install],
        *([cfg.install] if cfg.install else []),
        # what the install left in the work tree (egg-info, build dirs) is not part of the repo: keep it out of diffs
        "git status --porcelain --untracked-files=all | sed -n 's/^?? //p' >> .git/info/exclude",
        "test -z \"$(git status --porcelain)\" || { git status --short >&2; echo 'install changed tracked files' >&2; "
        "exit 1; }",
        f"find {q(task.workdir)} -name __pycache__ -prune -exec rm -rf {{}} + 2>/dev/null || true",
        "unset PIP_NO_INDEX PIP_FIND_LINKS PIP_CONSTRAINT",
        "python -c 'import sys; print(sys.prefix)'",
    ]
    return "\n".join(lines) + "\n"


def build_task_image(task: Task, base_recipe: str, force: bool = False, log=print) -> str:
    if not task.image or not task.repo_source or task.install_config is None:
        raise ValueError(f"{task.instance_id}: a stand-in needs an image name, a local repository and install_config")
    env = task_env(task)
    assert env is not None
    script = task_script(task)
    recipe = hashlib.sha256(f"{base_recipe}\n{env.key}\n{task.base_commit}\n{script}".encode()).hexdigest()[:16]
    if not force and image_label(task.image) == recipe:
        log(f"{task.image}: present")
        return task.image
    wheels = wheelhouse(task, log)
    log(f"{task.image}: building")
    changes = [
        "WORKDIR /testbed",
        'CMD ["/bin/bash"]',
        f"LABEL swe-gym-env.standin.instance={task.instance_id}",
        f"LABEL swe-gym-env.standin.base_commit={task.base_commit}",
    ]
    mounts = {str(wheels): WHEELS, str(Path(task.repo_source).resolve()): BUNDLE}
    run_and_commit(STANDIN_BASE, script, task.image, recipe, mounts, changes)
    return task.image


def tasks_from(rows: str | None) -> list[Task]:
    if rows is None:
        from swe_gym_env.tasks.catalog import pypi_tasks

        return list(pypi_tasks())
    from swe_gym_env.tasks.loaders import load_tasks

    report = load_tasks(rows)
    if report.skipped:
        raise SystemExit("; ".join(report.skipped))
    return report.tasks


def build_all(tasks: list[Task], force: bool = False, log=print) -> list[str]:
    recipe = build_base(force, log)
    return [build_task_image(t, recipe, force, log) for t in tasks]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", help="a .jsonl of SWE-rebench-style rows (default: the pypi split)")
    parser.add_argument("--force", action="store_true", help="rebuild even when an image with this recipe exists")
    parser.add_argument("--json", action="store_true", help="print the built image names as JSON")
    args = parser.parse_args(argv)
    try:
        images = build_all(tasks_from(args.rows), args.force)
    except (RuntimeError, EnvError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(images) if args.json else f"{len(images)} stand-in images ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
