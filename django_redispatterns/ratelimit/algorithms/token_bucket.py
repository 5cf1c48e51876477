"""Token bucket as GCRA: one key holding a theoretical arrival time.

Refills steadily at ``limit`` per ``period``; up to ``burst`` (default: ``limit``) requests
may pass at once from a full bucket. One small string per key, expiring when full.
``reset_after`` is when the next token arrives (the next unit of quota), not when the
bucket is full again: that is what a client waiting for room needs, and it is never later
than the ``retry_after`` of a blocked hit.
"""

from __future__ import annotations

from ..rates import Rate, validate_burst
from .base import Algorithm


class TokenBucket(Algorithm):
    name = "token_bucket"
    code = "tb"
    script_name = "ratelimit_token_bucket"

    def __init__(self, rate: Rate, burst: int | None = None) -> None:
        self.burst = validate_burst(burst) or rate.limit
        super().__init__(rate)

    @property
    def capacity(self) -> int:
        return self.burst

    @property
    def shape(self) -> str:
        return f"{self.rate.limit}-{self.rate.period}-{self.burst}"

    def fixed_args(self) -> tuple[int, ...]:
        return (self.rate.limit, self.rate.period * 1000, self.burst)
