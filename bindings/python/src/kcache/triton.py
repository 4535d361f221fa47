"""Triton's compiled kernels in kcache's tiers: each kernel compiled once per node, and once per
cluster with the Redis tier.

Switched on with one variable::

    TRITON_CACHE_MANAGER=kcache.triton:CacheManager

Triton then asks this module for every kernel it compiles (``triton.compile``, ``@triton.jit``
launches, each autotuning config). A kernel is the group of files of one compile (the IRs, the
cubin and the metadata JSON); the group is one kcache entry, written once the compile is over
and read whole, so a reader never sees a cubin without its metadata nor files of two compiles.
Entries are checked (authenticated with ``KCACHE_KEY_FILE``) and configured by the same
``KCACHE_*`` variables as every kcache cache (``KCACHE_DIR``, ``KCACHE_REMOTE_URL``, the caps,
``KCACHE_DISABLE``). See ``docs/triton.md``.

How one compile per node comes about: Triton asks for the group (``get_group``) before it
compiles, and stores the files (``put``, ``put_group``) after. A miss makes a kcache tiered
lookup on a thread of its own whose build waits for ``put_group``: while Triton compiles, that
lookup holds the entry's lock (and the cluster's lease), so every other process asking for the
kernel waits for the entry instead of compiling, with kcache's lock timeout, heartbeat and
takeover rules. The claim lives only while Triton's ``compile()`` that asked for the group
runs: the lookup's thread watches the compiling thread's stack, and a compile that returned or
raised without storing its group gives the claim up within a tenth of a second, whatever holds
the cache manager (an exception's traceback holds ``compile()``'s frame, and with it the
manager).

Files Triton opens by path are written from the verified entry into a private directory of
this process (``mkdtemp``, removed at exit), never read from a path the store names.

``RemoteBackend`` is the same cache behind Triton's own ``RemoteCacheManager``
(``TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager``,
``TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend``): file by file as that interface
asks, but each group still one entry, shared with ``CacheManager``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from ._errors import KcacheError, UnavailableError, UntrustedError
from .cache import Cache
from .disk import Disk
from .tiered import TieredCache

#: The backend named in the entries' descriptors (``kcache ls``) and in their disk keys.
BACKEND = "triton"

_log = logging.getLogger("kcache.triton")

# The payload of an entry: this line, the header's length (4 bytes, big-endian), the header
# (JSON: the Triton key, the group's file name and each file's name and size), the files.
_MAGIC = b"kcache-triton 1\n"
_MAX_HEADER = 1 << 20
_MAX_NAME = 255
# What the memory tier keeps of the groups this process saw, in bytes.
_MEMORY_WEIGHT = 256 << 20
# How long a compile may take before its claim is given up, without KCACHE_LOCK_TIMEOUT.
_DEFAULT_CLAIM_S = 120.0
# How often a claim's lookup looks whether Triton's compile() that holds it is still running:
# the longest a compile that failed keeps other processes waiting.
_WATCH_S = 0.1
# Triton's compile() (module, function): the only caller of get_group and put_group.
_COMPILE = ("triton.compiler.compiler", "compile")
# How long exit waits for a lookup it gave up to leave kcache's call.
_EXIT_WAIT_S = 5.0

if TYPE_CHECKING:

    class _Base:
        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None: ...

    class _RemoteBase:
        def __init__(self, key: str) -> None: ...

else:
    # Triton checks the name of a class in the bases only: without Triton, stand-ins of the
    # same names let the module import.
    try:
        from triton.runtime.cache import CacheManager as _Base
    except ImportError:

        class CacheManager:
            def __init__(self, key, override=False, dump=False):
                pass

        _Base = CacheManager
    try:
        from triton.runtime.cache import RemoteCacheBackend as _RemoteBase
    except ImportError:

        class RemoteCacheBackend:
            def __init__(self, key):
                pass

        _RemoteBase = RemoteCacheBackend


class _Abandoned(Exception):
    """A compile that claimed an entry stored no group (it failed, or took too long)."""


@dataclass(frozen=True)
class TritonStats:
    """What this process's cache manager did since it started.

    - ``compiles``: kernels Triton compiled here after a miss (this process held the claim,
      or compiled without one because the claim could not be had);
    - ``loads``: kernels handed to Triton from kcache (memory, disk, or the remote tier);
    - ``unclaimed``: of ``compiles``, those compiled without the entry's claim (its leader in
      this process gave it up, or kcache's lookup failed);
    - ``abandoned``: claims given up without a group (a compile that raised, or ran past the
      lock timeout);
    - ``files_put``, ``files_loaded``: single files (not groups) stored and found: Triton's
      launcher modules and autotuning results.
    """

    compiles: int = 0
    loads: int = 0
    unclaimed: int = 0
    abandoned: int = 0
    files_put: int = 0
    files_loaded: int = 0


def _safe_name(name: object) -> str:
    """A file name from an entry, or ValueError: one path component, nothing hidden in it."""
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise ValueError("bad file name in entry")
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(f"bad file name in entry: {name!r}")
    return name


def pack(key: str, group: str, files: Mapping[str, bytes]) -> bytes:
    """The payload of the entry holding ``files`` for Triton key ``key`` under ``group``."""
    names = [_safe_name(n) for n in sorted(files)]
    header = json.dumps(
        {"key": key, "group": group, "files": [[n, len(files[n])] for n in names]},
        separators=(",", ":"),
    ).encode()
    parts = [_MAGIC, struct.pack(">I", len(header)), header]
    parts.extend(bytes(files[n]) for n in names)
    return b"".join(parts)


def unpack(payload: bytes, key: str, group: str) -> dict[str, bytes]:
    """The files of ``payload``, which must be the entry of ``key`` and ``group``; ValueError
    for anything else (a foreign, truncated or malformed entry)."""
    if not payload.startswith(_MAGIC):
        raise ValueError("not a Triton entry")
    at = len(_MAGIC)
    if len(payload) < at + 4:
        raise ValueError("truncated entry")
    (size,) = struct.unpack_from(">I", payload, at)
    at += 4
    if size > _MAX_HEADER or len(payload) < at + size:
        raise ValueError("truncated entry")
    header: Any = json.loads(payload[at : at + size])
    at += size
    if not isinstance(header, dict) or header.get("key") != key or header.get("group") != group:
        raise ValueError("the entry of another kernel")
    listed = header.get("files")
    if not isinstance(listed, list):
        raise ValueError("malformed entry")
    files: dict[str, bytes] = {}
    for item in listed:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], int):
            raise ValueError("malformed entry")
        name, length = _safe_name(item[0]), item[1]
        if length < 0 or name in files or len(payload) < at + length:
            raise ValueError("malformed entry")
        files[name] = payload[at : at + length]
        at += length
    if at != len(payload):
        raise ValueError("trailing bytes in entry")
    if group not in files:
        raise ValueError("the entry lacks its group's file")
    return files


def _claim_seconds() -> float:
    """How long a compile may hold its claim: ``KCACHE_LOCK_TIMEOUT``, as long as followers
    wait for it."""
    raw = os.environ.get("KCACHE_LOCK_TIMEOUT")
    if raw:
        try:
            value = float(raw)
            if value >= 0:
                return min(value, 100 * 365 * 86400.0)
        except ValueError:
            pass
    return _DEFAULT_CLAIM_S


def _compile_frame() -> int | None:
    """The identity (``id``) of the frame of the innermost Triton ``compile()`` this thread is
    in, or None (a cache manager called by something else). Not the frame itself: it holds the
    manager, which holds the claim, and a reference would keep all three until the claim
    closes. The identity is unique while the frame lives, which is while it runs and while
    anything keeps it; a frame that is gone took its manager with it, whose collection gives
    the claim up."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if (frame.f_globals.get("__name__"), frame.f_code.co_name) == _COMPILE:
            return id(frame)
        frame = frame.f_back
    return None


