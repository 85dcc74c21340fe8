"""Which engine a rollout talks to, and its certificate (certified once per engine, cached while reachable)."""

from __future__ import annotations

from swe_gym_env.server.capture import EngineTarget
from swe_gym_env.server.engine.certify import Certificate, certify
from swe_gym_env.server.rollout.config import ServerConfig
from swe_gym_env.server.rollout.record import RolloutFailure
from swe_gym_env.server.security import engine_url_allowed
from swe_gym_env.wire import RolloutRequest

CERTIFY_ANSWER_S = 120.0


class Engines:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self._certs: dict[str, Certificate] = {}

    def choose(self, req: RolloutRequest) -> tuple[EngineTarget, str]:
        """The named engine, or the caller's engine_url where the allow-list admits it; and its cache key."""
        if req.engine_url is None:
            engine = self.config.engines.get(req.engine)
            if engine is None:
                raise RolloutFailure("validate", f"unknown engine {req.engine!r}; known: {sorted(self.config.engines)}")
            return engine, req.engine
        if not engine_url_allowed(req.engine_url, self.config.allow_engine_urls):
            raise RolloutFailure(
                "validate",
                "engine_url is not on this server's allow-list (the operator sets URL prefixes in "
                "SWE_GYM_ENGINE_URL_ALLOWLIST; SWE_GYM_ALLOW_ENGINE_URLS=1 allows any)",
            )
        url = req.engine_url.rstrip("/")
        return EngineTarget(url, req.engine_model or ""), f"url:{url}"

    async def certificate(self, name: str, engine: EngineTarget) -> Certificate:
        cert = self._certs.get(name)
        if cert is None:
            # 120 s an answer: a busy engine is reachable (a training run's vLLM has a queue; in a CI run on a
            # loaded 2-core machine a warmed CPU vLLM took over 30 s for the one-token probe)
            cert = await certify(engine.base_url, engine.api_key, timeout_s=CERTIFY_ANSWER_S)
            if cert.reachable:
                self._certs[name] = cert
        return cert
