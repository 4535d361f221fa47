"""PyOpenCL programs from kcache: built once per source, options and device, kept on disk
for the next process.

``get_program(context, device, source, options)`` stands for
``pyopencl.Program(context, source).build(options, devices=[device])``. The OpenCL runtime is
loaded at run time by kcache (``libOpenCL.so.1``); pyopencl is imported only by
``get_program``.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import functools
from typing import TYPE_CHECKING

from . import _lib
from ._errors import BUILD_FAILED, BuildFailedError, UnavailableError, UntrustedError, check
from ._owned import Owned
from .disk import Disk
from .stats import DiskStats, OpenCLStats, from_struct, memory_stats

if TYPE_CHECKING:
    import pyopencl

lib = _lib.lib


def available() -> bool:
    """Whether kcache can load an OpenCL runtime in this process."""
    return bool(lib.kc_opencl_available() == 0)


@functools.lru_cache(maxsize=None)
def _program_build_error() -> type[BuildFailedError]:
    """``BuildFailedError`` made a ``pyopencl.RuntimeError`` too, so that code written for
    ``Program.build`` (``except cl.Error``, ``except cl.RuntimeError``) catches it. Made on
    first use: pyopencl is imported only when a program is asked for."""
    import pyopencl

    class ProgramBuildError(BuildFailedError, pyopencl.RuntimeError):  # type: ignore[misc]
        """A program failed to compile: ``code`` is OpenCL's status, the text holds the
        compiler's log."""

        # pyopencl's text expects its own error record; kcache's is the message itself.
        __str__ = Exception.__str__

    ProgramBuildError.__module__ = __name__
    return ProgramBuildError


