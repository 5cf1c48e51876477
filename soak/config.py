"""Numbers the app, the load generator and the checks share (one place, so they agree)."""

from __future__ import annotations

import os

# Settings the docs recommend for a hung Redis: every call bounded by the socket timeout.
SOCKET_TIMEOUT = 0.5
# failure-modes.md: "Never a hang ... the tests allow 5 s with a 0.5 s socket timeout".
HANG_BOUND = 10 * SOCKET_TIMEOUT

CACHE_TIMEOUT = 2  # seconds, the cached routes' get_or_set timeout
STALE_TTL = {"default": 0, "swr": 3}  # per cache alias (OPTIONS["STALE_TTL"])
COMPUTE_SECONDS = 0.1  # the cached routes' computation
CACHE_KEYS = 3  # distinct keys per cached route

IDEMPOTENCY_LEASE = 10  # IDEMPOTENCY["LEASE"]; a crashed or orphaned claim ends after it

# Rate-limited routes: name -> (path, rate, algorithm, burst). The identity is the
# X-Soak-Bucket header (key="header:X-Soak-Bucket"), which the load generator changes every
# BUCKET_SECONDS, the same in every load process: many workers decide one counter at once.
RATE_ROUTES: dict[str, tuple[str, str, str, int | None]] = {
    "rl_fixed": ("/rl/fixed", "40/m", "fixed_window", None),
    "rl_sliding": ("/rl/sliding", "10/s", "sliding_window", None),
    "rl_gcra": ("/rl/gcra", "20/s", "token_bucket", 10),
    "api_rule": ("/api/echo", "30/m", "fixed_window", None),  # a RateLimitMiddleware rule
}
# The end-to-end benchmark measures the admitted path: limits nobody reaches.
BENCH_RATE_ROUTES: dict[str, tuple[str, str, str, int | None]] = {
    name: (path, "1000000/m", algorithm, 1000000 if burst else None)
    for name, (path, _rate, algorithm, burst) in RATE_ROUTES.items()
}
BUCKET_HEADER = "X-Soak-Bucket"
BUCKET_SECONDS = 4

USERS = 4  # each user signs in from one device in every load process
PASSWORD = "soak-password"


def rate_routes() -> dict[str, tuple[str, str, str, int | None]]:
    """The rate-limited routes of this run (``SOAK_BENCH=1``: the benchmark's limits)."""
    return BENCH_RATE_ROUTES if os.environ.get("SOAK_BENCH") == "1" else RATE_ROUTES


def username(index: int) -> str:
    return f"soak-user-{index}"


def parse_rate(rate: str) -> tuple[int, float]:
    """'40/m' -> (40, 60.0); the few forms RATE_ROUTES uses."""
    count, unit = rate.split("/")
    return int(count), {"s": 1.0, "m": 60.0, "h": 3600.0}[unit]
