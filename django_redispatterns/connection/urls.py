"""Redis connection URLs: read their parts, and print them without their passwords.

:func:`parse_url` reads every form the app accepts (``redis://``, ``rediss://``,
``unix://``, ``redis+sentinel://host:port[,host:port]/service[/db]``,
``redis+cluster://host:port[,host:port]``, and ``rediss+sentinel://``/``rediss+cluster://``
for their TLS forms); :func:`redact` is the one way a URL is shown
to a person (command output, check messages, exceptions, logs), and :func:`redact_text`
applies it to every URL inside a message (an exception's text, say).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
REDACTED = "***"
# Query parameters that carry a secret (redis-py reads ``password``; we read the other).
SECRET_PARAMS = ("password", "sentinel_password")

_URL_IN_TEXT = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedURL:
    """The parts of a connection URL the app uses. ``scheme`` is the plain form
    (``redis+sentinel`` for ``rediss+sentinel`` too); ``tls`` says whether TLS was asked for."""

    scheme: str
    hosts: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    path: tuple[str, ...] = ()  # the non-empty path segments
    query: Mapping[str, str] = field(default_factory=dict)  # last value of each parameter
    tls: bool = False

    @property
    def credentials(self) -> dict[str, Any]:
        """``username`` / ``password`` keyword arguments for a redis-py client."""
        creds: dict[str, Any] = {}
        if self.username:
            creds["username"] = self.username
        if self.password:
            creds["password"] = self.password
        return creds


def parse_url(url: str) -> ParsedURL:
    """The scheme, hosts (several for Sentinel and Cluster), credentials, path and query."""
    scheme, rest = url.split("://", 1) if "://" in url else ("", url)
    tls = scheme.startswith("rediss")
    scheme = plain_scheme(scheme)
    authority, tail = _split_authority(rest)
    userinfo, _, hostlist = authority.rpartition("@")
    user, _, password = userinfo.partition(":")
    default_port = 26379 if scheme == SENTINEL_SCHEME else 6379
    hosts = tuple(_host_port(part, default_port) for part in hostlist.split(","))
    parts = urlsplit("x://h" + tail)
    return ParsedURL(
        scheme=scheme,
        hosts=hosts if scheme != "unix" else (),
        username=unquote(user) or None,
        password=unquote(password) or None,
        path=tuple(p for p in parts.path.split("/") if p),
        query=dict(parse_qsl(parts.query)),
        tls=tls,
    )


def plain_scheme(scheme: str) -> str:
    """``rediss+sentinel`` -> ``redis+sentinel`` (and the Cluster form); others unchanged."""
    return "redis" + scheme[len("rediss"):] if scheme.startswith("rediss+") else scheme


def redact(url: str) -> str:
    """``url`` with every password replaced by ``***`` (the user name and host stay)."""
    if "://" not in url:
        return url  # a CACHES alias
    scheme, rest = url.split("://", 1)
    authority, tail = _split_authority(rest)
    head = rest.split("?", 1)[0]
    if "@" not in authority and "@" in head:
        # A password with an unencoded "/" (no client reads such a URL right): hide
        # everything up to the last "@" rather than print a part of it.
        authority, tail = _split_authority(head[head.rfind("@") + 1:] + rest[len(head):])
        return f"{scheme}://{REDACTED}@{authority}{_redact_query(tail)}"
    userinfo, at, hostlist = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:{REDACTED}@{hostlist}"
    return f"{scheme}://{authority}{_redact_query(tail)}"


def redact_text(text: str) -> str:
    """``text`` with :func:`redact` applied to every URL in it."""
    def one(match: re.Match[str]) -> str:
        url = match.group(0)
        kept = url.rstrip(".,;:!)]}")  # punctuation after a URL in a sentence
        return redact(kept) + url[len(kept):]

    return _URL_IN_TEXT.sub(one, text)


def _split_authority(rest: str) -> tuple[str, str]:
    """(authority, path-and-query) of a URL's part after ``://``, cut as ``urlsplit`` cuts
    it: the authority runs to the first ``/``, ``?`` or ``#``."""
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    end = min(ends) if ends else len(rest)
    return rest[:end], rest[end:]


def _redact_query(tail: str) -> str:
    if "?" not in tail:
        return tail
    path, _, query = tail.partition("?")
    fields = [(k, REDACTED if k in SECRET_PARAMS else v) for k, v in _query_pairs(query)]
    return f"{path}?" + "&".join(f"{k}={v}" for k, v in fields)


def _query_pairs(query: str) -> list[tuple[str, str]]:
    return [tuple(item.split("=", 1)) if "=" in item else (item, "")  # type: ignore[misc]
            for item in query.split("&") if item]


def _host_port(part: str, default_port: int) -> tuple[str, int]:
    host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
    return host or "127.0.0.1", int(port or default_port)
