"""Trainer-side client. Imports only `swe_gym_env.wire` and fastmcp, never `swe_gym_env.server`."""

from swe_gym_env.client.mcp_client import SweGymClient

__all__ = ["SweGymClient"]
