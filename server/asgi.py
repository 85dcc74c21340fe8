"""ASGI entry point for `uvicorn swe_gym_env.server.asgi:app` (openenv.yaml, the Space): configured from env."""

from swe_gym_env.server.app import create_app
from swe_gym_env.server.rollout import ServerConfig

app = create_app(ServerConfig.from_env())