def _on_stack(thread: int, frame: int) -> bool:
    """Whether the frame of identity ``frame`` is still running on thread ``thread``. A frame
    that returned or raised is on no thread's stack, whoever keeps the object."""
    top = sys._current_frames().get(thread)
    while top is not None:
        if id(top) == frame:
            return True
        top = top.f_back
    return False


class _Claim:
    """A miss this process compiles: the lookup thread's build waits for its group, while
    Triton's ``compile()`` that asked for it (``frame``, where there is one) runs."""

    def __init__(self, frame: int | None) -> None:
        self.thread = threading.get_ident()
        self.frame = frame
        self.building = False
        self.payload: bytes | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.woken = threading.Event()  # the build began, or the lookup ended
        self.closed = threading.Event()  # a group came, or the claim was given up
        self.thread_done = threading.Event()

    def finish(self, payload: bytes) -> bool:
        """Hands the group to the build; False when the claim was given up before."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self.payload = payload
        self.closed.set()
        return True

    def abandon(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self.closed.set()
        return True

    def wait(self, limit: float) -> None:
        """Waits until the claim closes, ``limit`` seconds pass, or the compile that holds it
        is over (it returned or raised without storing its group)."""
        if self.frame is None:  # no compile() to watch: the limit, or the manager's collection
            self.closed.wait(limit)
            return
        deadline = time.monotonic() + limit
        while not self.closed.wait(min(_WATCH_S, max(deadline - time.monotonic(), 0.0))):
            if time.monotonic() >= deadline or not _on_stack(self.thread, self.frame):
                return


class _State:
    """The process's tiers, private directory and counters (made on first use)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.pending: dict[str, _Claim] = {}
        self.counts: dict[str, int] = {f: 0 for f in TritonStats.__dataclass_fields__}
        self.disk: Disk | None = None
        self.tiered: TieredCache[bytes] | None = None
        try:
            self.disk = Disk()
        except (UnavailableError, UntrustedError) as exc:
            # Turned off (KCACHE_DISABLE) or refused (warned by kcache): Triton's own cache.
            _log.info("kcache.triton: kcache's disk tier is off (%s): Triton's own cache is used", exc)
        if self.disk is not None:
            memory: Cache[bytes] = Cache(max_weight=_MEMORY_WEIGHT, weigher=len)
            self.tiered = TieredCache(
                memory, self.disk, load=_checked, serialize=bytes, backend=BACKEND
            )
        self.dir = tempfile.mkdtemp(prefix="kcache-triton-")
        atexit.register(self.close)

    def count(self, field: str, n: int = 1) -> None:
        with self.lock:
            self.counts[field] += n

    def close(self) -> None:
        claims = list(self.pending.values())
        for claim in claims:
            claim.abandon()
        # A daemon thread still inside kcache's call when the interpreter finalizes is ended
        # there by Python (a forced unwind through the library, which aborts the process): the
        # lookups given up here return first.
        for claim in claims:
            if claim.building:
                claim.thread_done.wait(_EXIT_WAIT_S)
        if self.disk is not None:
            try:
                self.disk.flush()
            except KcacheError:
                pass
        if os.getpid() == self.pid:
            shutil.rmtree(self.dir, ignore_errors=True)

    def materialize(self, key: str, files: Mapping[str, bytes]) -> dict[str, str]:
        """Writes ``files`` into a directory of their own under the private directory (named
        by their contents, so one kernel's files never mix with another compile's) and
        returns each one's path. The directory is made whole under a temporary name, then
        renamed into place."""
        digest = hashlib.sha256()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        base = os.path.join(self.dir, _safe_name(key))
        final = os.path.join(base, digest.hexdigest()[:32])
        if not os.path.isdir(final):
            os.makedirs(base, mode=0o700, exist_ok=True)
            temp = tempfile.mkdtemp(prefix=".tmp-", dir=base)
            for name, data in files.items():
                with open(os.path.join(temp, _safe_name(name)), "wb") as f:
                    f.write(data)
            try:
                os.rename(temp, final)
            except OSError:  # another thread made the same directory first
                shutil.rmtree(temp, ignore_errors=True)
        return {name: os.path.join(final, name) for name in files}

    def scratch(self, key: str) -> str:
        """A directory for the files of one compile in progress."""
        path = os.path.join(self.dir, _safe_name(key), f"build-{uuid.uuid4().hex}")
        os.makedirs(path, mode=0o700)
        return path


