"""Redis patterns for Django that hold under concurrency and faults.

Import-light on purpose: the cache backend, the session engine and the middleware
are named by dotted path in settings, so nothing here touches Django settings.
"""

__version__ = "0.2.0"

__all__ = ["__version__"]
