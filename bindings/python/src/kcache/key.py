"""``KeyBuilder``: the 32-byte disk key of a kernel, from everything that decides its binary."""

from __future__ import annotations

import ctypes
import enum
from typing import Union

from . import _lib
from ._errors import check
from ._owned import Owned

lib = _lib.lib
Bytes = Union[bytes, bytearray, memoryview, str]


class Field(enum.IntEnum):
    """The fields of a key (``KC_KEY_*``)."""

    BACKEND = 0
    DEVICE_NAME = 1
    DEVICE_VENDOR = 2
    DRIVER_VERSION = 3
    COMPILER_VERSION = 4
    ENTRY = 5
    SOURCE = 6


def key_bytes(value: Bytes) -> bytes:
    """Bytes as kcache takes them: a ``str`` is encoded as UTF-8, a bytes-like object copied.
    Anything else is a ``TypeError`` (``bytes(3)`` would make three zero bytes of an int)."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"kcache keys and key inputs are bytes or str, not {type(value).__name__}")


class KeyBuilder(Owned):
    """Collects the inputs of a key and derives it (``finish()``, 32 bytes).

    Fields may be given as keyword arguments or with ``set``; ``str`` values are UTF-8. Each
    method returns the builder, so calls chain::

        key = KeyBuilder(backend="mine", source=src).option("-O2").finish()

    Not thread-safe: use one builder per thread.
    """

    _what = "key builder"

    def __init__(
        self,
        *,
        backend: Bytes | None = None,
        device_name: Bytes | None = None,
        device_vendor: Bytes | None = None,
        driver_version: Bytes | None = None,
        compiler_version: Bytes | None = None,
        entry: Bytes | None = None,
        source: Bytes | None = None,
    ) -> None:
        self._create(lib.kc_key_builder_new)
        given = (backend, device_name, device_vendor, driver_version, compiler_version, entry)
        for field, value in zip(Field, (*given, source)):
            if value is not None:
                self.set(field, value)

    def set(self, field: Field, value: Bytes) -> KeyBuilder:
        """Sets one field, replacing an earlier value. An unset field differs from an empty one."""
        data = key_bytes(value)
        check(lib.kc_key_builder_set(self._handle(), int(field), data, len(data)))
        return self

    def option(self, name: Bytes, value: Bytes = b"") -> KeyBuilder:
        """A build option whose position does not matter (sorted by name; a flag has no value).
        Options that interact by position go through ``ordered_option``."""
        n, v = key_bytes(name), key_bytes(value)
        check(lib.kc_key_builder_option(self._handle(), n, len(n), v, len(v)))
        return self

    def extra(self, name: Bytes, value: Bytes) -> KeyBuilder:
        """A free-form input (specialization constants, a layout), sorted by name."""
        n, v = key_bytes(name), key_bytes(value)
        check(lib.kc_key_builder_extra(self._handle(), n, len(n), v, len(v)))
        return self

    def ordered_option(self, argument: Bytes) -> KeyBuilder:
        """One command-line argument, hashed in the order given."""
        a = key_bytes(argument)
        check(lib.kc_key_builder_ordered_option(self._handle(), a, len(a)))
        return self

    def dependency(self, name: Bytes, contents: Bytes) -> KeyBuilder:
        """A file the compiler reads besides the source (a header), by name and contents."""
        n, c = key_bytes(name), key_bytes(contents)
        check(lib.kc_key_builder_dependency(self._handle(), n, len(n), c, len(c)))
        return self

    def finish(self) -> bytes:
        """The key (32 bytes). The builder stays usable."""
        out = (ctypes.c_uint8 * _lib.KEY_LEN)()
        check(lib.kc_key_builder_finish(self._handle(), out))
        return bytes(out)

    def _free(self, ptr: int) -> None:
        lib.kc_key_builder_free(ptr)
