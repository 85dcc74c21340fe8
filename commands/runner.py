"""Run the server's pieces in-process (no HTTP front door): for `swe-gym-env rollout` and benchmarks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from swe_gym_env.server.app import create_app
from swe_gym_env.server.rollout import RolloutService, ServerConfig


@contextlib.asynccontextmanager
async def local_service(config: ServerConfig) -> AsyncIterator[RolloutService]:
    """The same service `serve` runs (capture socket, results store, recovery), started and stopped here."""
    app = create_app(config)
    async with app.router.lifespan_context(app):
        yield app.state.service