def _checked(payload: bytes) -> bytes:
    """The load step of a tiered lookup: an entry that is no Triton entry is refused (kcache
    removes it and the kernel is compiled)."""
    if not payload.startswith(_MAGIC):
        raise ValueError("not a Triton entry")
    return payload


_state_lock = threading.Lock()
_the_state: _State | None = None


def _state() -> _State:
    global _the_state
    with _state_lock:
        if _the_state is None or _the_state.pid != os.getpid():
            # A forked child: claims are the parent's, and so is its directory.
            _the_state = _State()
        return _the_state


def stats() -> TritonStats:
    """This process's counters (``TritonStats``)."""
    state = _state()
    with state.lock:
        return TritonStats(**state.counts)


def disk() -> Disk | None:
    """The disk tier Triton's kernels go to (its ``stats()``), or None when kcache is off."""
    return _state().disk


def _write(path: str, data: bytes) -> None:
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


def _entry(key: str, filename: str) -> bytes:
    return f"{key}/{filename}".encode()


def _descriptor_name(filename: str) -> str:
    return filename[: -len(".json")] if filename.endswith(".json") else filename


def _find_group(state: _State, key: str, group: str) -> dict[str, bytes] | _Claim | None:
    """The files of the group ``group`` of Triton key ``key`` from kcache's tiers; or the claim
    on its entry, when this process is to compile it (handed to ``_store_group`` with the
    files); or None, when it is to compile it without the claim (its lookup failed, or another
    thread of this process gave the claim up)."""
    assert state.tiered is not None
    tiered: TieredCache[bytes] = state.tiered
    entry = _entry(key, group)
    ident = entry.decode()
    with state.lock:
        old = state.pending.get(ident)
    if old is not None and old.thread == threading.get_ident():
        # This thread compiles the kernel again: its earlier compile of it is over.
        _give_up(old, state)
    claim = _Claim(_compile_frame())
    outcome: list[object] = []
    limit = _claim_seconds()

    def build(_key: object) -> bytes:
        claim.building = True
        claim.woken.set()
        claim.wait(limit)
        if claim.payload is None:
            _give_up(claim, state)
            raise _Abandoned(f"the compile of {group} stored no group")
        return claim.payload

    def lookup() -> None:
        try:
            lease = tiered.find_or_build(entry, build, name=_descriptor_name(group))
            with lease as value:
                outcome.append(value)
        except BaseException as exc:  # noqa: BLE001 - the caller compiles instead
            outcome.append(exc)
        finally:
            claim.thread_done.set()
            claim.woken.set()
            with state.lock:
                if state.pending.get(ident) is claim:
                    del state.pending[ident]

    with state.lock:
        state.pending[ident] = claim
    threading.Thread(target=lookup, name="kcache-triton", daemon=True).start()
    claim.woken.wait()
    if claim.building:
        state.count("compiles")
        return claim
    value = outcome[0] if outcome else None
    if isinstance(value, bytes):
        try:
            files = unpack(value, key, group)
        except ValueError as exc:
            _log.warning("kcache.triton: %s: %s; compiling", group, exc)
            tiered.cache.remove(entry)
            if tiered.disk is not None:
                tiered.disk.remove(tiered.disk_key(entry))
        else:
            state.count("loads")
            return files
    elif isinstance(value, BaseException) and not isinstance(value, _Abandoned):
        _log.warning("kcache.triton: the lookup of %s failed (%r); compiling", group, value)
    state.count("compiles")
    state.count("unclaimed")
    return None


