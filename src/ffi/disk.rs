//! Key derivation, the disk tier and the tiered lookup through the C ABI.
//!
//! Keys cross the boundary as `KC_KEY_LEN` (32) raw bytes. Payloads read from disk come back
//! in a `kc_buffer` that borrows kcache's verified copy until `kc_buffer_free`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;
use std::time::Duration;

use super::args::{
    dir_arg, free_boxed, lease_into_raw, live, operator_key_arg, read_grown, read_sized,
    write_boxed, write_sized,
};
use super::cache::{RawValue, device_of, kc_build_fn, kc_cache, kc_lease, make_value, raw_cache};
use super::status::{byte_slice, guard, guard_value, kc_status, non_null};
use crate::disk::{DiskCache, DiskConfig, DiskStats, Durability, Entry};
use crate::key::{Field, KEY_LEN, Key, KeyBuilder};
use crate::tiered::{Counters, Tiers};
use crate::{BuildError, Error, Result};

/// Length of a cache key in bytes.
pub const KC_KEY_LEN: usize = 32;
/// Length of an operator key fingerprint in bytes.
pub const KC_FINGERPRINT_LEN: usize = 8;
/// `gc` age after which a temporary file is a crashed writer's leftover: 15 minutes.
pub const KC_DISK_DEFAULT_TEMP_MAX_AGE_S: u64 = 900;

/// Key field: backend name ("opencl", "vulkan", "cuda", or your own).
pub const KC_KEY_BACKEND: u32 = 0;
/// Key field: device name.
pub const KC_KEY_DEVICE_NAME: u32 = 1;
/// Key field: device vendor.
pub const KC_KEY_DEVICE_VENDOR: u32 = 2;
/// Key field: driver version.
pub const KC_KEY_DRIVER_VERSION: u32 = 3;
/// Key field: compiler version.
pub const KC_KEY_COMPILER_VERSION: u32 = 4;
/// Key field: kernel or entry-point name.
pub const KC_KEY_ENTRY: u32 = 5;
/// Key field: source text, SPIR-V or PTX bytes.
pub const KC_KEY_SOURCE: u32 = 6;

// The constants are literals so cbindgen can emit them; these keep them equal to the Rust
// definitions.
const _: () = {
    assert!(KC_KEY_LEN == KEY_LEN);
    assert!(KC_FINGERPRINT_LEN == size_of::<crate::disk::Fingerprint>());
    assert!(KC_DISK_DEFAULT_TEMP_MAX_AGE_S == crate::disk::DEFAULT_TEMP_MAX_AGE.as_secs());
    assert!(KC_KEY_BACKEND == Field::Backend as u32);
    assert!(KC_KEY_DEVICE_NAME == Field::DeviceName as u32);
    assert!(KC_KEY_DEVICE_VENDOR == Field::DeviceVendor as u32);
    assert!(KC_KEY_DRIVER_VERSION == Field::DriverVersion as u32);
    assert!(KC_KEY_COMPILER_VERSION == Field::CompilerVersion as u32);
    assert!(KC_KEY_ENTRY == Field::Entry as u32);
    assert!(KC_KEY_SOURCE == Field::Source as u32);
};

/// Collects the inputs of a key. Not thread-safe: use one builder per thread.
pub struct kc_key_builder {
    inner: KeyBuilder,
}

/// An open disk tier. Thread-safe: every function taking a `kc_disk *` may be called from
/// any number of threads at once, except `kc_disk_close`, which must be the last call.
pub struct kc_disk {
    inner: DiskCache,
}

