"""The capture proxy: sessions, API dialects, the rollout graph, the durable store (see `proxy` and `dialect`)."""

from swe_gym_env.server.capture.dialect import CapturedCall, Dialect, DialectError, request_text
from swe_gym_env.server.capture.proxy import CaptureProxy
from swe_gym_env.server.capture.registry import DIALECTS
from swe_gym_env.server.capture.session import CaptureSession, EngineTarget
from swe_gym_env.server.capture.store import CaptureStore

__all__ = [
    "DIALECTS",
    "CaptureProxy",
    "CaptureSession",
    "CaptureStore",
    "CapturedCall",
    "Dialect",
    "DialectError",
    "EngineTarget",
    "request_text",
]
