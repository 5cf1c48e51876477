"""The one place that reads ``settings.REDIS_PATTERNS``.

Read settings through :func:`get_config` only. It merges the project's dict over
:data:`DEFAULTS`, validates names and types, and is cached until Django's
``setting_changed`` signal (``override_settings`` in tests) clears it.

Unknown keys and wrong types raise :class:`~django_redispatterns.exceptions.ConfigurationError`
(an ``ImproperlyConfigured``) naming the offending key, e.g. ``REDIS_PATTERNS['LOCKS']['TLL']``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .exceptions import ConfigurationError

SETTING_NAME = "REDIS_PATTERNS"
FEATURES = ("LOCKS", "RATELIMIT", "IDEMPOTENCY", "SESSIONS")

_number = (int, float)
_optional_str = (str, type(None))

# key -> (accepted types, default). Nested dicts are feature sections.
SCHEMA: dict[str, Any] = {
    # Alias of a django-redis CACHES entry, or a redis://, rediss://, unix://,
    # redis+sentinel:// or redis+cluster:// URL.
    "CONNECTION": ((str,), "default"),
    "KEY_PREFIX": ((str,), "rp"),
    # Bounds on how long any decision may wait for Redis (seconds). Applied to the
    # clients this app builds from URLs; a CACHES alias keeps django-redis's own options.
    "SOCKET_TIMEOUT": (_number, 1.0),
    "SOCKET_CONNECT_TIMEOUT": (_number, 1.0),
    # Certificates for every TLS connection the app opens (rediss://, rediss+sentinel://,
    # rediss+cluster://). The server's certificate is always verified: against CA_CERTS
    # (a PEM file) when set, else the system's trust store.
    "TLS": {
        "CA_CERTS": (_optional_str, None),
        # A client certificate (PEM) and its private key, for servers that require one.
        "CERTFILE": (_optional_str, None),
        "KEYFILE": (_optional_str, None),
        # Passphrase of an encrypted KEYFILE.
        "KEY_PASSWORD": (_optional_str, None),
        # Compare the server's name with its certificate; turning it off lets any server
        # holding a certificate from the CA pose as yours (a deploy check warns).
        "CHECK_HOSTNAME": ((bool,), True),
    },
    "LOCKS": {
        "CONNECTION": (_optional_str, None),
        "TTL": (_number, 30),
        "FENCING_TTL": (_number, 30 * 24 * 3600),
        # Connections (aliases or URLs) of independent masters for Redlock quorum mode.
        "QUORUM": ((list, tuple), []),
    },
    "RATELIMIT": {
        "CONNECTION": (_optional_str, None),
        "FAIL_OPEN": ((bool,), True),
        "RULES": ((list, tuple), []),
        # Proxies whose X-Forwarded-For entries are trusted (IPs or CIDRs).
        "TRUSTED_PROXIES": ((list, tuple), []),
        "IPV6_PREFIX": ((int,), 64),
        # Dotted path of a view answering blocked requests (default: built-in 429).
        "VIEW": (_optional_str, None),
        # Also send the older RateLimit-Limit/-Remaining/-Reset trio (docs/ratelimit.md).
        "LEGACY_HEADERS": ((bool,), True),
    },
    "IDEMPOTENCY": {
        "CONNECTION": (_optional_str, None),
        "HEADER": ((str,), "Idempotency-Key"),
        "TTL": (_number, 86400),
        "METHODS": ((list, tuple), ["POST", "PATCH"]),
        "REQUIRED": ((bool,), False),
        "MAX_BODY_BYTES": ((int,), 1024 * 1024),
        # Lease of the in-flight claim; renewed while a long view runs.
        "LEASE": (_number, 30),
        # The longest a claim lives, renewals included (seconds; at least LEASE).
        "MAX_LEASE": (_number, 600),
        # Dotted path of a callable request -> str | None naming whom keys belong to
        # (None: the authenticated user id, else the session key; no scope -> 400).
        "SCOPE": (_optional_str, None),
    },
    "SESSIONS": {
        "CONNECTION": (_optional_str, None),
        # End the user's other sessions when their password changes.
        "LOGOUT_ON_PASSWORD_CHANGE": ((bool,), False),
        # How SessionActivityMiddleware stores the client IP: "truncate", "hash" or "none".
        "IP_STORAGE": ((str,), "truncate"),
        # Seconds between two activity writes (last_activity, ip, user agent) of one session.
        "ACTIVITY_INTERVAL": (_number, 60),
        # Most live sessions one user may have; a sign-in beyond it ends the oldest ones.
        "MAX_PER_USER": ((int,), 100),
        # Serve signed-in sessions' loads from process memory, kept correct by Redis
        # tracking (docs/sessions.md): True or {"MAX_ENTRIES", "MAX_BYTES",
        # "MAX_LOCAL_TTL"}; None / False: off.
        "NEAR_CACHE": ((bool, dict, type(None)), None),
        # Add the "Log out everywhere" action to the user admin (needs the
        # django_redispatterns.contrib.devices app installed).
        "ADMIN_LOGOUT_ACTION": ((bool,), False),
        # Switching from another session engine (docs/migration.md): its dotted path, e.g.
        # "django.contrib.sessions.backends.cache"; None: none (a foreign cookie is a miss).
        "PREVIOUS_ENGINE": (_optional_str, None),
        # "primary": old processes still serve, sessions stay in the previous engine and are
        # mirrored into the per-user index; "read-through": ours holds them, a previous
        # engine's session is moved here on first use.
        "PREVIOUS_ENGINE_MODE": ((str,), "primary"),
        # An aware datetime (or ISO 8601 text with an offset) after which the previous engine
        # is no longer read; None: no end.
        "PREVIOUS_ENGINE_UNTIL": ((str, datetime, type(None)), None),
    },
}


class Config:
    """Validated, read-only view of ``REDIS_PATTERNS`` merged over the defaults."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __repr__(self) -> str:
        # Connections (URLs may carry passwords) and the key passphrase are not shown.
        shown = {k: v for k, v in self._values.items() if k != "CONNECTION"}
        tls = dict(self._values["TLS"])
        if tls["KEY_PASSWORD"] is not None:
            tls["KEY_PASSWORD"] = MASK
        shown["TLS"] = tls
        for feature in FEATURES:
            shown[feature] = {k: v for k, v in self._values[feature].items()
                              if k not in ("CONNECTION", "QUORUM")}
        return f"Config({shown!r})"

    @property
    def key_prefix(self) -> str:
        return str(self._values["KEY_PREFIX"])

    @property
    def tls(self) -> Mapping[str, Any]:
        """The merged ``TLS`` settings group."""
        return self._values["TLS"]

    def feature(self, feature: str) -> Mapping[str, Any]:
        """The merged settings section of ``feature`` ("LOCKS", "RATELIMIT", ...)."""
        return self._values[feature]

    def connection_for(self, feature: str | None) -> str:
        """The connection (CACHES alias or URL) that ``feature`` uses."""
        if feature is not None:
            own = self.feature(feature).get("CONNECTION")
            if own:
                return str(own)
        return str(self._values["CONNECTION"])


