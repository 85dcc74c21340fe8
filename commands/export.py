"""`swe-gym-env export`: stored rollout results → JSONL, optionally uploaded to a Hub dataset."""

from __future__ import annotations

import os
from pathlib import Path

from swe_gym_env.server.rollout import ServerConfig
from swe_gym_env.wire import RolloutResult


def export_results(out: str, to_hub: str | None = None, only_ok: bool = False) -> int:
    store = ServerConfig.from_env().results_dir
    n = skipped = 0
    with open(out, "w") as f:
        for path in sorted(store.glob("*.json")) if store and store.is_dir() else []:
            try:
                result = RolloutResult.model_validate_json(path.read_text())
            except ValueError:
                skipped += 1
                continue
            if only_ok and not result.ok:
                continue
            f.write(result.model_dump_json() + "\n")
            n += 1
    print(f"exported {n} rollouts to {out}" + (f" ({skipped} unreadable files skipped)" if skipped else ""))
    if to_hub:
        upload_to_hub(Path(out), to_hub)
    return 0


def upload_to_hub(path: Path, repo_id: str) -> str:
    from huggingface_hub import HfApi

    api = HfApi(token=os.environ.get("HF_TOKEN") or None)
    api.create_repo(repo_id=repo_id, repo_type="dataset", exist_ok=True)
    info = api.upload_file(
        path_or_fileobj=str(path),
        path_in_repo=f"data/{path.name}",
        repo_id=repo_id,
        repo_type="dataset",
        commit_message=f"swe_gym_env export: {path.name}",
    )
    print(f"uploaded to {repo_id}: {info}")
    return str(info)
