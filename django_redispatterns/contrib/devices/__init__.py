"""A "Your devices" page and a "Log out everywhere" admin action for the Redis session engine.

Pages: ``path("account/devices/", include("django_redispatterns.contrib.devices.urls"))``.
Admin: :mod:`django_redispatterns.contrib.devices.admin`. See docs/sessions.md.
"""
