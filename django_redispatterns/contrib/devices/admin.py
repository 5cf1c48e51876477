"""A "Log out everywhere" action for the user admin.

Add it to your own ``UserAdmin`` (nothing of yours is replaced)::

    from django_redispatterns.contrib.devices.admin import logout_everywhere_action

    @admin.register(User)
    class MyUserAdmin(UserAdmin):
        actions = [*UserAdmin.actions, logout_everywhere_action]

or call :func:`add_logout_everywhere_action` once the admin is loaded, or let the devices
app do that (``"django_redispatterns.contrib.devices"`` in ``INSTALLED_APPS`` after
``django.contrib.admin``, with ``REDIS_PATTERNS["SESSIONS"]["ADMIN_LOGOUT_ACTION"] = True``).

Only staff holding the ``auth.change_user`` permission (``<app>.change_<model>`` of a custom
user model) see and may run the action.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest

from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.sessions import logout_everywhere

__all__ = ["add_logout_everywhere_action", "logout_everywhere_action"]


def _change_permission() -> str:
    opts = get_user_model()._meta
    return f"{opts.app_label}.change_{opts.model_name}"


# permissions=["change"]: the admin lists the action only for users whose
# has_change_permission() is true on the user admin (``auth.change_user`` by default).
@admin.action(description="Log out everywhere (end every session of the selected users)",
              permissions=["change"])
def logout_everywhere_action(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]
                             ) -> None:
    """End every session of each selected user; reports how many sessions ended.

    Refuses (an error message, nothing ended) for a user without the change permission of
    the user model. If Redis cannot be reached the admin shows an error and the users whose
    sessions were ended before that are named in it.
    """
    if not request.user.has_perm(_change_permission()):
        modeladmin.message_user(request, "You are not allowed to log users out.",
                                messages.ERROR)
        return
    users = total = 0
    for user in queryset.iterator():
        try:
            total += logout_everywhere(user)
        except BackendUnavailable:
            modeladmin.message_user(
                request, f"The session store is unavailable: {users} user(s) were logged "
                         f"out ({total} sessions) before it failed.", messages.ERROR)
            return
        users += 1
    modeladmin.message_user(request, f"Logged out {users} user(s) everywhere "
                                     f"({total} session(s) ended).", messages.SUCCESS)


def add_logout_everywhere_action(site: admin.AdminSite | None = None) -> bool:
    """Add the action to the user model's admin on ``site`` (default: ``admin.site``).

    Works on whatever ``ModelAdmin`` the project registered for the user model (its own
    ``actions`` are kept). Returns False, changing nothing, when the user model is not
    registered there; True when the action is there (added now or before).
    """
    site = site if site is not None else admin.site
    model_admin = site._registry.get(get_user_model())
    if model_admin is None:
        return False
    actions = list(model_admin.actions or [])
    if logout_everywhere_action not in actions:
        model_admin.actions = [*actions, logout_everywhere_action]
    return True
