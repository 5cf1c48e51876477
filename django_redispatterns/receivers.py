"""Signal receivers connected when the app is ready (see ``apps.py``).

Features that react to Django's own signals (e.g. ending other sessions on a password
change) connect their receivers here, so importing a feature module has no side effects.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver


@receiver(post_save, dispatch_uid="django_redispatterns.sessions.password_change")
def _logout_on_password_change(sender: Any, instance: Any, created: bool = False,
                               **kwargs: Any) -> None:
    """SESSIONS["LOGOUT_ON_PASSWORD_CHANGE"]: a saved new password ends the user's sessions.

    ``AbstractBaseUser.set_password()`` leaves the raw password in ``_password`` until
    ``save()`` has sent ``post_save``; that is the signal. Every session is deleted at once
    (not on commit: ``update_session_auth_hash()`` runs after this and re-creates the
    current session from memory, so the user who changed the password stays signed in).
    A Redis error is logged, not raised: Django's session auth hash still ends the other
    sessions on their next request.
    """
    if created or getattr(instance, "_password", None) is None:
        return
    from .conf import get_config

    if not get_config().feature("SESSIONS")["LOGOUT_ON_PASSWORD_CHANGE"]:
        return
    from .exceptions import BackendUnavailable
    from .sessions import logout_everywhere

    try:
        logout_everywhere(instance)
    except BackendUnavailable as exc:
        logging.getLogger("django_redispatterns.sessions").error(
            "password changed but sessions not revoked (Redis unavailable): %s", exc
        )
