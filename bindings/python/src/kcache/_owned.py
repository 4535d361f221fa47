"""The life cycle every kcache object has in Python: ``close()``, ``with``, and a last resort
when the Python object is collected."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from ._errors import check

T = TypeVar("T", bound="Owned")


class Owned:
    """Owns one kcache object (``_ptr``), freed once by ``_free``."""

    __slots__ = ("_ptr",)
    _ptr: int | None
    _what = "object"

    def _free(self, ptr: int) -> None:
        raise NotImplementedError

    def _create(self, new: Callable[..., int], *args: Any) -> None:
        """Makes the kcache object with ``new(*args, &out)``; raises its failure."""
        self._ptr = None
        out = ctypes.c_void_p()
        check(new(*args, ctypes.byref(out)))
        self._ptr = out.value

    def close(self) -> None:
        """Frees the kcache object. A second call does nothing."""
        try:
            ptr = self._ptr
        except AttributeError:  # __init__ failed before setting it
            return
        self._ptr = None
        if ptr is not None:
            self._free(ptr)

    @property
    def closed(self) -> bool:
        return getattr(self, "_ptr", None) is None

    def _handle(self) -> int:
        ptr = self._ptr
        if ptr is None:
            raise ValueError(f"the {self._what} is closed")
        return ptr

    def __enter__(self: T) -> T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
