"""The process's metrics as Prometheus text (``kc_metrics_render``, ``docs/metrics.md``)."""

from __future__ import annotations

import ctypes

from . import _lib
from ._errors import check

# KC_ERR_BUFFER_TOO_SMALL: the figures grew between asking the size and rendering.
_BUFFER_TOO_SMALL = 14


def render_metrics() -> str:
    """The metrics of every kcache cache alive in this process (memory and disk tiers,
    backends), in the Prometheus text exposition format 0.0.4: serve it on ``/metrics``."""
    needed = ctypes.c_size_t()
    check(_lib.lib.kc_metrics_render(None, 0, ctypes.byref(needed)))
    while True:
        buf = ctypes.create_string_buffer(needed.value)
        status = _lib.lib.kc_metrics_render(buf, len(buf), ctypes.byref(needed))
        if status != _BUFFER_TOO_SMALL:
            check(status)
            return buf.value.decode()
