"""Fixed window: ``INCRBY`` + first-hit ``PEXPIRE`` in one script (cheapest, one integer).

A window starts at a key's first hit and lasts ``period``; up to ``2 x limit`` requests can
pass around a window boundary. Rejected hits are not counted.
"""

from __future__ import annotations

from .base import Algorithm


class FixedWindow(Algorithm):
    name = "fixed_window"
    code = "fw"
    script_name = "ratelimit_fixed_window"
