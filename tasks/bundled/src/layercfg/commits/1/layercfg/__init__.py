"""Layered configuration: defaults, config file, environment."""

from layercfg.env import from_env
from layercfg.merge import merge, resolve

__all__ = ["from_env", "merge", "resolve"]
