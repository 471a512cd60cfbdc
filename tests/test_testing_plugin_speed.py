"""The ``celery_saga.testing`` pytest plugin costs a user's test suite little: a test using
``saga_kit`` tears its embedded worker down in well under a second (it took about 4 s:
the worker noticed it should stop only when its broker poll timed out)."""

from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]

_USER_TESTS = """
import pytest

from celery_saga import Saga


@pytest.fixture
def kit(saga_kit):
    saga_kit.engine.register(Saga("tiny").step("one", lambda: 1))
    return saga_kit


def test_one(kit):
    assert kit.run("tiny").state.value == "completed"


def test_two(kit):
    assert kit.run("tiny").results == {"one": 1}


def test_three(kit):
    assert kit.run("tiny").state.value == "completed"
"""

#: "0.12s teardown test_tiny.py::test_one" in pytest's --durations report.
_TEARDOWN = re.compile(r"^([\d.]+)s teardown\s+\S+::(test_\w+)$", re.MULTILINE)


def test_three_tiny_saga_kit_tests_tear_down_quickly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tiny=_USER_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "celery_saga.testing.plugin", "--durations=0", "--durations-min=0", "-q"
    )
    result.assert_outcomes(passed=3)
    output = result.stdout.str()
    teardowns = {name: float(seconds) for seconds, name in _TEARDOWN.findall(output)}
    assert set(teardowns) == {"test_one", "test_two", "test_three"}, output
    # A generous bound for a shared machine: it was about 4 s per test.
    slow = {name: seconds for name, seconds in teardowns.items() if seconds >= 2.0}
    assert not slow, output