/// How to open a disk tier. Start from `kc_disk_options_default()`. Unset fields (NULL / 0)
/// come from the environment unless `ignore_env` is set, then from the defaults. In a
/// secure-execution process (setuid, setgid, file capabilities) the environment is not read
/// (`KCACHE_DISABLE=1` excepted): the tier then needs `dir`, and is keyed only by `key`.
/// The struct follows the `struct_size` rule of every growing struct (see
/// `docs/c-api-conventions.md`); `require_key` was appended to the first layout, which ended
/// at `ignore_env`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_disk_options {
    /// `sizeof(kc_disk_options)` as the caller compiled it.
    pub struct_size: usize,
    /// Cache directory (NUL-terminated), an absolute path: a relative or empty one is
    /// `KC_ERR_INVALID_ARGUMENT`. NULL: `KCACHE_DIR`, `$XDG_CACHE_HOME/kcache`,
    /// `$HOME/.cache/kcache`. Every directory kcache creates is mode 0700; the directory is
    /// refused unless owned by the effective user and not writable by group or others.
    pub dir: *const c_char,
    /// Size cap in bytes; 0: `KCACHE_MAX_SIZE`, else 1 GiB.
    pub max_size: u64,
    /// Operator key authenticating entries with HMAC-SHA256 (16 to 4096 bytes), copied and
    /// the copy wiped once it has keyed the HMAC; NULL with `key_len` 0: the file named by
    /// `KCACHE_KEY_FILE`, else unkeyed BLAKE3 checksums. NULL with a length is
    /// `KC_ERR_INVALID_ARGUMENT`.
    pub key: *const u8,
    /// Length of `key`.
    pub key_len: usize,
    /// Skip the fsyncs: writes stay atomic but a power loss may lose recent entries.
    pub relaxed_durability: bool,
    /// Ignore the environment entirely (`KCACHE_*`, `XDG_CACHE_HOME`, `HOME`; `KCACHE_DISABLE`
    /// included): `dir` must then be set (NULL is `KC_ERR_INVALID_ARGUMENT`).
    pub ignore_env: bool,
    /// Refuse to open (`KC_ERR_UNTRUSTED`) without an operator key, from `key` or
    /// `KCACHE_KEY_FILE`, instead of writing unkeyed entries. `KCACHE_REQUIRE_KEY=1` sets it
    /// too.
    pub require_key: bool,
}

/// The first layout of `kc_disk_options` ended with `ignore_env`: callers compiled against it
/// stay valid.
const DISK_OPTIONS_MIN_SIZE: usize = offset_of!(kc_disk_options, ignore_env) + 1;

/// Counters of one `kc_disk` since it was opened (the name `kc_disk_stats` belongs to the
/// function). Set `struct_size` to `sizeof(kc_disk_statistics)` before calling
/// `kc_disk_stats`; it fills the fields that fit and sets `struct_size` to the bytes written.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kc_disk_statistics {
    /// In: size of the caller's struct. Out: bytes written.
    pub struct_size: usize,
    /// Reads that returned a verified entry.
    pub hits: u64,
    /// Reads that returned none: absent, rejected or failed.
    pub misses: u64,
    /// Entries written.
    pub puts: u64,
    /// Bytes of entries read.
    pub bytes_read: u64,
    /// Bytes of entries written.
    pub bytes_written: u64,
    /// Entries that failed verification (bad content, too large, not a regular file) and
    /// were removed, and directories a write found at its entry's name and removed.
    pub integrity_rejects: u64,
    /// Failed reads and writes.
    pub io_errors: u64,
    /// Entries removed by the size cap.
    pub evictions: u64,
    /// Entries removed by `kc_disk_remove`.
    pub removes: u64,
    /// Entries a tiered lookup's `load` refused, removed.
    pub load_failures: u64,
    /// Entry files in the directory, as far as this process knows: complete once
    /// `scan_complete` is set.
    pub entries: u64,
    /// Their total size in bytes.
    pub bytes: u64,
    /// Whether the scan of the directory that `kc_disk_open` starts has finished
    /// (`kc_disk_wait_scan` waits for it).
    pub scan_complete: bool,
}

impl From<DiskStats> for kc_disk_statistics {
    /// The C form of a disk tier's counters, `struct_size` set to the whole struct.
    fn from(s: DiskStats) -> Self {
        kc_disk_statistics {
            struct_size: size_of::<kc_disk_statistics>(),
            hits: s.hits,
            misses: s.misses,
            puts: s.puts,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            integrity_rejects: s.integrity_rejects,
            io_errors: s.io_errors,
            evictions: s.evictions,
            removes: s.removes,
            load_failures: s.load_failures,
            entries: s.entries,
            bytes: s.bytes,
            scan_complete: s.scan_complete,
        }
    }
}

