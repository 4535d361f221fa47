"""kcache's messages (``docs/logging.md``) into Python's ``logging``, logger ``kcache``.

Importing the package sends them there instead of stderr (``kc_set_log_callback``), each at
the matching level; ``KCACHE_LOG`` still decides which levels kcache sends (default
``warn``). A program without logging configuration sees warnings and errors on stderr, as
``logging`` shows any logger's. At exit the callback is removed again, before the
interpreter goes: kcache's background threads may still write, and then write to stderr.
"""

from __future__ import annotations

import atexit
import logging

from . import _lib

logger = logging.getLogger("kcache")

_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


def _forward(_ctx: object, level: int, message: bytes) -> None:
    try:
        logger.log(_LEVELS.get(level, logging.WARNING), "%s", message.decode(errors="replace"))
    except BaseException:  # noqa: BLE001 - nothing may escape into kcache's thread
        pass


_callback = _lib.LogFn(_forward)


def _install() -> None:
    _lib.lib.kc_set_log_callback(_callback, None)
    atexit.register(_lib.lib.kc_set_log_callback, _lib.LogFn(0), None)
