"""TLS for every connection the app opens, from the one ``REDIS_PATTERNS["TLS"]`` group.

A URL asks for TLS by its scheme: ``rediss://`` (one server), ``rediss+sentinel://``
(Sentinels and the servers they name) and ``rediss+cluster://`` (every Cluster node).
Every client built for such a URL gets :func:`ssl_options`: the server's certificate is
always required and verified (against ``CA_CERTS`` when set, else the system's trust
store), its host name checked unless ``CHECK_HOSTNAME`` is False, and the client
certificate (``CERTFILE``/``KEYFILE``/``KEY_PASSWORD``) presented when one is set. A
certificate that does not verify is refused with redis-py's ``ConnectionError`` naming
the reason (``certificate verify failed: ...``); it is never accepted silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..conf import SETTING_NAME, get_config
from ..exceptions import ConfigurationError

TLS_SCHEMES = ("rediss", "rediss+sentinel", "rediss+cluster")


def uses_tls(url: str) -> bool:
    """True when ``url``'s scheme asks for TLS."""
    return url.split("://", 1)[0].lower() in TLS_SCHEMES


def _takes_key_password(init: Any) -> bool:
    import inspect

    return "ssl_password" in inspect.signature(init).parameters


def asyncio_takes_key_password() -> bool:
    """True when the installed redis-py's asyncio TLS connections can decrypt a client key
    (older releases have no ``ssl_password`` there)."""
    from redis.asyncio.connection import SSLConnection

    return _takes_key_password(SSLConnection.__init__)


def asyncio_cluster_takes_key_password() -> bool:
    """The same for redis-py's asyncio Cluster client, which takes the keywords itself."""
    from redis.asyncio.cluster import RedisCluster

    return _takes_key_password(RedisCluster.__init__)


def ssl_options(asyncio_client: bool = False) -> dict[str, Any]:
    """redis-py's ``ssl_*`` connection keywords for the configured certificates.

    Raises :class:`ConfigurationError` for an asyncio client when a ``KEY_PASSWORD`` is set
    that the installed redis-py's asyncio connections cannot use (never drops it)."""
    tls = get_config().tls
    if asyncio_client and tls["KEY_PASSWORD"] is not None and not asyncio_takes_key_password():
        raise ConfigurationError(
            "The installed redis-py's asyncio client cannot decrypt a client key: give "
            f"{SETTING_NAME}['TLS'] an unencrypted KEYFILE (and no KEY_PASSWORD) for "
            "rediss:// connections used from async code, or upgrade redis-py.")
    options: dict[str, Any] = {"ssl_cert_reqs": "required",
                               "ssl_check_hostname": bool(tls["CHECK_HOSTNAME"])}
    for setting, keyword in (("CA_CERTS", "ssl_ca_certs"), ("CERTFILE", "ssl_certfile"),
                             ("KEYFILE", "ssl_keyfile"), ("KEY_PASSWORD", "ssl_password")):
        if tls[setting] is not None:
            options[keyword] = tls[setting]
    return options


def with_tls_pool_kwargs(location: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """A cache's ``OPTIONS`` with the certificate settings added to its
    ``CONNECTION_POOL_KWARGS`` when a plain ``rediss://`` ``LOCATION`` asks for TLS (so
    django-redis's pools, and every client copied from them, verify like ours). ``ssl_*``
    keywords the entry sets itself win."""
    opts = dict(options)
    urls = location if isinstance(location, (list, tuple)) else str(location).split(",")
    if any(str(url).strip().lower().startswith("rediss://") for url in urls):
        pool_kwargs = dict(opts.get("CONNECTION_POOL_KWARGS") or {})
        for keyword, value in ssl_options().items():
            pool_kwargs.setdefault(keyword, value)
        opts["CONNECTION_POOL_KWARGS"] = pool_kwargs
    return opts
