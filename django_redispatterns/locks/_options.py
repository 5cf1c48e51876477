"""A lock's options, validated once: the same arguments give the same (cached) plan.

Building a lock used to check every argument, look the settings up and build the key
names again on each ``Lock(...)``: about a tenth of an uncontended acquire+release. A plan
is immutable and cached per settings object and key prefix, so a settings change
(``override_settings``) gets a fresh one.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from .. import keys
from ..conf import Config, get_config
from ._lease import Target
from ._names import check_namespace, check_seconds, connection_names, lock_keys, ms

_HOST = socket.gethostname()


@dataclass(frozen=True)
class Plan:
    """Everything about a lock that does not change between its acquisitions."""

    names: tuple[str, ...]
    label: str
    namespace: str
    ttl: float
    ttl_ms: int
    wait: float
    auto_renew: bool
    max_hold: float | None
    min_replicas: int
    replica_timeout: float
    quorum: bool
    target: Target


def plan(names: Sequence[str], ttl: float | None, wait: float, auto_renew: bool,
         namespace: str, connection: str | None, quorum: Sequence[str] | None,
         min_replicas: int, replica_timeout: float, max_hold: float | None) -> Plan:
    """The validated plan for these arguments; raises TypeError/ValueError naming the bad one."""
    return _plan(get_config(), keys.prefix(), tuple(names), ttl, wait, bool(auto_renew),
                 namespace, connection, None if quorum is None else tuple(quorum),
                 min_replicas, replica_timeout, max_hold)


@functools.lru_cache(maxsize=1024, typed=True)  # typed: ttl=True must not hit ttl=1
def _plan(config: Config, prefix: str, names: tuple[str, ...], ttl: float | None,
          wait: float, auto_renew: bool, namespace: str, connection: str | None,
          quorum: tuple[str, ...] | None, min_replicas: int, replica_timeout: float,
          max_hold: float | None) -> Plan:
    section = config.feature("LOCKS")
    namespace = check_namespace(namespace)
    seconds = check_seconds("ttl", section["TTL"] if ttl is None else ttl, allow_zero=False)
    waits = check_seconds("wait", wait, allow_zero=True)
    bound = None if max_hold is None else check_seconds("max_hold", max_hold, allow_zero=False)
    if bound is not None and bound < seconds:
        raise ValueError(f"max_hold ({bound:g}s) must be at least the ttl ({seconds:g}s)")
    members = list(section["QUORUM"] if quorum is None else quorum)
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
        raise ValueError(f"min_replicas must be an int >= 0, got {min_replicas!r}")
    if min_replicas and members:
        raise ValueError("min_replicas and quorum mode do not combine; pick one")
    replicas_wait = check_seconds("replica_timeout", replica_timeout, allow_zero=False)
    label = names[0] if len(names) == 1 else ",".join(names)
    per_name = [lock_keys(prefix, namespace, n) for n in names]
    target = Target(label, names, [k[0] for k in per_name], [k[1] for k in per_name],
                    connection_names(members, connection), ms(float(section["FENCING_TTL"])),
                    min_replicas, replicas_wait, [k[2] for k in per_name],
                    [k[3] for k in per_name])
    return Plan(names, label, namespace, seconds, ms(seconds), waits, auto_renew, bound,
                min_replicas, replicas_wait, bool(members), target)


@functools.lru_cache(maxsize=1024)
def meta_head(label: str, owner: str, pid: int) -> str:
    """The owner metadata stored with the lease, without its closing ``"since"`` field."""
    return json.dumps({"name": label[:200], "host": _HOST, "pid": pid, "by": owner},
                      separators=(",", ":"))[:-1]
