"""What Celery prints of an app's settings, with the saga's secrets taken out.

``celery report`` and ``celery inspect conf`` (which Flower's worker page asks, and anyone
who may send a control command) print the app's settings through ``conf.table()`` and
Celery's censor, ``celery.app.utils.filter_hidden_settings``. That censor masks a setting
whose name looks secret (KEY, PASS, SECRET...), but it recurses into a mapping first and
then tests the inner names only: ``saga_payload_keys = {"2026-12": key}`` was printed whole.
And no pattern of it matches ``saga_store_url``, whose password was printed too.
``hide_secrets(app)`` has that app's table pass ``printable`` after Celery's own censor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.app.utils import HIDDEN_SETTINGS
from sqlalchemy.exc import ArgumentError

from celery_saga.encryption import PayloadKeys
from celery_saga.store.identity import shown_store

#: What a secret Celery would have masked is shown as (Celery's own mask).
MASK = "*" * 8


def printable(table: Mapping[str, Any]) -> dict[str, Any]:
    """``table`` (setting -> value, as Celery's censor left it) as it may be printed: the
    payload keys by their ids, a saga URL without its password, any other saga setting
    whose name looks secret masked whole, even a mapping."""
    shown = dict(table)
    for name, value in table.items():
        if name == "saga_payload_keys":
            shown[name] = _key_ids(value)
        elif name.startswith("saga_") and name.endswith("_url") and isinstance(value, str):
            shown[name] = _shown_url(value)
        elif name.startswith("saga_") and HIDDEN_SETTINGS.search(name):
            shown[name] = MASK
    return shown


def _key_ids(value: Any) -> str:
    if isinstance(value, PayloadKeys):
        return repr(value)
    if isinstance(value, Mapping):
        return repr(PayloadKeys(value))
    return MASK


def _shown_url(url: str) -> str:
    try:
        return shown_store(url)
    except (ArgumentError, ValueError):
        return "<unparsable url>"  # as Celery shows a result backend it cannot parse


def hide_secrets(app: Celery) -> None:
    """Every table of ``app``'s settings Celery prints goes through ``printable``; so does
    the table of settings a later ``config_from_object`` loads."""
    _censor_table(app.conf)

    def reconfigured(sender: Any = None, source: Any = None, **_: Any) -> None:
        if sender is app and source is not None:
            _censor_table(source)

    app.on_after_configure.connect(reconfigured, weak=False)


def _censor_table(conf: Any) -> None:
    """Give ``conf`` (Celery's ``Settings``) a ``table`` of its own; ``humanize`` (the
    report) and the ``conf`` control command both call it. Celery keeps its own attributes
    in the instance's ``__dict__`` too, since setting an attribute sets a setting."""
    if "table" in vars(conf):
        return
    table: Callable[..., dict[str, Any]] = conf.table

    @functools.wraps(table)
    def censoring(with_defaults: bool = False, censored: bool = True) -> dict[str, Any]:
        shown = table(with_defaults, censored)
        return printable(shown) if censored else shown

    conf.__dict__["table"] = censoring
