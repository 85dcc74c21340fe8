"""Pi on every API dialect /capture speaks: its models.json provider for each `api` (harness option ``api``).

Pi's models.json ``api`` picks the client it speaks with; each appends its own path to ``baseUrl`` (verified by
running Pi 0.73.1 against the proxy):
  openai-completions    baseUrl <capture>/v1      → POST <capture>/v1/chat/completions (Bearer key)
  openai-responses      baseUrl <capture>/v1      → POST <capture>/v1/responses (Bearer key)
  anthropic-messages    baseUrl <capture>         → POST <capture>/v1/messages (x-api-key)
  google-generative-ai  baseUrl <capture>/v1beta  → POST <capture>/v1beta/models/<id>:streamGenerateContent?alt=sse
                                                    (x-goog-api-key; Pi sets the SDK's apiVersion to "")
The provider is never named ``openai`` (Pi would switch that one to the Responses API on its own). Only the chat
client takes the ``compat`` switches below (the others have no store / developer-role / reasoning-effort knobs).
"""

from __future__ import annotations

DEFAULT_API = "openai-completions"
# Pi's api -> the capture dialect it speaks (what `Turn.dialect` records)
PI_APIS: dict[str, str] = {
    "openai-completions": "openai-chat",
    "openai-responses": "openai-responses",
    "anthropic-messages": "anthropic-messages",
    "google-generative-ai": "gemini",
}
_BASE_SUFFIX = {
    "openai-completions": "/v1",
    "openai-responses": "/v1",
    "anthropic-messages": "",
    "google-generative-ai": "/v1beta",
}
CHAT_COMPAT = {"supportsStore": False, "supportsDeveloperRole": False, "supportsReasoningEffort": False}


def pi_base_url(api: str, capture_base: str) -> str:
    """Pi's ``baseUrl`` for ``api``, from the capture root as the sandbox reaches it (without /v1)."""
    if api not in _BASE_SUFFIX:
        raise ValueError(f"Pi api {api!r} is not one of {sorted(_BASE_SUFFIX)}")
    return capture_base.rstrip("/") + _BASE_SUFFIX[api]


def pi_provider(
    api: str, capture_base: str, key_env: str, model: str, context_window: int, max_tokens: int
) -> dict[str, object]:
    """The models.json provider entry that points Pi at /capture in ``api`` (the key read from ``key_env``)."""
    provider: dict[str, object] = {"baseUrl": pi_base_url(api, capture_base), "api": api, "apiKey": key_env}
    if api == "openai-completions":
        provider["compat"] = dict(CHAT_COMPAT)
    provider["models"] = [{"id": model, "contextWindow": context_window, "maxTokens": max_tokens}]
    return provider


def capture_tool_call_id(pi_id: str) -> str:
    """A tool-call id from Pi's events as the capture recorded it: Pi keeps Responses calls as
    ``<call_id>|<item id>``, and the capture's id is the call id."""
    return pi_id.split("|", 1)[0]
