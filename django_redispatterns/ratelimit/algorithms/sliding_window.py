"""Exact sliding window: a log of hits in a sorted set (no boundary burst).

At any instant at most ``limit`` units lie in the trailing ``period``. Memory is one member
per admitted unit (bounded by ``limit``). Each hit's member is its request id, so a re-sent
call is recognised and counts nothing, without any extra key.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...scripts import ArgT
from .base import Algorithm


class SlidingWindow(Algorithm):
    name = "sliding_window"
    code = "sw"
    script_name = "ratelimit_sliding_window"
    uses_request_id = True

    def args(self, cost: int, request_id: str) -> Sequence[ArgT]:
        if cost == 1:  # the script reads an absent cost as 1
            return (*self._fixed, request_id)
        return (*self._fixed, request_id, str(cost).encode())
