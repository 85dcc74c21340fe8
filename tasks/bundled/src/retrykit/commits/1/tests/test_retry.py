import pytest

from retrykit import call_with_retry, retry


class Flaky:
    """Fails ``failures`` times with ``exc``, then returns "ok"."""

    def __init__(self, failures, exc=ConnectionError):
        self.failures = failures
        self.exc = exc
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc(f"failure {self.calls}")
        return "ok"


def no_sleep(seconds):
    pass


def test_returns_first_success():
    flaky = Flaky(2)
    assert call_with_retry(flaky, attempts=3, sleep=no_sleep) == "ok"
    assert flaky.calls == 3


def test_other_exceptions_are_not_retried():
    flaky = Flaky(1, exc=KeyError)
    with pytest.raises(KeyError):
        call_with_retry(flaky, attempts=3, retry_on=(ConnectionError,), sleep=no_sleep)
    assert flaky.calls == 1


def test_rejects_zero_attempts():
    with pytest.raises(ValueError):
        call_with_retry(Flaky(0), attempts=0)


def test_decorator_passes_arguments():
    @retry(attempts=2, sleep=no_sleep)
    def add(a, b):
        return a + b

    assert add(2, b=3) == 5
    assert add.__name__ == "add"
