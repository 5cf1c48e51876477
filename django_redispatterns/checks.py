"""System checks (filled in by the checks feature)."""

from __future__ import annotations
