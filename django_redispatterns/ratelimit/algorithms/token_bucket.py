"""Token bucket as GCRA: one key holding a theoretical arrival time.

Refills steadily at ``limit`` per ``period``; up to ``burst`` (default: ``limit``) requests
may pass at once from a full bucket. One small string per key, expiring when full.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...scripts import ArgT
from ..rates import Rate, validate_burst
from . import Algorithm


class TokenBucket(Algorithm):
    name = "token_bucket"
    code = "tb"
    script_name = "ratelimit_token_bucket"

    def __init__(self, rate: Rate, burst: int | None = None) -> None:
        self.rate = rate
        self.burst = validate_burst(burst) or rate.limit

    @property
    def shape(self) -> str:
        return f"{self.rate.limit}-{self.rate.period}-{self.burst}"

    def args(self, cost: int, request_id: str) -> Sequence[ArgT]:
        return (self.rate.limit, self.rate.period * 1000, self.burst, cost)
