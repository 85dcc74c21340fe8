"""Results store: every rollout is on disk from start to finish, so none is silently lost.

`<id>.running` is written when a rollout starts and replaced by `<id>.json` (written atomically) when it ends.
After a crash, `recover()` turns every `.running` left behind into a failed result.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import get_args

from swe_gym_env.wire import Phase, RolloutRequest, RolloutResult, RolloutSummary, failed_result

ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # ids become file names: nothing that could leave the dir


class ResultsStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _write(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def mark_running(self, rollout_id: str, req: RolloutRequest, phase: Phase = "validate") -> None:
        """Written at the start and again at each phase, so a restart can say where a rollout was cut short."""
        body = {"rollout_id": rollout_id, "request": req.model_dump(mode="json"), "phase": phase, "at": time.time()}
        self._write(self.root / f"{rollout_id}.running", json.dumps(body))

    def put(self, result: RolloutResult) -> None:
        self._write(self.root / f"{result.rollout_id}.json", result.model_dump_json())
        (self.root / f"{result.rollout_id}.running").unlink(missing_ok=True)

    def get(self, rollout_id: str) -> RolloutResult | None:
        if not ROLLOUT_ID.fullmatch(rollout_id):
            return None
        path = self.root / f"{rollout_id}.json"
        if not path.is_file():
            return None
        return RolloutResult.model_validate_json(path.read_text())

    def summaries(self, limit: int = 100) -> list[RolloutSummary]:
        paths = sorted(self.root.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
        out = []
        for p in paths:
            try:
                out.append(RolloutSummary.of_result(RolloutResult.model_validate_json(p.read_text())))
            except ValueError:
                continue
        return out

    def recover(self) -> list[str]:
        """Mark rollouts that were running when the server stopped as failed; returns their ids."""
        recovered = []
        for path in self.root.glob("*.running"):
            try:
                body = json.loads(path.read_text())
                req = RolloutRequest.model_validate(body["request"])
                rid = body["rollout_id"]
                phase = body.get("phase", "validate")
                if phase not in get_args(Phase):
                    raise ValueError(f"bad phase {phase!r}")
            except (ValueError, KeyError):
                path.unlink(missing_ok=True)
                continue
            if self.get(rid) is None:
                error = f"server_restarted: the server stopped in phase {phase!r} before this rollout finished"
                self.put(failed_result(req, error, phase=phase, rollout_id=rid))
                recovered.append(rid)
            path.unlink(missing_ok=True)
        return recovered
