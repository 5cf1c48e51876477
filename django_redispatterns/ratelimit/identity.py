"""Who a request is: ``ip``, ``user``, ``user_or_ip``, ``header:<Name>`` or a callable.

The strings returned here are raw identities; :class:`~.limiter.RateLimiter` hashes them
(a keyed hash) before they reach Redis. ``None`` means "no identity": the rule does not apply
to this request (an anonymous user under ``key="user"``, a missing header, a callable
returning ``None``) — documented in docs/ratelimit.md.

Client IP: ``REMOTE_ADDR``, unless that peer is listed in ``RATELIMIT['TRUSTED_PROXIES']``;
then ``X-Forwarded-For`` is read right to left, through trusted proxies, and the first
untrusted address is the client. The walk ends at an entry that is no IP address (a proxy
that wrote ``unknown``, an empty or garbled entry): the address to its right — the trusted
proxy that could not name its client — is the identity, never an entry further left,
which whoever sent the request could have written. A forged ``X-Forwarded-For`` from an
untrusted peer is ignored. IPv6 addresses are grouped by ``IPV6_PREFIX`` (/64 by
default): one host owns a whole /64, so per-address limits would be trivially bypassed.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string

from ..conf import get_config
from ..exceptions import ConfigurationError
from .rates import HEADER_KEY_PREFIX, validate_key

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
KeyFunc = Callable[[Any], "str | None"]


@functools.lru_cache(maxsize=64)
def trusted_networks(proxies: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    networks = []
    for entry in proxies:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ConfigurationError(
                f"REDIS_PATTERNS['RATELIMIT']['TRUSTED_PROXIES'] contains {entry!r}, which is "
                "no IP address or CIDR."
            ) from None
    return tuple(networks)


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[v6]:port"
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # "v4:port"
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_trusted(address: Any, networks: tuple[IPNetwork, ...]) -> bool:
    return any(address.version == net.version and address in net for net in networks)


def client_ip(request: Any) -> str:
    """The client's address as a rate-limit identity (IPv6 grouped by its prefix).

    Raises ``ConfigurationError`` when ``REMOTE_ADDR`` is empty or not an address (a Unix
    socket or a misconfigured proxy): silently limiting everybody as one client, or nobody,
    would both be wrong.
    """
    meta = request.META
    remote = meta.get("REMOTE_ADDR") or ""
    config = get_config()
    trusted, prefix = _ip_settings(config)
    forwarded = meta.get("HTTP_X_FORWARDED_FOR") if trusted else None
    if len(remote) + len(forwarded or "") > _CACHEABLE_CHAIN:  # client-chosen: not kept
        return _client_ip.__wrapped__(remote, forwarded, trusted, prefix)
    return _client_ip(remote, forwarded, trusted, prefix)


_CACHEABLE_CHAIN = 256
_ip_config: list[Any] = [None, ((), 64)]


def _ip_settings(config: Any) -> tuple[tuple[IPNetwork, ...], int]:
    """(trusted proxy networks, IPv6 prefix) of the current settings object."""
    if _ip_config[0] is not config:
        section = config.feature("RATELIMIT")
        _ip_config[1] = (trusted_networks(tuple(section["TRUSTED_PROXIES"])),
                         section["IPV6_PREFIX"])
        _ip_config[0] = config
    return _ip_config[1]


@functools.lru_cache(maxsize=8192)
def _client_ip(remote_text: str, forwarded: str | None, trusted: tuple[IPNetwork, ...],
               prefix: int) -> str:
    remote = _parse_ip(remote_text)
    if remote is None:
        raise ConfigurationError(
            f"rate limiting by IP needs a valid REMOTE_ADDR, got {remote_text!r}; behind a "
            "proxy that connects over a Unix socket, set RATELIMIT['TRUSTED_PROXIES'] or "
            "use a callable key."
        )
    address = remote
    if forwarded and _is_trusted(remote, trusted):
        for entry in reversed(forwarded.split(",")):
            hop = _parse_ip(entry)
            if hop is None:
                break  # not an address: whoever is to its left is unknown
            address = hop
            if not _is_trusted(hop, trusted):
                break
    return _group(address, prefix)


def _group(address: Any, v6_prefix: int) -> str:
    if address.version == 6 and 0 < v6_prefix < 128:
        network = ipaddress.IPv6Network((int(address), v6_prefix), strict=False)
        return f"{network.network_address}/{v6_prefix}"
    return str(address)


def _user_id(request: Any) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.pk)


def by_ip(request: Any) -> str:
    return "ip:" + client_ip(request)


def by_user(request: Any) -> str | None:
    uid = _user_id(request)
    return None if uid is None else "user:" + uid


def by_user_or_ip(request: Any) -> str:
    uid = _user_id(request)
    return "user:" + uid if uid is not None else "ip:" + client_ip(request)


by_user.needs_user = True  # type: ignore[attr-defined]
by_user_or_ip.needs_user = True  # type: ignore[attr-defined]


def by_header(name: str) -> KeyFunc:
    meta = "HTTP_" + name.upper().replace("-", "_")

    def key(request: Any) -> str | None:
        value = request.META.get(meta)
        return None if not value else f"header:{name.lower()}:{value}"

    return key


def _by_callable(func: Callable[[Any], Any]) -> KeyFunc:
    def key(request: Any) -> str | None:
        value = func(request)
        return None if value is None or value == "" else "fn:" + str(value)

    return key


_BUILTIN: dict[str, KeyFunc] = {"ip": by_ip, "user": by_user, "user_or_ip": by_user_or_ip}


def resolve_key(key: str | Callable[[Any], Any]) -> KeyFunc:
    """A function ``request -> identity or None`` for a rule's ``key``."""
    validate_key(key)
    if callable(key):
        return _by_callable(key)
    if key in _BUILTIN:
        return _BUILTIN[key]
    if key.startswith(HEADER_KEY_PREFIX):
        return by_header(key[len(HEADER_KEY_PREFIX):])
    try:
        func = import_string(key.replace(":", "."))
    except ImportError as exc:
        raise ConfigurationError(f"rate-limit key {key!r} cannot be imported: {exc}") from exc
    return _by_callable(func)


def identity_for(key: str, value: str) -> str:
    """The identity a rule with ``key`` derives for ``value`` (operator commands).

    ``identity_for("ip", "2001:db8::1")`` groups the address the way requests are grouped;
    ``identity_for("user", "42")`` is user pk 42; ``header:<Name>`` takes the header value;
    for a callable key, ``value`` is what the callable returns.
    """
    if key == "ip" or (key == "user_or_ip" and _parse_ip(value) is not None):
        address = _parse_ip(value)
        if address is None:
            raise ValueError(f"{value!r} is no IP address")
        return "ip:" + _group(address, get_config().feature("RATELIMIT")["IPV6_PREFIX"])
    if key in ("user", "user_or_ip"):
        return "user:" + value
    if key.startswith(HEADER_KEY_PREFIX):
        return f"header:{key[len(HEADER_KEY_PREFIX):].lower()}:{value}"
    return "fn:" + value
