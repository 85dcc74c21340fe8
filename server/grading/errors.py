"""What grading raises: infra (`GradingError`, reward None) or a run that left nothing to grade (`BrokenRun`)."""

from __future__ import annotations


class GradingError(RuntimeError):
    """Grading itself broke (infra): the reward is unknown, not 0."""


class BrokenRun(Exception):
    """The test run left nothing to grade (timed out, died, no results): the patch's fault or infra, decided by
    running the empty patch."""
