"""The trace format in one place: how a rollout's captured calls are stored and read back.

- `trace.compact`: the pure layer (no project import; `wire.py` builds on it): compact turns, `lcp`, training
  sequences (`materialize`, `SequenceError`).
- `trace.forms`: reading a result (`TurnsView`, `prompt_ids`, `request_of`, `expand`, `compact`, `recompact`,
  `check_sequences`) and the one summary builder (`summary_of`) the MCP summary, the result pages and the rollout
  record all use.

Client-safe: pure Python, no server code. Nothing is imported here, so `wire` may import `trace.compact` while
`trace.forms` imports `wire`.
"""
