"""What every operator command shares (``locks``, ``idempotency``, ``sessions``,
``ratelimit``, ``redis_audit``).

* **One line when Redis fails.** A Redis error (refused, timed out, ``READONLY``,
  ``NOPERM``...) or :class:`~django_redispatterns.exceptions.BackendUnavailable` ends the
  command with ``CommandError: Redis at <server> failed: <error>`` and exit status 1,
  never a traceback. The server is named with its password redacted; how long a dead or
  hung server can take is set by the connection's socket timeouts.
* **Nothing that moves the terminal.** Everything written to stdout and stderr goes
  through :func:`printable`: control characters (ESC, BEL, CR, ...) and bidirectional
  overrides in stored text (user agents, key names, lock owners) are printed escaped, as
  ``\\x1b``. Newlines and tabs lay out the output; a value that must stay on its line is
  passed through ``printable(value, keep="")`` first.
* **Users by primary key or name.** :func:`find_user` resolves ``--user`` / ``USER``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from typing import Any, TextIO

import redis
from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from ..conf import get_config
from ..connection import redact, redact_text
from ..connection.cacheoptions import entry_urls
from ..exceptions import BackendUnavailable, ConfigurationError

# C0 and C1 control characters, DEL, and the Unicode bidirectional overrides/isolates.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
FAILURES = (redis.RedisError, BackendUnavailable, OSError)


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with every control character except those in ``keep`` escaped."""
    def escape(match: re.Match[str]) -> str:
        char = match.group(0)
        if char in keep:
            return char
        code = ord(char)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNPRINTABLE.sub(escape, text)


class EscapingOutput(OutputWrapper):
    """Django's ``OutputWrapper`` that escapes before styling (the style's own colours
    survive; anything in the message does not)."""

    def write(  # type: ignore[override]  # (as OutputWrapper itself)
        self, msg: str = "", style_func: Any = None, ending: str | None = None
    ) -> None:
        super().write(printable(msg), style_func, ending)


def describe(connection: str) -> str:
    """A connection as an operator should read it: a URL redacted, an alias with its URL."""
    if "://" in connection:
        return redact(connection)
    from django.conf import settings

    entry = getattr(settings, "CACHES", {}).get(connection) or {}
    location: Any = entry.get("LOCATION")
    with contextlib.suppress(ConfigurationError):  # the URL with the database it uses
        location = next(iter(entry_urls(entry)), None)
    if isinstance(location, (list, tuple)):
        location = location[0] if location else None
    return f"{connection!r} ({redact(location)})" if isinstance(location, str) else repr(
        connection)


class RedisCommand(BaseCommand):
    """Base class of the app's commands: see the module docstring.

    ``feature`` names the ``REDIS_PATTERNS`` section whose connection the command uses;
    a command that talks to another connection says so with :meth:`using`.
    """

    feature: str | None = None

    def __init__(self, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 no_color: bool = False, force_color: bool = False) -> None:
        super().__init__(stdout, stderr, no_color, force_color)
        self.stdout = self._escaping(self.stdout, stdout or sys.stdout)
        self.stderr = self._escaping(self.stderr, stderr or sys.stderr)
        self._connection: str | None = None

    @staticmethod
    def _escaping(wrapper: OutputWrapper, stream: TextIO) -> EscapingOutput:
        escaping = EscapingOutput(stream)
        escaping.style_func = wrapper.style_func
        return escaping

    def using(self, connection: str) -> str:
        """Note the connection the command is about to use (named if it fails)."""
        self._connection = connection
        return connection

    def execute(self, *args: Any, **options: Any) -> Any:
        for name in ("stdout", "stderr"):
            stream = options.pop(name, None)
            if stream:
                setattr(self, name, self._escaping(getattr(self, name), stream))
        # Our loggers print to the terminal only where the project configured them to:
        # without a handler, Python's last resort would add a line to the one below.
        package_logger = logging.getLogger("django_redispatterns")
        silencer = None if package_logger.hasHandlers() else logging.NullHandler()
        if silencer is not None:
            package_logger.addHandler(silencer)
        try:
            return super().execute(*args, **options)
        except FAILURES as exc:
            raise CommandError(self.failure(exc), returncode=1) from None
        finally:
            if silencer is not None:
                package_logger.removeHandler(silencer)

    def failure(self, exc: BaseException) -> str:
        """The one line that says which server failed, and how."""
        connection = self._connection or get_config().connection_for(self.feature)
        error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        line = f"Redis at {describe(connection)} failed: {redact_text(error)}"
        return printable(" ".join(line.split()), keep="")


def find_user(value: str) -> Any:
    """The user ``value`` names: a primary key when it is all digits and such a user
    exists, otherwise a username (``USERNAME_FIELD``)."""
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    model = get_user_model()
    manager = model._default_manager
    found = None
    if value.isdigit():
        try:
            found = manager.filter(pk=value).first()
        except (ValueError, TypeError, ValidationError):  # a primary key of another kind
            found = None
    if found is None:
        found = manager.filter(**{model.USERNAME_FIELD: value}).first()
    if found is None:
        raise CommandError(f"no user with primary key or {model.USERNAME_FIELD} "
                           f"{printable(value, keep='')!r}")
    return found
