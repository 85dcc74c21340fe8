#!/bin/sh
# The Space's entry point: the server on $PORT (default 8000, the README's app_port) on all interfaces.
# With SWE_GYM_VLLM_MODEL set (a Space variable; the image must have been built with it, see the Dockerfile),
# `serve` first starts vLLM on loopback with the capture flags and makes it the default engine. With no engine at all
# (no SWE_GYM_ENGINE_URL, no SWE_GYM_VLLM_MODEL) `serve` runs the built-in engine: NOT a model, for a demo rollout.
set -eu
exec swe-gym-env serve --host 0.0.0.0 --port "${PORT:-8000}"