/// What one `kc_disk_gc` removed, by reason. Same `struct_size` rule as
/// `kc_disk_statistics`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct kc_disk_gc_report {
    /// In: size of the caller's struct. Out: bytes written.
    pub struct_size: usize,
    /// Temporary files of crashed writers.
    pub temp_files: u64,
    /// Entries written under another key schema.
    pub stale_schema: u64,
    /// Entries of operator keys neither active nor retained.
    pub stale_fingerprint: u64,
    /// Entries that failed verification.
    pub corrupt: u64,
    /// Entries left in place.
    pub kept: u64,
    /// Bytes removed.
    pub bytes_freed: u64,
    /// Files or directories that should have gone but could not be removed (a non-empty
    /// directory at an entry name, …): left in place.
    pub undeletable: u64,
}

/// A verified payload read from disk. `data` stays valid until `kc_buffer_free`.
#[repr(C)]
#[derive(Debug)]
pub struct kc_buffer {
    /// The payload bytes.
    pub data: *const u8,
    /// Their length.
    pub len: usize,
    /// How long the value took to build, as recorded by its writer.
    pub build_time_ns: u64,
    /// Owned by kcache.
    pub owner: *mut c_void,
}

/// Turns a serialized payload back into a live value. Same contract as `kc_build_fn` (store
/// the value and its weight, return 0; non-zero: the entry is removed and the value built).
pub type kc_load_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        bytes: *const u8,
        len: usize,
        out_value: *mut *mut c_void,
        out_weight: *mut u64,
    ) -> c_int,
>;

/// Serializes a live value for the disk, in two calls like `vkGetPipelineCacheData`: with
/// `buf` NULL store the size in `*len`; then with a buffer of `*len` bytes fill it and store
/// the bytes written in `*len`. Return 0 on success; non-zero skips the write-back.
pub type kc_serialize_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        value: *mut c_void,
        buf: *mut u8,
        len: *mut usize,
    ) -> c_int,
>;

/// The callbacks of a tiered lookup; all receive `ctx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_tiered_callbacks {
    /// `sizeof(kc_tiered_callbacks)` as the caller compiled it.
    pub struct_size: usize,
    /// Builds from scratch (required).
    pub build: kc_build_fn,
    /// Loads a disk payload; NULL: the disk is not read.
    pub load: kc_load_fn,
    /// Serializes a built value; NULL: nothing is written back.
    pub serialize: kc_serialize_fn,
    /// Passed to every callback.
    pub ctx: *mut c_void,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Reads a 32-byte key.
///
/// # Safety
/// `key` must be NULL or point to `KC_KEY_LEN` readable bytes.
unsafe fn key_arg(key: *const u8) -> Result<Key> {
    non_null(key, "key")?;
    // SAFETY: non-NULL and the caller promises `KC_KEY_LEN` readable bytes.
    Ok(Key::from_bytes(unsafe {
        ptr::read_unaligned(key.cast::<[u8; KEY_LEN]>())
    }))
}

/// Counters and reports are written truncated to any caller's size that holds `struct_size`.
const OUT_MIN_SIZE: usize = size_of::<usize>();

// ---------------------------------------------------------------------------------------
// Keys

/// Creates an empty key builder. `*out_builder` is written on success only.
///
/// # Safety
/// `out_builder` must be writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_new(out_builder: *mut *mut kc_key_builder) -> kc_status {
    guard(|| {
        non_null(out_builder, "out_builder")?;
        let builder = kc_key_builder {
            inner: KeyBuilder::new(),
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { write_boxed(out_builder, builder) };
        Ok(())
    })
}

/// Sets one field (`KC_KEY_BACKEND` … `KC_KEY_SOURCE`), replacing an earlier value. An
/// unset field differs from an empty one.
///
/// # Safety
/// `builder` must be a live builder; `bytes` must point to `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_set(
    builder: *mut kc_key_builder,
    field: u32,
    bytes: *const u8,
    len: usize,
) -> kc_status {
    guard(|| {
        non_null(builder, "builder")?;
        let field = Field::from_index(field)
            .ok_or_else(|| invalid(format!("unknown key field {field}")))?;
        // SAFETY: the caller promises `len` readable bytes.
        let bytes = unsafe { byte_slice(bytes, len, "bytes") }?;
        // SAFETY: a live builder, used by one thread at a time by contract.
        unsafe { (*builder).inner.set(field, bytes) };
        Ok(())
    })
}

