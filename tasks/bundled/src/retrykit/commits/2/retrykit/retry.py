"""Call a function again when it fails with a retryable exception."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")

log = logging.getLogger("retrykit")


def call_with_retry(
    func: Callable[[], T],
    *,
    attempts: int = 3,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    delay: float = 0.0,
    backoff: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``func()`` until it returns, at most ``attempts`` times.

    The first wait between attempts is ``delay`` seconds; each further wait is ``backoff`` times the previous one.

    An exception that is not one of ``retry_on`` propagates at once. If every attempt fails, the exception
    of the last attempt propagates.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    wait = delay
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except retry_on as exc:
            log.warning("attempt %d of %d failed: %r", attempt, attempts, exc)
            if attempt < attempts:
                sleep(wait)
                wait *= backoff
    log.error("giving up after %d attempts", attempts)


def retry(**options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator form of :func:`call_with_retry`; ``options`` are its keyword arguments."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> T:
            return call_with_retry(lambda: fn(*args, **kwargs), **options)

        return wrapper

    return decorate
