"""Settings for the benchmarks: the test suite's, on the same kind of Redis."""

from tests.settings import *  # noqa: F403