/// Adds a build option (a flag has an empty value). Options are sorted by name, so their
/// order does not matter; the same name twice makes `kc_key_builder_finish` fail. Sorting is
/// safe only for options whose effect does not depend on their position: each named once, none
/// overriding or extending another. Options that interact by position (`-DX=1` with `-UX`,
/// `-O2` with `-O0`, `-I` search paths, `-include`) go through
/// `kc_key_builder_ordered_option`; when in doubt, pass the whole command line that way.
///
/// # Safety
/// `builder` must be a live builder; `name`/`value` must point to their lengths in bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_option(
    builder: *mut kc_key_builder,
    name: *const u8,
    name_len: usize,
    value: *const u8,
    value_len: usize,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    guard(|| unsafe {
        add_named(builder, name, name_len, value, value_len, |b, n, v| {
            b.option(n, v);
        })
    })
}

/// Adds a free-form input (specialization constants, a layout description, …): same rules as
/// options, in a separate namespace.
///
/// # Safety
/// As for `kc_key_builder_option`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_extra(
    builder: *mut kc_key_builder,
    name: *const u8,
    name_len: usize,
    value: *const u8,
    value_len: usize,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    guard(|| unsafe {
        add_named(builder, name, name_len, value, value_len, |b, n, v| {
            b.extra(n, v);
        })
    })
}

/// Appends one command-line argument to the ordered options, hashed in the order given:
/// `-DX=1 -UX` and `-UX -DX=1` give different keys. Repeats are allowed. A key made without
/// ordered options is the same as before they existed.
///
/// # Safety
/// `builder` must be a live builder; `argument` must point to `argument_len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_ordered_option(
    builder: *mut kc_key_builder,
    argument: *const u8,
    argument_len: usize,
) -> kc_status {
    guard(|| {
        non_null(builder, "builder")?;
        // SAFETY: the caller promises `argument_len` readable bytes.
        let argument = unsafe { byte_slice(argument, argument_len, "argument") }?;
        // SAFETY: a live builder, used by one thread at a time by contract.
        unsafe { (*builder).inner.ordered_option(argument) };
        Ok(())
    })
}

/// Adds a file the compiler reads besides the source (a header the source `#include`s, a
/// precompiled module): `name` as the compiler resolves it, `contents` its bytes. kcache never
/// reads files itself, so a header not added here can change without changing the key. Sorted
/// by name; the same name twice makes `kc_key_builder_finish` fail.
///
/// # Safety
/// `builder` must be a live builder; `name`/`contents` must point to their lengths in bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_dependency(
    builder: *mut kc_key_builder,
    name: *const u8,
    name_len: usize,
    contents: *const u8,
    contents_len: usize,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    guard(|| unsafe {
        add_named(
            builder,
            name,
            name_len,
            contents,
            contents_len,
            |b, n, v| {
                b.dependency(n, v);
            },
        )
    })
}

/// Adds a named input (an option, an extra or a dependency) to a builder.
///
/// # Safety
/// `builder` must be NULL or a live builder; `name`/`value` must point to their lengths in
/// bytes.
unsafe fn add_named(
    builder: *mut kc_key_builder,
    name: *const u8,
    name_len: usize,
    value: *const u8,
    value_len: usize,
    add: impl FnOnce(&mut KeyBuilder, &[u8], &[u8]),
) -> Result<()> {
    non_null(builder, "builder")?;
    // SAFETY: the caller promises readable bytes of the given lengths.
    let (name, value) = unsafe {
        (
            byte_slice(name, name_len, "name")?,
            byte_slice(value, value_len, "value")?,
        )
    };
    // SAFETY: a live builder, used by one thread at a time by contract.
    add(unsafe { &mut (*builder).inner }, name, value);
    Ok(())
}

/// Derives the key into `out_key` (`KC_KEY_LEN` bytes). The builder stays usable.
/// `KC_ERR_INVALID_ARGUMENT` for a duplicate option, extra or dependency name.
///
/// # Safety
/// `builder` must be a live builder; `out_key` must have `KC_KEY_LEN` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_finish(
    builder: *const kc_key_builder,
    out_key: *mut u8,
) -> kc_status {
    guard(|| {
        non_null(builder, "builder")?;
        non_null(out_key, "out_key")?;
        // SAFETY: a live builder; only read.
        let key = unsafe { (*builder).inner.finish() }?;
        // SAFETY: `out_key` has `KC_KEY_LEN` writable bytes by contract.
        unsafe { ptr::copy_nonoverlapping(key.as_bytes().as_ptr(), out_key, KEY_LEN) };
        Ok(())
    })
}

