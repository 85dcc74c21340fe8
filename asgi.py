"""ASGI entry point for `uvicorn swe_gym_env.asgi:app` (openenv.yaml): configured from the environment, the UI
mounted where it is on. The composition root, like the CLI's `serve`: the server's app factory never imports the
UI; the UI is handed to it."""

from swe_gym_env.server.app import create_app
from swe_gym_env.server.rollout import ServerConfig
from swe_gym_env.ui import ui_mount

app = create_app(ServerConfig.from_env(), mount=ui_mount())