# Settings whose values may carry a secret (a passphrase, a URL with a password): an error
# about them names their type, never their value.
SECRET_SETTINGS = ("['KEY_PASSWORD']", "['CONNECTION']", "['QUORUM']")
MASK = "***"


def _shown(path: str, value: Any) -> str:
    return f" ({value!r})" if not path.endswith(SECRET_SETTINGS) else ""


def _check_type(path: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int subclass: a TTL of True is a mistake, not 1 second.
    if isinstance(value, bool) and bool not in types:
        raise ConfigurationError(f"{path} must be {_type_names(types)}, not a bool"
                                 f"{_shown(path, value)}.")
    if not isinstance(value, types):
        raise ConfigurationError(
            f"{path} must be {_type_names(types)}, got {type(value).__name__}"
            f"{_shown(path, value)}."
        )


def _type_names(types: tuple[type, ...]) -> str:
    names = ["None" if t is type(None) else t.__name__ for t in types]
    return " or ".join(names)


def _merge(path: str, schema: Mapping[str, Any], given: Any) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise ConfigurationError(f"{path} must be a dict, got {type(given).__name__}.")
    unknown = sorted(set(given) - set(schema))
    if unknown:
        raise ConfigurationError(
            f"{path} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys are {', '.join(sorted(schema))}."
        )
    merged: dict[str, Any] = {}
    for key, expected in schema.items():
        sub = f"{path}[{key!r}]"
        if isinstance(expected, dict):
            merged[key] = MappingProxyType(_merge(sub, expected, given.get(key, {})))
            continue
        types, default = expected
        value = given.get(key, default)
        _check_type(sub, value, types)
        merged[key] = value
    return merged


def _validate_values(values: Mapping[str, Any]) -> None:
    for path, value in (
        ("SOCKET_TIMEOUT", values["SOCKET_TIMEOUT"]),
        ("SOCKET_CONNECT_TIMEOUT", values["SOCKET_CONNECT_TIMEOUT"]),
        ("LOCKS']['TTL", values["LOCKS"]["TTL"]),
        ("LOCKS']['FENCING_TTL", values["LOCKS"]["FENCING_TTL"]),
        ("IDEMPOTENCY']['TTL", values["IDEMPOTENCY"]["TTL"]),
        ("IDEMPOTENCY']['LEASE", values["IDEMPOTENCY"]["LEASE"]),
        ("IDEMPOTENCY']['MAX_LEASE", values["IDEMPOTENCY"]["MAX_LEASE"]),
    ):
        if value <= 0:
            raise ConfigurationError(f"{SETTING_NAME}['{path}'] must be > 0, got {value!r}.")
    prefix = values["KEY_PREFIX"]
    if not prefix or any(c in prefix for c in "{}* \t\r\n"):
        raise ConfigurationError(
            f"{SETTING_NAME}['KEY_PREFIX'] must be non-empty, without spaces, braces or '*'; "
            f"got {prefix!r}."
        )
    max_per_user = values["SESSIONS"]["MAX_PER_USER"]
    if max_per_user < 1:
        raise ConfigurationError(
            f"{SETTING_NAME}['SESSIONS']['MAX_PER_USER'] must be >= 1, got {max_per_user!r}."
        )
    ip_storage = values["SESSIONS"]["IP_STORAGE"]
    if ip_storage not in ("truncate", "hash", "none"):
        raise ConfigurationError(
            f"{SETTING_NAME}['SESSIONS']['IP_STORAGE'] must be 'truncate', 'hash' or 'none', "
            f"got {ip_storage!r}."
        )


def _validate_tls(tls: Mapping[str, Any]) -> None:
    import os

    path = f"{SETTING_NAME}['TLS']"
    for name in ("CA_CERTS", "CERTFILE", "KEYFILE"):
        if tls[name] is not None and not os.path.isfile(tls[name]):
            raise ConfigurationError(
                f"{path}[{name!r}] must name a readable file; {tls[name]!r} is not a file.")
    if tls["KEYFILE"] and not tls["CERTFILE"]:
        raise ConfigurationError(f"{path}['KEYFILE'] needs {path}['CERTFILE'] (the client "
                                 "certificate the key belongs to).")
    if tls["KEY_PASSWORD"] is not None and not tls["CERTFILE"]:
        # The passphrase itself is never shown.
        raise ConfigurationError(f"{path}['KEY_PASSWORD'] is set but there is no "
                                 f"{path}['CERTFILE']/['KEYFILE'] to decrypt.")


def _validate_previous_engine(sessions: Mapping[str, Any]) -> Mapping[str, Any]:
    """The SESSIONS section with PREVIOUS_ENGINE_UNTIL parsed to an aware datetime."""
    name = f"{SETTING_NAME}['SESSIONS']"
    mode = sessions["PREVIOUS_ENGINE_MODE"]
    if mode not in ("primary", "read-through"):
        raise ConfigurationError(
            f"{name}['PREVIOUS_ENGINE_MODE'] must be 'primary' or 'read-through', got {mode!r}."
        )
    engine = sessions["PREVIOUS_ENGINE"]
    if engine is not None and engine.startswith("django_redispatterns.sessions"):
        raise ConfigurationError(
            f"{name}['PREVIOUS_ENGINE'] names this engine ({engine!r}); name the one you "
            "switch from, or None."
        )
    until = sessions["PREVIOUS_ENGINE_UNTIL"]
    if isinstance(until, str):
        try:
            until = datetime.fromisoformat(until)
        except ValueError:
            raise ConfigurationError(
                f"{name}['PREVIOUS_ENGINE_UNTIL'] is not an ISO 8601 date/time: {until!r}."
            ) from None
    if until is not None and until.utcoffset() is None:
        raise ConfigurationError(
            f"{name}['PREVIOUS_ENGINE_UNTIL'] needs a time zone (e.g. '+00:00'), got {until!r}."
        )
    return MappingProxyType({**sessions, "PREVIOUS_ENGINE_UNTIL": until})


def build_config(raw: Any) -> Config:
    """Validate a ``REDIS_PATTERNS`` value and return its merged :class:`Config`."""
    values = _merge(SETTING_NAME, SCHEMA, raw if raw is not None else {})
    _validate_values(values)
    _validate_tls(values["TLS"])
    values["SESSIONS"] = _validate_previous_engine(values["SESSIONS"])
    return Config(MappingProxyType(values))


@functools.cache
def get_config() -> Config:
    """The project's validated settings (cached; cleared when settings change)."""
    return build_config(getattr(settings, SETTING_NAME, {}))


@receiver(setting_changed, dispatch_uid="django_redispatterns.conf.reset_config")
def _reset_config(*, setting: str, **kwargs: Any) -> None:
    # A new Config object also for the settings that what is derived from it depends on
    # (key names hash with SECRET_KEY; connections name CACHES aliases), so a cache may
    # key on the Config object. Each layer above resets its own state with its own
    # receiver (clients in ``connection``, the key secret in ``keys``).
    if setting in (SETTING_NAME, "CACHES", "SECRET_KEY"):
        get_config.cache_clear()
