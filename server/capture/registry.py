"""The dialects the capture proxy speaks: one entry per dialect; `CaptureProxy.app` serves each one's routes."""

from __future__ import annotations

from swe_gym_env.server.capture.dialect import Dialect
from swe_gym_env.server.capture.dialects.anthropic_messages import AnthropicDialect
from swe_gym_env.server.capture.dialects.gemini import GeminiDialect
from swe_gym_env.server.capture.dialects.openai_chat import ChatDialect
from swe_gym_env.server.capture.dialects.openai_responses import ResponsesDialect

DIALECTS: dict[str, Dialect] = {
    "openai-chat": ChatDialect(),
    "openai-responses": ResponsesDialect(),
    "anthropic-messages": AnthropicDialect(),
    "gemini": GeminiDialect(),
}
