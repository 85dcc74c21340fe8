"""`swe-gym-env info`: what this machine can run (read-only)."""

from __future__ import annotations

import asyncio

from swe_gym_env.core.assets import tokenizer_dir
from swe_gym_env.server.agents.base import AgentError
from swe_gym_env.server.agents.provision import install_on_use_from_env, install_refusal
from swe_gym_env.server.agents.registry import HARNESSES
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.engine.builtin import builtin_engine
from swe_gym_env.server.engine.certify import certify
from swe_gym_env.server.sandbox.preflight import probe_all, resolved
from swe_gym_env.tasks.catalog import PYPI_SPLIT, split_names, tasks_in, unbuilt
from swe_gym_env.tasks.envs import envs_status, images_status


async def gather_info(engine_url: str | None) -> dict:
    agents = {}
    allowed = install_on_use_from_env()
    for name, cls in HARNESSES.items():
        h = cls()
        try:
            h.mounts()  # raises when the install is missing or broken
            agents[name] = {"version": h.version, "dialect": h.dialect, "installed": True}
        except AgentError as e:
            refusal = install_refusal(allowed, h)
            agents[name] = {
                "version": h.version,
                "dialect": h.dialect,
                "installed": False,
                "installs_on_first_use": refusal is None,  # else: why not, in `reason`
                "reason": f"{e}" + (f"; cannot install it on first use: {refusal}" if refusal else ""),
            }
    sandboxes = await probe_all()  # per backend, from a real probe here: usable, and why (or why not)
    datasets = {}
    for split in split_names():
        try:
            tasks = tasks_in(split)
            datasets[split] = {"tasks": len(tasks)}
            if any(t.image for t in tasks):  # image-bearing: which of its images this docker has
                present, needed, missing = await asyncio.to_thread(images_status, tasks)
                datasets[split]["images"] = {"present": present, "needed": needed, "missing": missing[:10]}
            if any(t.install_config for t in tasks):  # its `local` venvs, built or not
                built, needed = envs_status(tasks)
                datasets[split]["local_envs"] = {"built": built, "needed": needed}
        except Exception as e:  # a broken extra source must not hide the others
            datasets[split] = {"error": f"{type(e).__name__}: {e}"}
    if unbuilt(PYPI_SPLIT):  # `swe-gym-env setup` leaves it out (the demo does not need it)
        how = (
            "a rollout naming it builds it on first use"
            if install_on_use_from_env()
            else "installing on first use is off"
        )
        datasets[PYPI_SPLIT] = {"built": False, "reason": f"not built: {how}; `swe-gym-env setup --all` builds it"}
    out = {
        "agents": agents,
        "sandboxes": sandboxes,
        "default_sandbox": resolved(sandboxes),  # what a rollout naming no sandbox runs on (None: none usable)
        "datasets": datasets,
        "tokenizer": (tokenizer_dir() / "tokenizer.json").is_file(),
        # the API dialects /capture speaks: their routes (aux: answered on the side, never a turn)
        "dialects": {
            name: [f"{m} /capture{r.path}" + (" (aux)" if r.aux else "") for r in d.routes for m in r.methods]
            for name, d in DIALECTS.items()
        },
    }
    if engine_url:
        out["engine"] = (await certify(engine_url)).model_dump()
    if (builtin := builtin_engine()) is not None:
        out.setdefault("engine", {}).update(builtin)
    return out