def _store_group(
    state: _State, key: str, group: str, files: Mapping[str, bytes], claim: _Claim | None
) -> None:
    """Stores a compile's files as the entry of ``group``: through its claim, or, with none
    (or one given up), written without the lock for the next process."""
    payload = pack(key, group, files)
    if claim is not None and claim.finish(payload):
        claim.thread_done.wait()
        return
    assert state.tiered is not None and state.disk is not None
    try:
        state.disk.put(
            state.tiered.disk_key(_entry(key, group)), payload, backend=BACKEND,
            name=_descriptor_name(group),
        )
    except KcacheError as exc:
        _log.warning("kcache.triton: %s was not stored: %s", group, exc)


def _put_file(state: _State, key: str, name: str, blob: bytes) -> None:
    """Stores one file that belongs to no group, as an entry of its own."""
    assert state.tiered is not None and state.disk is not None
    try:
        state.disk.put(
            state.tiered.disk_key(_entry(key, name)), pack(key, name, {name: blob}),
            backend=BACKEND, name=name,
        )
        state.count("files_put")
    except KcacheError as exc:
        _log.warning("kcache.triton: %s was not stored: %s", name, exc)


def _get_file(state: _State, key: str, name: str) -> bytes | None:
    """One file stored by ``_put_file``, or None."""
    assert state.tiered is not None and state.disk is not None
    disk_key = state.tiered.disk_key(_entry(key, name))
    try:
        payload = state.disk.get(disk_key)
    except KcacheError:
        return None  # refused and removed by kcache
    if payload is None:
        return None
    try:
        files = unpack(payload, key, name)
    except ValueError as exc:
        _log.warning("kcache.triton: %s: %s; ignored", name, exc)
        state.disk.remove(disk_key)
        return None
    state.count("files_loaded")
    return files[name]