/// Frees a builder. NULL is a no-op.
///
/// # Safety
/// `builder` must be NULL or a builder not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_free(builder: *mut kc_key_builder) {
    // SAFETY: the caller hands back the builder from `kc_key_builder_new`, or NULL.
    guard_value((), || unsafe { free_boxed(builder) });
}

// ---------------------------------------------------------------------------------------
// Disk tier

/// Default options: everything from the environment, fsyncs on.
#[unsafe(no_mangle)]
pub extern "C" fn kc_disk_options_default() -> kc_disk_options {
    kc_disk_options {
        struct_size: size_of::<kc_disk_options>(),
        dir: ptr::null(),
        max_size: 0,
        key: ptr::null(),
        key_len: 0,
        relaxed_durability: false,
        ignore_env: false,
        require_key: false,
    }
}

/// # Safety
/// `opts` must be non-NULL and point to `opts->struct_size` readable bytes; `dir` NULL or a C
/// string; `key` NULL or `key_len` readable bytes.
unsafe fn read_disk_options(opts: *const kc_disk_options) -> Result<DiskConfig> {
    // SAFETY: readable for its size by the caller's contract; the other fields are integers
    // and raw pointers, valid for any bits.
    let opts = unsafe {
        read_grown(
            opts,
            "opts",
            "kc_disk_options",
            DISK_OPTIONS_MIN_SIZE,
            kc_disk_options_default(),
            &[
                offset_of!(kc_disk_options, relaxed_durability),
                offset_of!(kc_disk_options, ignore_env),
                offset_of!(kc_disk_options, require_key),
            ],
        )
    }?;
    if opts.ignore_env && opts.dir.is_null() {
        return Err(invalid(
            "opts->ignore_env is set and opts->dir is NULL: no cache directory",
        ));
    }
    Ok(DiskConfig {
        // SAFETY: NULL or a C string by contract.
        dir: unsafe { dir_arg(opts.dir, "opts->dir") }?,
        max_size: (opts.max_size != 0).then_some(opts.max_size),
        // SAFETY: NULL or `key_len` readable bytes by contract.
        key: unsafe { operator_key_arg(opts.key, opts.key_len, "opts->key") }?,
        require_key: opts.require_key,
        durability: if opts.relaxed_durability {
            Durability::Relaxed
        } else {
            Durability::Sync
        },
        read_env: !opts.ignore_env,
        ..DiskConfig::from_env()
    })
}

/// Opens a disk tier; `opts` NULL takes everything from the environment. Refusals:
/// `KC_ERR_UNAVAILABLE` (`KCACHE_DISABLE=1`, no directory, a secure-execution process without
/// `opts->dir`, an invalid `KCACHE_MAX_SIZE`), `KC_ERR_UNTRUSTED` (directory not private to
/// this user or a symlink; no operator key while one is required; an unusable
/// `KCACHE_KEY_FILE`), `KC_ERR_INVALID_ARGUMENT` (see `kc_disk_options`), `KC_ERR_IO`. Each
/// refusal that comes from the environment or the directory is also written once per process
/// on stderr. A caller should then go on with memory only.
///
/// # Safety
/// `opts` must be NULL or point to `opts->struct_size` readable bytes; `out_disk` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_open(
    opts: *const kc_disk_options,
    out_disk: *mut *mut kc_disk,
) -> kc_status {
    guard(|| {
        non_null(out_disk, "out_disk")?;
        let config = if opts.is_null() {
            DiskConfig::from_env()
        } else {
            // SAFETY: non-NULL; its size is the caller's promise.
            unsafe { read_disk_options(opts) }?
        };
        let inner = DiskCache::open(config)?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { write_boxed(out_disk, kc_disk { inner }) };
        Ok(())
    })
}

/// Closes a disk tier. NULL is a no-op. Buffers already returned stay valid.
///
/// # Safety
/// `disk` must be NULL or from `kc_disk_open`, not yet closed, with no call on it running.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_close(disk: *mut kc_disk) {
    // SAFETY: the caller hands back the disk from `kc_disk_open`, or NULL.
    guard_value((), || unsafe { free_boxed(disk) });
}

/// # Safety
/// `disk` must be non-NULL and live.
unsafe fn disk_ref<'a>(disk: *const kc_disk) -> Result<&'a DiskCache> {
    // SAFETY: NULL or a live disk by contract; all its methods take `&self`.
    Ok(&unsafe { live(disk, "disk") }?.inner)
}

