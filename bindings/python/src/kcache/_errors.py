"""kcache's status codes as Python exceptions."""

from __future__ import annotations

from ._lib import lib


class KcacheError(Exception):
    """A kcache call failed: ``status`` is its ``kc_status`` code, ``status_name`` its name."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.status_name = lib.kc_status_name(status).decode()
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)


class InvalidArgumentError(KcacheError, ValueError):
    """KC_ERR_INVALID_ARGUMENT: an argument kcache refused."""


class BuildFailedError(KcacheError):
    """KC_ERR_BUILD_FAILED from a build kcache ran itself (a backend's compiler); ``code`` is
    the runtime's status. A Python build function's own exception is raised as it is."""

    def __init__(self, status: int, message: str, code: int) -> None:
        self._code = code
        super().__init__(status, message)

    @property
    def code(self) -> int:
        # A property, as ``pyopencl.Error.code`` is: ``kcache.opencl`` derives from both.
        return self._code


class DeviceDestroyedError(KcacheError):
    """KC_ERR_DEVICE_DESTROYED: the device was evicted while the value was being built."""


class CacheClearedError(KcacheError):
    """KC_ERR_CACHE_CLEARED: an ``invalidated_by_clear`` cache was cleared during the build."""


class DestroyFailedError(KcacheError):
    """KC_ERR_DESTROY_FAILED: a destroy function raised; every other value was destroyed."""


class ReentrantError(KcacheError):
    """KC_ERR_REENTRANT: a build asked its cache for the key it is building."""


class UnavailableError(KcacheError):
    """KC_ERR_UNAVAILABLE: a runtime or facility is missing (no OpenCL, disk tier off)."""


class NotFoundError(KcacheError):
    """KC_ERR_NOT_FOUND: no entry for the key."""


class IntegrityError(KcacheError):
    """KC_ERR_INTEGRITY: stored data failed its check (the entry was removed)."""


class UntrustedError(KcacheError):
    """KC_ERR_UNTRUSTED: a cache directory is not private to this user, or a key is missing."""


_BY_STATUS: dict[int, type[KcacheError]] = {
    1: InvalidArgumentError,
    3: DeviceDestroyedError,
    4: CacheClearedError,
    5: DestroyFailedError,
    6: ReentrantError,
    7: NotFoundError,
    9: UnavailableError,
    11: IntegrityError,
    12: UntrustedError,
}

BUILD_FAILED = 2
REENTRANT = 6
NOT_FOUND = 7


def error(status: int) -> KcacheError:
    """The exception for a failed call's ``status``, with this thread's detail message."""
    message = lib.kc_last_error_message().decode(errors="replace")
    if status == BUILD_FAILED:
        return BuildFailedError(status, message, lib.kc_last_build_error())
    return _BY_STATUS.get(status, KcacheError)(status, message)


def check(status: int) -> None:
    """Raises the exception for ``status`` unless it is KC_OK."""
    if status != 0:
        raise error(status)
