"""``manage.py sessions list|revoke USER``: see and end a user's sessions (operators).

USER (positional, or ``--user USER``) is a primary key when it is all digits and such a user
exists, otherwise a username (``USERNAME_FIELD``). Sessions are shown by handle
(a hash of the cookie), never by the cookie value itself.

    manage.py sessions list alice
    manage.py sessions list --user 42                    # pk 42 (or the username "42")
    manage.py sessions revoke alice                      # every session
    manage.py sessions revoke alice --keep HANDLE        # all but one
    manage.py sessions revoke alice --session HANDLE     # just one
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...sessions import logout_everywhere, revoke_session, user_sessions
from ..base import RedisCommand, find_user, printable


class Command(RedisCommand):
    help = "List or revoke a user's sessions (Redis session engine with a per-user index)."
    feature = "SESSIONS"

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="show the user's live sessions")
        revoke = sub.add_parser("revoke", help="end the user's sessions")
        for command in (listing, revoke):
            command.add_argument("user", nargs="?", help="primary key (all digits) or username")
            command.add_argument("--user", dest="user_option", metavar="USER",
                                 help="the same, as an option")
        which = revoke.add_mutually_exclusive_group()
        which.add_argument("--keep", help="handle (or key) of a session to keep")
        which.add_argument("--session", help="handle (or key) of the one session to end")

    def handle(self, *args: Any, **options: Any) -> None:
        named = {v for v in (options["user"], options.get("user_option")) if v is not None}
        if len(named) != 1:
            raise CommandError("name one user: USER or --user USER (a primary key or username)")
        user = find_user(named.pop())
        if options["action"] == "list":
            self._list(user)
        elif options["session"]:
            if not revoke_session(user, options["session"]):
                raise CommandError("no such live session for this user")
            self.stdout.write("revoked 1 session")
        else:
            count = logout_everywhere(user, keep=options["keep"])
            self.stdout.write(f"revoked {count} session{'s' if count != 1 else ''}")

    def _list(self, user: Any) -> None:
        sessions = user_sessions(user)
        self.stdout.write(f"{len(sessions)} live session(s) of {user.get_username()}")
        for s in sessions:
            self.stdout.write(
                f"{s.session_key}  created {_iso(s.created)}  active {_iso(s.last_activity)}  "
                f"expires {_iso(s.expires)}  ip {printable(s.ip or '-', keep='')}  "
                f"{printable(s.user_agent or '-', keep='')}"
            )


def _iso(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"