/// Writes the entry for `key` (atomically: readers see the old entry or the new one).
/// `KC_ERR_IO` when the write fails (disk full, …): nothing partial is left behind.
/// `KC_ERR_INVALID_ARGUMENT` when the entry (payload + 104 bytes) is larger than the smaller
/// of the size cap and 1 GiB. Right after `kc_disk_open` the write waits for the directory
/// scan (see `kc_disk_wait_scan`), so that it can make room within the cap first.
///
/// # Safety
/// `disk` live; `key` `KC_KEY_LEN` readable bytes; `data` `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_put(
    disk: *mut kc_disk,
    key: *const u8,
    data: *const u8,
    len: usize,
    build_time_ns: u64,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key, data) = unsafe {
            (
                disk_ref(disk)?,
                key_arg(key)?,
                byte_slice(data, len, "data")?,
            )
        };
        disk.put(&key, data, Duration::from_nanos(build_time_ns))
    })
}

/// Reads and verifies the entry for `key` into `*out` (written on success only; free it
/// with `kc_buffer_free`). Misses: `KC_ERR_NOT_FOUND` (none), `KC_ERR_INTEGRITY` (an entry
/// failed verification, was larger than the per-entry limit or was not a regular file, and
/// was removed; a non-empty directory is left in place), `KC_ERR_IO`.
///
/// # Safety
/// `disk` live; `key` `KC_KEY_LEN` readable bytes; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_get(
    disk: *mut kc_disk,
    key: *const u8,
    out: *mut kc_buffer,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key) = unsafe { (disk_ref(disk)?, key_arg(key)?) };
        non_null(out, "out")?;
        let entry = Box::new(disk.get(&key)?.ok_or(Error::NotFound)?);
        let payload = entry.payload();
        let (data, len) = (payload.as_ptr(), payload.len());
        let build_time_ns = u64::try_from(entry.build_time().as_nanos()).unwrap_or(u64::MAX);
        let buffer = kc_buffer {
            data,
            len,
            build_time_ns,
            owner: Box::into_raw(entry).cast(),
        };
        // SAFETY: non-NULL and writable by contract.
        unsafe { out.write(buffer) };
        Ok(())
    })
}

/// Releases a buffer from `kc_disk_get` and zeroes it. NULL, or a zeroed buffer, is a no-op.
///
/// # Safety
/// `buffer` must be NULL or a buffer filled by `kc_disk_get` and not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_buffer_free(buffer: *mut kc_buffer) {
    guard_value((), || {
        if buffer.is_null() {
            return;
        }
        // SAFETY: a buffer from `kc_disk_get`: `owner` is NULL or its boxed entry.
        unsafe {
            let owner = (*buffer).owner;
            if !owner.is_null() {
                drop(Box::from_raw(owner.cast::<Entry>()));
            }
            buffer.write(kc_buffer {
                data: ptr::null(),
                len: 0,
                build_time_ns: 0,
                owner: ptr::null_mut(),
            });
        }
    });
}

/// Removes the entry for `key`; `KC_ERR_NOT_FOUND` when there is none.
///
/// # Safety
/// `disk` live; `key` `KC_KEY_LEN` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_remove(disk: *mut kc_disk, key: *const u8) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key) = unsafe { (disk_ref(disk)?, key_arg(key)?) };
        if disk.remove(&key)? {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
    })
}

