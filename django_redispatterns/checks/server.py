"""Reading one Redis server: version, role and eviction settings (never writes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class ServerFacts:
    """What one Redis server says about itself. ``None`` means hidden or unknown."""

    endpoint: str
    error: str | None = None
    run_id: str | None = None
    version: str | None = None
    role: str | None = None
    cluster: bool = False
    maxmemory: int | None = None
    policy: str | None = None
    used_memory: int | None = None
    source: str | None = None  # "CONFIG" or "INFO": where maxmemory/policy came from

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        if not self.version:
            return None
        try:
            return tuple(int(p) for p in self.version.split(".")[:3])
        except ValueError:
            return None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "endpoint", "error", "version", "role", "cluster", "maxmemory", "policy",
            "used_memory", "source")}


def read_facts(client: Any, endpoint: str) -> ServerFacts:
    """Read version, role and eviction settings from a (non-cluster) client.

    Uses ``CONFIG GET maxmemory*`` and falls back to ``INFO`` when CONFIG
    is disabled, renamed or denied; what neither reveals stays ``None``. Only reads; never
    writes. Connection errors and timeouts (an unreachable server) reach the caller.
    """
    import redis

    facts = ServerFacts(endpoint)
    try:
        info: Mapping[str, Any] = client.info()
    except redis.ResponseError:  # INFO denied by ACL: everything below is unknown
        info = {}
    facts.run_id = _text(info.get("run_id"))
    facts.version = _text(info.get("redis_version"))
    facts.role = _text(info.get("role"))
    facts.cluster = str(info.get("cluster_enabled", "0")) == "1"
    facts.used_memory = _int(info.get("used_memory"))
    try:
        config = client.config_get("maxmemory*")
    except redis.ResponseError:  # disabled, renamed (unknown command) or NOPERM
        config = {}
    config = {_text(k): v for k, v in (config or {}).items()}
    if "maxmemory" in config or "maxmemory-policy" in config:
        facts.source = "CONFIG"
        facts.maxmemory = _int(config.get("maxmemory"))
        facts.policy = _text(config.get("maxmemory-policy"))
    else:
        facts.source = "INFO"
        facts.policy = _text(info.get("maxmemory_policy"))
        # Managed services that disable CONFIG enforce their own limit and often report
        # maxmemory 0 in INFO; treat that as unknown rather than "no limit".
        maxmemory = _int(info.get("maxmemory"))
        facts.maxmemory = maxmemory if maxmemory else None
    return facts


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text or None


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "", b"") else None
    except (TypeError, ValueError):
        return None


