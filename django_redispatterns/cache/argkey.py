"""The default key of ``@cached``: a digest of the call's arguments by *identity*.

``repr()`` is not identity: a Django model instance prints as ``<Model: str()>``, so two
rows with the same display text would share one entry, and whoever can set that text
could read another row's cached result. Instead every argument is encoded canonically:

* a saved model instance by ``app_label.model_name``, database alias and primary key (an
  unsaved one has no identity yet and is refused);
* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``Decimal``, ``UUID``,
  ``date``/``datetime``/``time`` and ``tuple``/``list``/``dict``/``set``/``frozenset`` of
  those by a type-tagged, length-prefixed encoding (``1`` and ``"1"`` differ, ``("a,b",)``
  and ``("a", "b")`` differ, a dict or set does not depend on its order);
* anything else raises :class:`~django_redispatterns.exceptions.UncacheableArgument`:
  pass ``key=`` to say how such an argument identifies the result.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Model

from ..exceptions import UncacheableArgument

_ATOMS: tuple[tuple[type, bytes, Callable[[Any], str]], ...] = (
    # bool before int (it is one); datetime before date (likewise).
    (bool, b"b", lambda v: "1" if v else "0"),
    (int, b"i", str),
    (float, b"f", float.hex),
    (decimal.Decimal, b"d", str),
    (uuid.UUID, b"u", lambda v: v.hex),
    (datetime.datetime, b"t", datetime.datetime.isoformat),
    (datetime.date, b"D", datetime.date.isoformat),
    (datetime.time, b"T", datetime.time.isoformat),
)


def _framed(tag: bytes, payload: bytes) -> bytes:
    return tag + str(len(payload)).encode() + b":" + payload


def encode(value: Any, where: str = "argument") -> bytes:
    """The canonical bytes of ``value``; :class:`UncacheableArgument` names what cannot
    be encoded (``where`` says which argument it is)."""
    if value is None:
        return b"N"
    if isinstance(value, str):
        return _framed(b"s", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _framed(b"y", bytes(value))
    for kind, tag, text in _ATOMS:
        if isinstance(value, kind):
            return _framed(tag, text(value).encode())
    if isinstance(value, Model):
        return _framed(b"m", _model_identity(value, where))
    if isinstance(value, (tuple, list)):
        tag = b"(" if isinstance(value, tuple) else b"["
        return _framed(tag, b"".join(encode(v, f"{where}[{i}]") for i, v in enumerate(value)))
    if isinstance(value, (set, frozenset)):
        return _framed(b"{", b"".join(sorted(encode(v, f"{where} member") for v in value)))
    if isinstance(value, dict):
        items = sorted(encode(k, f"{where} key") + encode(v, f"{where}[{k!r}]")
                       for k, v in value.items())
        return _framed(b"<", b"".join(items))
    raise UncacheableArgument(
        f"@cached cannot build a key from {where} of type {type(value).__qualname__}: its "
        "identity is unknown (repr() is not identity). Pass a model instance, a plain "
        "value, or key= (a template such as 'report:{0.pk}', or a callable)."
    )


def _model_identity(instance: Model, where: str) -> bytes:
    if instance.pk is None:
        raise UncacheableArgument(
            f"@cached cannot build a key from {where}: the {type(instance).__qualname__} "
            "instance is not saved (it has no primary key yet)."
        )
    # The database alias too: with one database per tenant, pk 1 of two databases are
    # two different rows. (An instance built with a pk but never saved or fetched counts
    # as the default database's row.)
    db = instance._state.db or DEFAULT_DB_ALIAS
    return _framed(b"m", instance._meta.label_lower.encode()) + encode(db) + encode(
        instance.pk, where)


def digest(arguments: dict[str, Any]) -> str:
    """A 32-hex-digit digest of the bound arguments (name -> value)."""
    payload = b"".join(_framed(b"a", name.encode()) + encode(value, f"argument {name!r}")
                       for name, value in arguments.items())
    return hashlib.sha256(payload).hexdigest()[:32]
