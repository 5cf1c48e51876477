"""Which keys a cache may delete by pattern: only those it can prove are its own.

``clear()`` and ``delete_pattern()`` SCAN for a pattern built by the ``KEY_FUNCTION``. A
key function that ignores the prefix or the version turns that pattern into ``*`` (or
into something other caches' keys, sessions and lock counters also match), so before
deleting anything the cache proves, by probing the key function, that

1. its keys carry the ``key_prefix`` argument and the version (checked with a probe
   prefix no real setting uses, so an empty ``KEY_PREFIX`` proves nothing by accident);
2. every key of this cache starts with the same fixed text, and the pattern begins with
   that text literally (no glob character in it);
3. the pattern matches the keys the function makes for this cache, and none of those it
   makes for another prefix.

Otherwise :class:`~django_redispatterns.exceptions.UnscopedKeysError` names the problem
and nothing is deleted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django_redis.client.default import glob_escape

from ..exceptions import UnscopedKeysError

VERSION_GLOB = "[-0-9]*"  # any version (Django's are ints; negative ones too)
_PROBE_PREFIX = "rp-scope-probe"
_PROBES = (("x", 1), ("y", 22))  # keys and versions differing in their first character


def _made(key_func: Callable[..., Any], prefix: str) -> list[str]:
    return [str(key_func(key, prefix, version)) for key, version in _PROBES]


def _common_start(texts: list[str]) -> str:
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n]


def problem(key_func: Callable[..., Any], prefix: str) -> str | None:
    """Why the keys of a cache with ``key_func`` and ``prefix`` cannot be told apart from
    other keys by a SCAN pattern, or None when they can."""
    probe = _PROBE_PREFIX if prefix != _PROBE_PREFIX else _PROBE_PREFIX + "-2"
    try:
        probe_keys = _made(key_func, probe)
        own = _made(key_func, prefix)
        one_key = {str(key_func("x", prefix, v)) for v in (1, 2)}
        pattern = str(key_func("*", glob_escape(prefix), VERSION_GLOB))
    except Exception as exc:  # a key function refusing "*": it cannot be scanned for
        return f"KEY_FUNCTION fails on the probe keys ({type(exc).__name__}: {exc})"
    if not all(probe in k for k in probe_keys):
        return "KEY_FUNCTION drops the KEY_PREFIX"
    if len(one_key) == 1:
        return "KEY_FUNCTION drops the version"
    literal = _common_start(own)
    if not literal or not pattern.startswith(glob_escape(literal)):
        return (f"the pattern {pattern!r} does not begin with a fixed text that starts "
                f"every key of this cache (they share only {literal!r})")
    matcher = glob_regex(pattern)
    if not all(matcher.fullmatch(k) for k in own):
        return f"the pattern {pattern!r} does not match the keys KEY_FUNCTION makes"
    if any(matcher.fullmatch(k) for k in probe_keys):
        return f"the pattern {pattern!r} also matches keys of other prefixes"
    return None


def own_pattern(key_func: Callable[..., Any], prefix: str, operation: str) -> str:
    """The SCAN pattern of every key of this cache (any version); raises
    :class:`UnscopedKeysError` naming why there is none."""
    why = problem(key_func, prefix)
    if why is not None:
        raise UnscopedKeysError(
            f"{operation} refused, nothing deleted: {why}, so this cache cannot tell its "
            "own keys from sessions, locks and other caches' keys. Build keys as "
            "':'.join([key_prefix, str(version), key]) like Django's default, or set "
            "OPTIONS['CLEAR_FLUSHDB'] = True if this database holds nothing else."
        )
    return str(key_func("*", glob_escape(prefix), VERSION_GLOB))


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A regex matching what Redis's glob ``pattern`` matches (``* ? [...] \\x``)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            negate = body.startswith("^")
            body = body[1:] if negate else body
            parts = [re.escape(ch) if ch != "-" else "-" for ch in body.replace("\\", "")]
            out.append("[" + ("^" if negate else "") + "".join(parts) + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)
