"""The soak: a small Django app on a production server under a checking load, with faults.

``./dev soak`` (or ``python -m soak``) runs it; see ``soak/README.md``.
"""
