"""Signal receivers connected when the app is ready (see ``apps.py``).

Features that react to Django's own signals (e.g. ending other sessions on a password
change) connect their receivers here, so importing a feature module has no side effects.
"""

from __future__ import annotations
