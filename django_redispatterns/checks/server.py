"""Reading one Redis server: product and version, role, eviction and persistence settings
(never writes).

Valkey reports itself with ``server_name:valkey`` and ``valkey_version``, and a frozen
``redis_version`` (7.2.4, the Redis release it is compatible with): it is named and
versioned as Valkey, while feature checks compare the Redis-compatible version.
"""

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
    product: str = "Redis"  # "Redis" or "Valkey", as the server names itself
    version: str | None = None  # the product's own version (Valkey 8.1.8, Redis 7.0.15)
    redis_version: str | None = None  # the Redis version it is compatible with
    role: str | None = None
    cluster: bool = False
    maxmemory: int | None = None
    policy: str | None = None
    used_memory: int | None = None
    source: str | None = None  # "CONFIG" or "INFO": where maxmemory/policy came from
    aof: bool | None = None  # appendonly yes (from CONFIG, else INFO's aof_enabled)
    rdb: bool | None = None  # RDB snapshot rules (save) set: only CONFIG tells
    # (feature, command) pairs the connected user may not run; None: not probed or unknown
    missing: list[tuple[str, str]] | None = None
    rights_unknown: str | None = None  # why the rights could not be told

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        """The Redis-compatible version as numbers (what feature support depends on)."""
        return _numbers(self.redis_version or self.version)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "endpoint", "error", "product", "version", "redis_version", "role", "cluster",
            "maxmemory", "policy", "used_memory", "source", "aof", "rdb")}


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
    facts.redis_version = _text(info.get("redis_version"))
    name = _text(info.get("server_name")) or "redis"
    facts.product = "Valkey" if name.lower() == "valkey" else name.capitalize()
    facts.version = _text(info.get(f"{name.lower()}_version")) or facts.redis_version
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
    _read_persistence(client, facts, info)
    return facts


def _read_persistence(client: Any, facts: ServerFacts, info: Mapping[str, Any]) -> None:
    import redis

    settings: dict[str, Any] = {}
    for name in ("appendonly", "save"):
        try:
            settings.update({str(_text(k)): v for k, v in (client.config_get(name) or {}).items()})
        except redis.ResponseError:  # CONFIG disabled, renamed or denied
            break
    if "appendonly" in settings:
        facts.aof = _text(settings["appendonly"]) == "yes"
    elif "aof_enabled" in info:
        facts.aof = str(info["aof_enabled"]) == "1"
    if "save" in settings:
        facts.rdb = bool(_text(settings["save"]))


def _numbers(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    try:
        return tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        return None


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