def __getattr__(name: str) -> type[BuildFailedError]:
    # ``kcache.opencl.ProgramBuildError``, for ``except`` clauses; needs pyopencl.
    if name == "ProgramBuildError":
        return _program_build_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ProgramCache(Owned):
    """A cache of built OpenCL programs (``kc_opencl_cache``).

    ``use_disk`` keeps program binaries on disk (``disk_dir``, an absolute path; None takes
    ``KCACHE_DIR``, then ``$XDG_CACHE_HOME/kcache``, then ``~/.cache/kcache``) so that later
    processes load them instead of compiling. A directory others may write is not used: the
    cache then works from memory. ``close()`` waits for binaries still being written; programs
    handed out stay valid.
    """

    _what = "program cache"

    def __init__(
        self,
        *,
        use_disk: bool = True,
        disk_dir: str | os.PathLike[str] | None = None,
        max_entries: int = 0,
        max_weight: int = 0,
        disk_key: bytes | None = None,
        disk_require_key: bool = False,
        disk_lock_timeout_ms: int = 0,
    ) -> None:
        opts = lib.kc_opencl_options_default()
        opts.max_entries = max_entries
        opts.max_weight = max_weight
        # The persistent tiers the cache holds a reference to; kept here for their counters.
        self._disk: Disk | None = None
        if use_disk:
            try:
                self._disk = Disk(
                    disk_dir,
                    key=disk_key,
                    require_key=disk_require_key,
                    lock_timeout_ms=disk_lock_timeout_ms,
                )
            except (UnavailableError, UntrustedError):
                pass  # turned off or refused (warned once): memory only
        tiers = lib.kc_persistence_none() if self._disk is None else self._disk._handle()
        self._create(lib.kc_opencl_cache_new, ctypes.byref(opts), tiers)

    def get_program(
        self,
        context: pyopencl.Context,
        device: pyopencl.Device | None,
        source: str,
        options: str | list[str] | tuple[str, ...] = "",
    ) -> pyopencl.Program:
        """The built program for ``source`` and ``options`` on ``device`` of ``context``:
        from memory, else from a binary on disk, else compiled (concurrent callers share one
        compile, without holding the GIL). The ``pyopencl.Program`` owns its own reference;
        the cache keeps another. ``device`` None: the context's only device. A compile error
        raises ``ProgramBuildError`` with the compiler's log: a ``BuildFailedError`` that is
        also a ``pyopencl.RuntimeError``, as PyOpenCL's own build raises."""
        import pyopencl

        if device is None:
            devices = context.devices
            if len(devices) != 1:
                raise ValueError("device=None needs a context with exactly one device")
            device = devices[0]
        if not isinstance(options, str):
            options = " ".join(options)
        src = source.encode()
        sources = (ctypes.c_char_p * 1)(src)
        lengths = (ctypes.c_size_t * 1)(len(src))
        device_list = (ctypes.c_void_p * 1)(device.int_ptr)
        program = (ctypes.c_void_p * 1)()
        status = lib.kc_opencl_cache_find_or_build_program(
            self._handle(), context.int_ptr, 1, device_list, sources, lengths, 1,
            options.encode(), program, None,
        )
        if status == BUILD_FAILED:
            message = lib.kc_last_error_message().decode(errors="replace")
            raise _program_build_error()(status, message, lib.kc_last_build_error())
        check(status)
        return pyopencl.Program.from_int_ptr(program[0], retain=False)

    def evict_context(self, context: pyopencl.Context) -> int:
        """Gives up the cache's programs of ``context`` (call before dropping the context);
        returns how many. Programs a caller still holds keep working."""
        count = ctypes.c_size_t()
        check(lib.kc_opencl_cache_evict_context(self._handle(), context.int_ptr, count))
        return count.value

    def evict_device(self, device: pyopencl.Device) -> int:
        """Gives up the cache's programs built for ``device``, in every context."""
        count = ctypes.c_size_t()
        check(lib.kc_opencl_cache_evict_device(self._handle(), device.int_ptr, count))
        return count.value

    def clear(self) -> None:
        """Gives up every program the cache holds (the disk keeps its binaries)."""
        check(lib.kc_opencl_cache_clear(self._handle()))

    def flush(self) -> None:
        """Waits until every program built so far has its binary on disk. On PoCL binaries
        are held back until this call (or another process waiting for them), so that they
        carry the code the launches compiled: call it after the warm-up launches."""
        check(lib.kc_opencl_cache_flush(self._handle()))

    def stats(self) -> OpenCLStats:
        out = _lib.OpenclCacheStatistics(struct_size=ctypes.sizeof(_lib.OpenclCacheStatistics))
        out.memory.struct_size = ctypes.sizeof(_lib.CacheStatistics)
        check(lib.kc_opencl_cache_stats(self._handle(), ctypes.byref(out)))
        # The counters of the persistent tiers, all zero without them.
        none = _lib.DiskStatistics(struct_size=ctypes.sizeof(_lib.DiskStatistics))
        disk = from_struct(DiskStats, none) if self._disk is None else self._disk.stats()
        return from_struct(
            OpenCLStats,
            out,
            memory=memory_stats(out.memory, out.binary_loads),
            disk=disk,
        )

    def reset_stats(self) -> None:
        check(lib.kc_opencl_cache_reset_stats(self._handle()))

    def _free(self, ptr: int) -> None:
        lib.kc_opencl_cache_free(ptr)
        if self._disk is not None:
            self._disk.close()


_default: ProgramCache | None = None
_default_lock = threading.Lock()


def default_cache() -> ProgramCache:
    """The process's shared program cache, with the disk tier at its default location. Made
    on first use; flushed and freed at exit, so the next process finds the binaries."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgramCache(use_disk=True)
            atexit.register(_close_default, _default)
        return _default


def _close_default(cache: ProgramCache) -> None:
    cache.flush()
    cache.close()


def get_program(
    context: pyopencl.Context,
    device: pyopencl.Device | None,
    source: str,
    options: str | list[str] | tuple[str, ...] = "",
    *,
    cache: ProgramCache | None = None,
) -> pyopencl.Program:
    """``ProgramCache.get_program`` on ``cache``, by default the process's shared cache."""
    return (cache if cache is not None else default_cache()).get_program(context, device, source, options)


__all__ = ["ProgramCache", "available", "default_cache", "get_program"]