class _Claimant:
    """What both front-ends do with a group's lookup: the claim this object's compile holds,
    handed the group when it is stored; given up when the object is dropped first, or when
    Triton's ``compile()`` is over without storing it (it raised) while something keeps the
    object."""

    key: str
    _state: _State
    _claim: _Claim | None = None

    def _look_up(self, group: str) -> dict[str, bytes] | None:
        """The group's files; None when this process is to compile it (claimed if it can be)."""
        found = _find_group(self._state, self.key, group)
        if isinstance(found, _Claim):
            self._claim = found
            weakref.finalize(self, _give_up, found, self._state)
            return None
        return found

    def _store(self, group: str, files: Mapping[str, bytes]) -> None:
        claim, self._claim = self._claim, None
        _store_group(self._state, self.key, group, files, claim)

    def _give_claim_up(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            _give_up(claim, self._state)


class CacheManager(_Claimant, _Base):
    """Triton's ``CacheManager`` on kcache: ``TRITON_CACHE_MANAGER=kcache.triton:CacheManager``.

    Triton makes one per kernel key. Dumping and overriding (``TRITON_KERNEL_DUMP``,
    ``TRITON_KERNEL_OVERRIDE``), and every call while kcache's disk tier is off, go to Triton's
    own ``FileCacheManager``.
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override, dump)
        self.key = _safe_name(key)
        self._state = _state()
        self._delegate: Any = None
        if override or dump or self._state.tiered is None:
            from triton.runtime.cache import FileCacheManager

            self._delegate = FileCacheManager(key, override=override, dump=dump)
        # Files put since get_group: they are the group, stored by put_group.
        self._group: str | None = None
        self._files: dict[str, bytes] = {}
        self._paths: dict[str, str] = {}
        self._scratch: str | None = None

    # The group: one entry holding every file of one compile.

    def get_group(self, filename: str) -> dict[str, str] | None:
        if self._delegate is not None:
            return self._delegate.get_group(filename)  # type: ignore[no-any-return]
        self._group = _safe_name(filename)
        found = self._look_up(self._group)
        return None if found is None else self._state.materialize(self.key, found)

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        if self._delegate is not None:
            return self._delegate.put_group(filename, group)  # type: ignore[no-any-return]
        files: dict[str, bytes] = {}
        for name, path in group.items():
            if name in self._files:
                files[name] = self._files[name]
            else:  # a path Triton made itself (not a store's): read it
                with open(path, "rb") as f:
                    files[name] = f.read()
        self._store(_safe_name(filename), files)
        grp = json.dumps({"child_paths": {n: p for n, p in group.items()}})
        return self._put_scratch(f"__grp__{filename}", grp.encode())

    # Single files: Triton's launcher modules, autotuning results, and the files of a group
    # while its compile runs.

    def put(self, data: bytes | str, filename: str, binary: bool = True) -> str:
        if self._delegate is not None:
            return self._delegate.put(data, filename, binary=binary)  # type: ignore[no-any-return]
        blob = data if isinstance(data, bytes) else str(data).encode()
        name = _safe_name(filename)
        path = self._put_scratch(name, blob)
        if self._group is not None:
            self._files[name] = blob
        else:
            _put_file(self._state, self.key, name, blob)
        return path

    def get_file(self, filename: str) -> str | None:
        if self._delegate is not None:
            return self._delegate.get_file(filename)  # type: ignore[no-any-return]
        name = _safe_name(filename)
        if name in self._paths:
            return self._paths[name]
        data = _get_file(self._state, self.key, name)
        if data is None:
            return None
        return self._state.materialize(self.key, {name: data})[name]

    def _put_scratch(self, name: str, blob: bytes) -> str:
        if self._scratch is None:
            self._scratch = self._state.scratch(self.key)
        path = os.path.join(self._scratch, name)
        _write(path, blob)
        self._paths[name] = path
        return path


# Triton's RemoteCacheManager names a group's list of files this way.
_GROUP_PREFIX = "__grp__"


class RemoteBackend(_Claimant, _RemoteBase):
    """Triton's ``RemoteCacheBackend`` on kcache, for Triton's own ``RemoteCacheManager``::

        TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
        TRITON_REMOTE_CACHE_BACKEND=kcache.triton:RemoteBackend

    Triton makes one per kernel key and asks it file by file; this backend makes the group one
    entry all the same, the entry ``CacheManager`` reads and writes (the two share a cache).
    Asked for a group's list (``__grp__NAME``), it looks the group up whole: a hit answers the
    list and then each of its files from that one verified entry; a miss claims the entry, and
    the files Triton puts after its compile are held until the list comes, then stored as one
    entry through the claim. Other files are entries of their own. While kcache's disk tier is
    off it finds and stores nothing: Triton compiles every kernel.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = _safe_name(key)
        self._state = _state()
        # The group asked for here: the files found of it, or those put since its miss.
        self._group: str | None = None
        self._found: dict[str, bytes] = {}
        self._puts: dict[str, bytes] = {}

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        if self._state.tiered is None:
            return {}
        result: dict[str, bytes] = {}
        for filename in filenames:
            name = _safe_name(filename)
            if name in self._found:
                result[name] = self._found[name]
            elif name.startswith(_GROUP_PREFIX):
                listed = self._find(_safe_name(name[len(_GROUP_PREFIX) :]))
                if listed is not None:
                    result[name] = listed
            else:
                data = _get_file(self._state, self.key, name)
                if data is not None:
                    result[name] = data
        return result

    def put(self, filename: str, data: bytes) -> None:
        if self._state.tiered is None:
            return
        name = _safe_name(filename)
        blob = data if isinstance(data, bytes) else str(data).encode()
        if self._group is None:
            _put_file(self._state, self.key, name, blob)
        elif name == _GROUP_PREFIX + self._group:
            self._store_listed(blob)
        else:
            self._puts[name] = blob

    def _find(self, group: str) -> bytes | None:
        """The list of ``group``'s files, its files kept for the calls that ask for them; None
        on a miss (claimed when this process is to compile)."""
        self._group, self._puts = group, {}
        self._found = self._look_up(group) or {}
        if not self._found:
            return None
        return json.dumps({"child_paths": sorted(self._found)}).encode()

    def _store_listed(self, listing: bytes) -> None:
        """The group's list came: its files, put before it, are stored as one entry."""
        assert self._group is not None
        group, self._group = self._group, None
        try:
            names = json.loads(listing)["child_paths"]
            files = {_safe_name(n): self._puts[n] for n in names}
        except (ValueError, KeyError, TypeError) as exc:
            _log.warning("kcache.triton: %s: a group list without its files (%r)", group, exc)
            self._give_claim_up()
            return
        self._store(group, files)
        self._found, self._puts = files, {}


def _give_up(claim: _Claim, state: _State) -> None:
    """Gives ``claim`` up (its compile failed, or stored no group), counted once."""
    if claim.abandon():
        state.count("abandoned")


__all__ = [
    "BACKEND", "CacheManager", "RemoteBackend", "TritonStats", "disk", "pack", "stats", "unpack",
]