/// Sweeps the directory: temporary files older than `temp_max_age_s` seconds, entries of
/// other key schemas, corrupt entries, and entries of operator keys that are neither this
/// disk's nor among the `retain_count` fingerprints (`KC_FINGERPRINT_LEN` bytes each,
/// concatenated) at `retain`. `out_report` may be NULL.
///
/// # Safety
/// `disk` live; `retain` `retain_count * KC_FINGERPRINT_LEN` readable bytes; `out_report`
/// NULL or a writable struct of at least its `struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_gc(
    disk: *mut kc_disk,
    retain: *const u8,
    retain_count: usize,
    temp_max_age_s: u64,
    out_report: *mut kc_disk_gc_report,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let disk = unsafe { disk_ref(disk) }?;
        let bytes = retain_count
            .checked_mul(KC_FINGERPRINT_LEN)
            .ok_or_else(|| invalid("retain_count is too large"))?;
        // SAFETY: the caller promises `bytes` readable bytes.
        let retain = unsafe { byte_slice(retain, bytes, "retain") }?;
        let retain: Vec<[u8; 8]> = retain
            .chunks_exact(KC_FINGERPRINT_LEN)
            .map(|c| c.try_into().expect("chunks are fingerprint-sized"))
            .collect();
        let r = disk.gc(&retain, Duration::from_secs(temp_max_age_s))?;
        if !out_report.is_null() {
            let report = kc_disk_gc_report {
                struct_size: size_of::<kc_disk_gc_report>(),
                temp_files: r.temp_files,
                stale_schema: r.stale_schema,
                stale_fingerprint: r.stale_fingerprint,
                corrupt: r.corrupt,
                kept: r.kept,
                bytes_freed: r.bytes_freed,
                undeletable: r.undeletable,
            };
            // SAFETY: non-NULL; its size is the caller's promise.
            unsafe {
                write_sized(
                    out_report,
                    report,
                    "out_report",
                    "kc_disk_gc_report",
                    OUT_MIN_SIZE,
                )
            }?;
        }
        Ok(())
    })
}

/// Fills `*out` with this disk's counters (see `kc_disk_stats`).
///
/// # Safety
/// `disk` live; `out` a writable struct of at least its `struct_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_stats(
    disk: *const kc_disk,
    out: *mut kc_disk_statistics,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let disk = unsafe { disk_ref(disk) }?;
        non_null(out, "out")?;
        let stats = kc_disk_statistics::from(disk.stats());
        // SAFETY: non-NULL; its size is the caller's promise.
        unsafe { write_sized(out, stats, "out", "kc_disk_statistics", OUT_MIN_SIZE) }
    })
}

/// The fingerprint of the operator key this disk writes under (`KC_FINGERPRINT_LEN` bytes,
/// all zero without a key): what to pass to another process's `kc_disk_gc` to keep its
/// entries during a key rotation.
///
/// # Safety
/// `disk` live; `out` `KC_FINGERPRINT_LEN` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_fingerprint(disk: *const kc_disk, out: *mut u8) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let disk = unsafe { disk_ref(disk) }?;
        non_null(out, "out")?;
        let fp = disk.fingerprint();
        // SAFETY: `out` has `KC_FINGERPRINT_LEN` writable bytes by contract.
        unsafe { ptr::copy_nonoverlapping(fp.as_ptr(), out, KC_FINGERPRINT_LEN) };
        Ok(())
    })
}

/// The distinct operator key fingerprints of the entries in the directory, in ascending
/// byte order: one per key generation that has entries there (all zero for unkeyed entries).
/// `*out_count` receives how many there are; the first `min(capacity, *out_count)` are
/// written to `out` (`KC_FINGERPRINT_LEN` bytes each, concatenated). Call with `out` NULL and
/// `capacity` 0 to learn the count, then again with room for it; entries written meanwhile
/// can make the second count larger, so compare it with `capacity`.
///
/// # Safety
/// `disk` live; `out` `capacity * KC_FINGERPRINT_LEN` writable bytes (NULL when `capacity`
/// is 0); `out_count` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_fingerprints(
    disk: *const kc_disk,
    out: *mut u8,
    capacity: usize,
    out_count: *mut usize,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let disk = unsafe { disk_ref(disk) }?;
        non_null(out_count, "out_count")?;
        if capacity > 0 {
            non_null(out, "out")?;
        }
        let found = disk.fingerprints()?;
        let n = found.len().min(capacity);
        if n > 0 {
            let bytes = found.as_flattened();
            // SAFETY: `out` is non-NULL with `capacity * KC_FINGERPRINT_LEN` writable bytes by
            // contract, and `n <= capacity`.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), out, n * KC_FINGERPRINT_LEN) };
        }
        // SAFETY: non-NULL and writable by contract.
        unsafe { out_count.write(found.len()) };
        Ok(())
    })
}

/// Waits for the scan of the directory that `kc_disk_open` starts in the background
/// (milliseconds even for a full cache). Until it has finished, `kc_disk_stats` counts only
/// this disk's own writes, and writes wait for it; reads do not.
///
/// # Safety
/// `disk` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_wait_scan(disk: *const kc_disk) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        unsafe { disk_ref(disk) }?.wait_scan();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
// Tiered lookup

