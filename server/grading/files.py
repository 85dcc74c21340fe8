"""The file filter and the pins: what of the model patch reaches the grading tree, and what is reset to base_commit
(threat model items 1 and 2 in `swe_gym_env.server.grading`)."""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from swe_gym_env.server.grading import integrity
from swe_gym_env.server.grading.integrity import PINNED_CONFIGS
from swe_gym_env.server.grading.plan import PINNED
from swe_gym_env.tasks.models import Task, patch_files


def split_patch(patch: str) -> list[tuple[str, str]]:
    """(path, section) per file of a git diff; text before the first file header is kept with path ''."""
    sections = re.split(r"(?m)^(?=diff --git )", patch)
    return [((patch_files(s) or [""])[0], s) for s in sections if s]


def task_verdict_files(task: Task) -> list[str]:
    return integrity.verdict_files(task.test_files(), [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])


def filter_model_patch(patch: str, task: Task) -> tuple[str, list[str]]:
    """(kept patch, dropped paths): every file section naming a protected path (threat model, item 1) is dropped."""
    verdict = set(task_verdict_files(task))
    kept, dropped = [], []
    for path, section in split_patch(patch):
        paths = integrity.section_paths(section) or [path]
        if integrity.is_symlink_section(section) or any(integrity.protected_reason(p, verdict) for p in paths):
            dropped.append(path)
        else:
            kept.append(section)
    return "".join(kept), dropped


def pinned_configs(patch: str) -> list[str]:
    """Files of the (filtered) patch whose pytest settings grading pins to base_commit."""
    paths = [p for _, section in split_patch(patch) for p in integrity.section_paths(section)]
    return list(dict.fromkeys(p for p in paths if PurePosixPath(p).name in PINNED_CONFIGS))


def _protect(task: Task, pinned: list[str]) -> list[str]:
    """After the model patch: pytest's settings pinned, then the verdict's files reset to base_commit one by one (a
    file new in the test patch is removed: the test patch creates it)."""
    q, base = shlex.quote, shlex.quote(task.base_commit)
    lines = []
    for f in pinned:
        lines.append(
            f"{{ git show {base}:{q(f)} > /tmp/grading/pin.base 2>/dev/null || : > /tmp/grading/pin.base; }}; "
            f'"$(command -v python3 || command -v python || echo false)" -I -S /tmp/grading/pin.py {q(f)} '
            f"/tmp/grading/pin.base || {{ git checkout -q {base} -- {q(f)} 2>/dev/null || rm -f -- {q(f)}; "
            f"echo {q(f'{PINNED} {f}')}; }}"
        )
    files = " ".join(q(f) for f in task_verdict_files(task))
    if files:
        lines.append(f'for f in {files}; do git checkout -q {base} -- "$f" 2>/dev/null || rm -rf -- "$f"; done')
    return lines
