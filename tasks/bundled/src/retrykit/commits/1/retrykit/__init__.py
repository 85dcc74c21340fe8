"""Retry flaky calls a bounded number of times."""

from retrykit.retry import call_with_retry, retry

__all__ = ["call_with_retry", "retry"]