/// Serializes a just-built value with the caller's two-call `serialize`; without one, or when
/// it fails, nothing is written back.
///
/// # Safety
/// `serialize` must be NULL or callable with `ctx` and `value`.
unsafe fn serialize_value(
    serialize: kc_serialize_fn,
    ctx: *mut c_void,
    value: *mut c_void,
) -> std::result::Result<Vec<u8>, BuildError> {
    let serialize = serialize.ok_or_else(|| BuildError::new(0, "no serialize callback"))?;
    let failed = |code| BuildError::new(code, format!("the serialize callback returned {code}"));
    let mut len = 0usize;
    // SAFETY: the caller's contract; `len` is a live local.
    match unsafe { serialize(ctx, value, ptr::null_mut(), &mut len) } {
        0 => {}
        code => return Err(failed(code)),
    }
    let mut buf = vec![0u8; len];
    let mut written = len;
    // SAFETY: `buf` has `len` writable bytes, as the callback was told.
    match unsafe { serialize(ctx, value, buf.as_mut_ptr(), &mut written) } {
        0 if written <= len => {}
        0 => {
            return Err(BuildError::new(
                0,
                "the serialize callback overran its buffer",
            ));
        }
        code => return Err(failed(code)),
    }
    buf.truncate(written);
    Ok(buf)
}

/// Returns a lease on the value for `l1_key` from `cache`; on a miss, loads it from the disk
/// entry for `l2_key` (`KC_KEY_LEN` bytes) with `callbacks->load`, else builds it with
/// `callbacks->build` and writes `callbacks->serialize`'s bytes back to disk. `disk` may be
/// NULL (memory only). The disk read runs inside the memory tier's single flight: concurrent
/// callers of one key read or build once. A disk entry that `load` refuses is removed (and
/// counted in `load_failures`); a failed write-back is not an error. Statuses as for
/// `kc_cache_find_or_build`.
///
/// # Safety
/// `cache` live; `disk` NULL or live; keys readable for their lengths; `callbacks` readable
/// for its `struct_size`; `out_lease` writable; callbacks callable with `callbacks->ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_tiered_find_or_build(
    cache: *mut kc_cache,
    l1_key: *const u8,
    l1_key_len: usize,
    device_id: i64,
    disk: *mut kc_disk,
    l2_key: *const u8,
    callbacks: *const kc_tiered_callbacks,
    out_lease: *mut *mut kc_lease,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live cache by contract.
        let memory = unsafe { raw_cache(cache) }?;
        non_null(callbacks, "callbacks")?;
        non_null(out_lease, "out_lease")?;
        // SAFETY: non-NULL and readable for its `struct_size` by contract; every field is
        // valid for any bits (sizes, optional function pointers, a raw pointer).
        let cb = unsafe { read_sized(callbacks, "callbacks", "kc_tiered_callbacks") }?;
        let build = cb
            .build
            .ok_or_else(|| invalid("callbacks->build is NULL"))?;
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let l2_key = unsafe { key_arg(l2_key) }?;
        let disk = if disk.is_null() {
            None
        } else {
            // SAFETY: non-NULL and live by contract.
            Some(unsafe { disk_ref(disk) }?)
        };
        // SAFETY: the caller promises `l1_key_len` readable bytes.
        let key = unsafe { byte_slice(l1_key, l1_key_len, "key") }?;
        let device = device_of(device_id)?;
        let ctx = cb.ctx;
        let load = cb.load.map(|load| {
            move |bytes: &[u8]| {
                // SAFETY: the caller promised a callable `load` for `ctx`; the payload is
                // live for the call.
                unsafe { make_value(load, ctx, bytes.as_ptr(), bytes.len(), "load") }
            }
        });
        let tiers = Tiers {
            memory,
            disk,
            // The C API reports what the tiers did through their own counters.
            counters: &Counters::default(),
        };
        let lease = tiers.find_or_build(
            key,
            device,
            || Ok(l2_key),
            load,
            // SAFETY: the caller promised a callable `build` for `ctx`; the key is its own.
            || unsafe { make_value(build, ctx, l1_key, l1_key_len, "build") },
            // SAFETY: the caller promised a callable `serialize` (or NULL) for `ctx`.
            |value: &RawValue| unsafe { serialize_value(cb.serialize, ctx, value.0) },
        )?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { out_lease.write(lease_into_raw(lease)) };
        Ok(())
    })
}
