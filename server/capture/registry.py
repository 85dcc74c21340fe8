"""The dialects the capture proxy speaks: one entry per dialect; `CaptureProxy.app` serves each one's routes."""

from __future__ import annotations

from swe_gym_env.server.capture.dialect import Dialect
from swe_gym_env.server.capture.openai_chat import ChatDialect

DIALECTS: dict[str, Dialect] = {
    "openai-chat": ChatDialect(),
}
