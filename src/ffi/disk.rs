//! `kc_disk`: the disk tier through the C ABI. Keys are `KC_KEY_LEN` bytes from a
//! `kc_key_builder`; payloads come back in a `kc_buffer`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::ptr;
use std::time::Duration;

use super::args::{
    GrownInput, Handle, c_statistics, c_str, dir_arg, free_handle, handle_ref, invalid, new_handle,
    operator_key_arg, read_input, read_sized, write_sized,
};
use super::buffer::kc_buffer;
use super::key_builder::key_arg;
use super::remote_args::remote_args;
use super::status::{byte_slice, guard, guard_value, kc_status, non_null};
use crate::disk::{Descriptor, DiskCache, DiskConfig, DiskStats, Durability, GcReport};
use crate::{Error, Result};

/// Length of an operator key fingerprint in bytes.
pub const KC_FINGERPRINT_LEN: usize = 8;
/// `gc` age after which a temporary file is a crashed writer's leftover: 15 minutes.
pub const KC_DISK_DEFAULT_TEMP_MAX_AGE_S: u64 = 900;

// The constants are literals so cbindgen can emit them; these keep them equal to the Rust
// definitions.
const _: () = {
    assert!(KC_FINGERPRINT_LEN == size_of::<crate::disk::Fingerprint>());
    assert!(KC_DISK_DEFAULT_TEMP_MAX_AGE_S == crate::disk::DEFAULT_TEMP_MAX_AGE.as_secs());
};

/// An open disk tier. Thread-safe: every function taking a `kc_disk *` may be called from
/// any number of threads at once, except `kc_disk_free`, which must be the last call.
pub struct kc_disk {
    _opaque: [u8; 0],
}

impl Handle for kc_disk {
    type Rust = DiskCache;
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
    /// How long a lookup that misses waits for another process building the same entry, in
    /// milliseconds, before it builds too; 0: `KCACHE_LOCK_TIMEOUT` (seconds), else 120 s.
    pub lock_timeout_ms: u64,
    /// The shared tier behind the disk (NUL-terminated): `redis://[user:password@]host[:port]`,
    /// `redis+unix:///path`; NULL: `KCACHE_REMOTE_URL`, else none. A URL that cannot be used
    /// leaves the remote off (one warning), not the disk. It needs an operator key unless
    /// `remote_allow_unkeyed`. See `docs/remote.md`.
    pub remote_url: *const c_char,
    /// Read the remote, never write it (`KCACHE_REMOTE_READ_ONLY=1` sets it too).
    pub remote_read_only: bool,
    /// **Unsafe**: use the remote without an operator key, so that anyone who can write the
    /// store can run code on this process's GPUs (`KCACHE_REMOTE_ALLOW_UNKEYED=1` too).
    pub remote_allow_unkeyed: bool,
    /// Budget of one remote operation in milliseconds; 0: `KCACHE_REMOTE_TIMEOUT_MS`, else 250.
    pub remote_timeout_ms: u64,
    /// Lifetime of a remote entry in seconds; 0: `KCACHE_REMOTE_TTL`, else 7 days.
    pub remote_ttl_s: u64,
    /// Namespace of the remote's keys (NUL-terminated); NULL: `KCACHE_REMOTE_PREFIX`, else
    /// `kcache:`.
    pub remote_prefix: *const c_char,
    /// Largest remote entry read or written, in bytes; 0: `KCACHE_REMOTE_MAX_ENTRY_SIZE`,
    /// else 64 MiB.
    pub remote_max_entry_size: u64,
    /// How long a miss waits for another node building the same entry, in milliseconds; 0:
    /// `KCACHE_REMOTE_LEASE_WAIT` (seconds), else 120 s.
    pub remote_lease_wait_ms: u64,
    /// The certificate authority (PEM, an absolute path, NUL-terminated) that a `rediss://`
    /// server's certificate must chain to; NULL: `KCACHE_REMOTE_CA_FILE`, else the system's
    /// roots. Since ABI 2.5.
    pub remote_ca_file: *const c_char,
    /// The client certificate (PEM, an absolute path) shown to a `rediss://` server that
    /// requires one (mutual TLS); NULL: `KCACHE_REMOTE_CERT_FILE`, else none. Set with
    /// `remote_key_file`: one without the other leaves the remote off (one warning).
    pub remote_cert_file: *const c_char,
    /// The client certificate's private key (PEM, an absolute path); NULL:
    /// `KCACHE_REMOTE_KEY_FILE`, else none.
    pub remote_key_file: *const c_char,
}

// SAFETY: every field but the bools is an integer or a raw pointer.
unsafe impl GrownInput for kc_disk_options {
    const C_NAME: &str = "kc_disk_options";
    /// The first layout ended with `ignore_env`: callers compiled against it stay valid.
    const MIN_SIZE: usize = offset_of!(kc_disk_options, ignore_env) + 1;
    const BOOLS: &[usize] = &[
        offset_of!(kc_disk_options, relaxed_durability),
        offset_of!(kc_disk_options, ignore_env),
        offset_of!(kc_disk_options, require_key),
        offset_of!(kc_disk_options, remote_read_only),
        offset_of!(kc_disk_options, remote_allow_unkeyed),
    ];
    const DEFAULT: kc_disk_options = kc_disk_options {
        struct_size: size_of::<kc_disk_options>(),
        dir: ptr::null(),
        max_size: 0,
        key: ptr::null(),
        key_len: 0,
        relaxed_durability: false,
        ignore_env: false,
        require_key: false,
        lock_timeout_ms: 0,
        remote_url: ptr::null(),
        remote_read_only: false,
        remote_allow_unkeyed: false,
        remote_timeout_ms: 0,
        remote_ttl_s: 0,
        remote_prefix: ptr::null(),
        remote_max_entry_size: 0,
        remote_lease_wait_ms: 0,
        remote_ca_file: ptr::null(),
        remote_cert_file: ptr::null(),
        remote_key_file: ptr::null(),
    };
}

/// Counters of one `kc_disk` since it was opened or its last `kc_disk_reset_stats` (the name
/// `kc_disk_stats` belongs to the function). Set `struct_size` to `sizeof(kc_disk_statistics)`
/// before calling `kc_disk_stats`; it fills the fields that fit and sets `struct_size` to the
/// bytes written.
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
    /// were removed, and directories a write found at its entry's name and moved aside.
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
    /// Whether the scan of the directory that `kc_disk_new` starts has finished
    /// (`kc_disk_wait_scan` waits for it).
    pub scan_complete: bool,
    /// Misses that waited for another process building the same entry, then read what it
    /// published or, when its build failed or it died, built.
    pub lock_waits: u64,
    /// Waits that reached the lock timeout; each of those misses built without waiting more.
    pub lock_timeouts: u64,
    /// Misses that found the lock released by a process that died building: they built.
    pub lock_takeovers: u64,
    /// Background writes queued, held back or running now (`kc_disk_flush` writes and waits
    /// for them).
    pub pending_writes: u64,
    /// Background writes that failed (the value could not be serialized or written).
    pub failed_writes: u64,
    /// Whether a remote tier is behind this disk (`remote_url`, `KCACHE_REMOTE_URL`); the
    /// `remote_*` counters stay zero without one. See `docs/remote.md`.
    pub remote: bool,
    /// Remote entries read and verified.
    pub remote_hits: u64,
    /// Remote reads that returned no usable entry (absent, rejected, failed, skipped).
    pub remote_misses: u64,
    /// Remote entries refused by verification (changed, another key, too large).
    pub remote_rejects: u64,
    /// Remote operations that failed, timeouts apart.
    pub remote_errors: u64,
    /// Remote operations that ran past `remote_timeout_ms`.
    pub remote_timeouts: u64,
    /// Remote operations skipped because the breaker was open.
    pub remote_skipped: u64,
    /// Times the breaker opened after consecutive failures.
    pub remote_breaker_trips: u64,
    /// Whether the breaker is open now.
    pub remote_breaker_open: bool,
    /// Leases taken: builds led for every node.
    pub remote_leases: u64,
    /// Misses that waited for another node holding the lease.
    pub remote_lease_waits: u64,
    /// Of those, waits that reached the deadline and built.
    pub remote_lease_timeouts: u64,
    /// Entries written to the remote.
    pub remote_puts: u64,
    /// Bytes read from the remote.
    pub remote_bytes_read: u64,
    /// Bytes written to the remote.
    pub remote_bytes_written: u64,
}

impl From<DiskStats> for kc_disk_statistics {
    fn from(s: DiskStats) -> Self {
        let r = s.remote.unwrap_or_default();
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
            lock_waits: s.lock_waits,
            lock_timeouts: s.lock_timeouts,
            lock_takeovers: s.lock_takeovers,
            pending_writes: s.pending_writes,
            failed_writes: s.failed_writes,
            remote: s.remote.is_some(),
            remote_hits: r.hits,
            remote_misses: r.misses,
            remote_rejects: r.rejects,
            remote_errors: r.errors,
            remote_timeouts: r.timeouts,
            remote_skipped: r.skipped,
            remote_breaker_trips: r.breaker_trips,
            remote_breaker_open: r.breaker_open,
            remote_leases: r.leases,
            remote_lease_waits: r.lease_waits,
            remote_lease_timeouts: r.lease_timeouts,
            remote_puts: r.puts,
            remote_bytes_read: r.bytes_read,
            remote_bytes_written: r.bytes_written,
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
    /// Files or directories that should have gone but could not be removed (a directory
    /// tree more than 16 levels deep, a permission error, …): left in place.
    pub undeletable: u64,
    /// Lock files nobody held (left by processes that died building), and anything but a
    /// regular file at a lock file's name (a directory with everything in it); held ones are
    /// kept.
    pub lock_files: u64,
    /// Entries of format 1, which do not say what they hold (reads accept them; `gc`
    /// removes them, and the next build writes them again with a descriptor).
    pub old_format: u64,
}

c_statistics!(GcReport => kc_disk_gc_report {
    temp_files, stale_schema, stale_fingerprint, corrupt, kept, bytes_freed, undeletable,
    lock_files, old_format,
});

/// Counters and reports are written truncated to any caller's size that holds `struct_size`.
const OUT_MIN_SIZE: usize = size_of::<usize>();

/// Default options: everything from the environment, fsyncs on.
#[unsafe(no_mangle)]
pub extern "C" fn kc_disk_options_default() -> kc_disk_options {
    kc_disk_options::DEFAULT
}

/// # Safety
/// `opts` must be non-NULL and point to `opts->struct_size` readable bytes; `dir` NULL or a C
/// string; `key` NULL or `key_len` readable bytes.
unsafe fn read_disk_options(opts: *const kc_disk_options) -> Result<DiskConfig> {
    // SAFETY: readable for its size by the caller's contract.
    let opts = unsafe { read_input(opts, "opts") }?;
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
        lock_timeout: (opts.lock_timeout_ms != 0)
            .then(|| Duration::from_millis(opts.lock_timeout_ms)),
        // SAFETY: NULL or C strings by contract.
        remote: Some(unsafe { remote_args!(opts).config(!opts.ignore_env, "opts") }?),
        ..DiskConfig::from_env()
    })
}

/// Opens a disk tier; `opts` NULL takes everything from the environment. Refusals:
/// `KC_ERR_UNAVAILABLE` (`KCACHE_DISABLE=1`, no directory, a secure-execution process without
/// `opts->dir`, an invalid `KCACHE_MAX_SIZE`), `KC_ERR_UNTRUSTED` (directory not private to
/// this user or a symlink; no operator key while one is required; an unusable
/// `KCACHE_KEY_FILE`), `KC_ERR_INVALID_ARGUMENT` (see `kc_disk_options`), `KC_ERR_IO`. Each
/// refusal that comes from the environment or the directory is also logged once per process at
/// `KC_LOG_WARN` (on stderr, or to `kc_set_log_callback`'s callback). A caller should then go
/// on with memory only.
///
/// # Safety
/// `opts` must be NULL or point to `opts->struct_size` readable bytes; `out_disk` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_new(
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
        unsafe { new_handle(out_disk, inner) };
        Ok(())
    })
}

/// Frees a disk tier. NULL is a no-op. Buffers already returned stay valid.
///
/// # Safety
/// `disk` must be NULL or from `kc_disk_new`, not yet freed, with no call on it running.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_free(disk: *mut kc_disk) {
    // SAFETY: the caller hands back the disk from `kc_disk_new`, or NULL.
    guard_value((), || unsafe { free_handle(disk) });
}

/// Writes the entry for `key` (atomically: readers see the old entry or the new one).
/// `KC_ERR_IO` when the write fails (disk full, …): nothing partial is left behind.
/// `KC_ERR_INVALID_ARGUMENT` when the entry (payload, header and tag) is larger than the
/// smaller of the size cap and 1 GiB: decided from `len` alone, before `data` is read. Right
/// after `kc_disk_new` the write waits for the directory scan (see `kc_disk_wait_scan`), so
/// that it can make room within the cap first.
/// The entry says it holds a value of backend `custom` (`kc_disk_put_described` says more).
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
    // SAFETY: forwarded from the caller's contract; a NULL descriptor is the default one.
    unsafe { kc_disk_put_described(disk, key, data, len, build_time_ns, ptr::null()) }
}

/// What an entry holds, for `kc_disk_put_described` and `kc_tiered_find_or_build_described`:
/// `kcache ls` shows it and `kcache evict` selects by it. Each string is NULL or UTF-8, and is
/// cut to its `KC_DESCRIPTOR_*_MAX` bytes on a character boundary.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_entry_descriptor {
    /// `sizeof(kc_entry_descriptor)` as the caller compiled it.
    pub struct_size: usize,
    /// The backend's short name (`opencl`, `cuda`, your own); NULL or empty: `custom`.
    pub backend: *const c_char,
    /// The device's name; NULL: empty.
    pub device: *const c_char,
    /// What the entry holds (kernel or program names); NULL: empty.
    pub name: *const c_char,
}

/// `kc_disk_put`, with what the entry holds (`descriptor` NULL: backend `custom`, no device,
/// no name). A descriptor string that is not UTF-8 is `KC_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// As `kc_disk_put`; `descriptor` NULL or readable for its `struct_size`, its strings NULL or
/// C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_put_described(
    disk: *mut kc_disk,
    key: *const u8,
    data: *const u8,
    len: usize,
    build_time_ns: u64,
    descriptor: *const kc_entry_descriptor,
) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key, descriptor) = unsafe {
            (
                handle_ref(disk, "disk")?,
                key_arg(key)?,
                descriptor_arg(descriptor)?,
            )
        };
        // The length against the entry size limit before a byte of `data` is touched: an
        // oversized payload is refused at once, whatever memory lies past the caller's buffer.
        disk.check_payload_len(len, &descriptor)?;
        // SAFETY: the caller promises `len` readable bytes at `data`; NULL is refused inside.
        let data = unsafe { byte_slice(data, len, "data") }?;
        disk.put_described(&key, data, Duration::from_nanos(build_time_ns), &descriptor)
    })
}

/// Longest backend name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_BACKEND_MAX: usize = 32;
/// Longest device name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_DEVICE_MAX: usize = 256;
/// Longest entry name an entry keeps, in bytes.
pub const KC_DESCRIPTOR_NAME_MAX: usize = 1024;

const _: () = {
    assert!(KC_DESCRIPTOR_BACKEND_MAX == crate::disk::MAX_BACKEND_LEN);
    assert!(KC_DESCRIPTOR_DEVICE_MAX == crate::disk::MAX_DEVICE_LEN);
    assert!(KC_DESCRIPTOR_NAME_MAX == crate::disk::MAX_NAME_LEN);
};

/// The caller's descriptor; NULL is the default one.
///
/// # Safety
/// `p` NULL or readable for its `struct_size`, its strings NULL or C strings.
pub(super) unsafe fn descriptor_arg(p: *const kc_entry_descriptor) -> Result<Descriptor> {
    if p.is_null() {
        return Ok(Descriptor::default());
    }
    // SAFETY: non-NULL and readable for its `struct_size` by contract; every field is valid
    // for any bits (a size, raw pointers).
    let d = unsafe { read_sized(p, "descriptor", "kc_entry_descriptor") }?;
    let text = |p: *const c_char, what| {
        if p.is_null() {
            Ok("")
        } else {
            // SAFETY: non-NULL, hence a C string by the caller's contract.
            unsafe { c_str(p, what) }
        }
    };
    Ok(Descriptor::new(
        text(d.backend, "descriptor->backend")?,
        text(d.device, "descriptor->device")?,
        text(d.name, "descriptor->name")?,
    ))
}

/// Reads and verifies the entry for `key` into `*out` (written on success only; free it
/// with `kc_buffer_free`). Misses: `KC_ERR_NOT_FOUND` (none), `KC_ERR_INTEGRITY` (an entry
/// failed verification, was larger than the per-entry limit or was not a regular file, and
/// was removed: a directory with everything in it, never following a link), `KC_ERR_IO`.
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
        let (disk, key) = unsafe { (handle_ref(disk, "disk")?, key_arg(key)?) };
        non_null(out, "out")?;
        let entry = disk.get(&key)?.ok_or(Error::NotFound)?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { out.write(kc_buffer::from_entry(entry)) };
        Ok(())
    })
}

/// Removes the entry for `key`; `KC_ERR_NOT_FOUND` when there is none.
///
/// # Safety
/// `disk` live; `key` `KC_KEY_LEN` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_remove(disk: *mut kc_disk, key: *const u8) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        let (disk, key) = unsafe { (handle_ref(disk, "disk")?, key_arg(key)?) };
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
        let disk = unsafe { handle_ref(disk, "disk") }?;
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
            let report = kc_disk_gc_report::from(r);
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
        let disk = unsafe { handle_ref(disk, "disk") }?;
        non_null(out, "out")?;
        let stats = kc_disk_statistics::from(disk.stats());
        // SAFETY: non-NULL; its size is the caller's promise.
        unsafe { write_sized(out, stats, "out", "kc_disk_statistics", OUT_MIN_SIZE) }
    })
}

/// Zeroes this disk's event counters (`kc_disk_statistics`); `entries`, `bytes`,
/// `scan_complete` and `pending_writes` stay. The directory's counters, which every process
/// adds to (`kcache stats`), are not touched: `kcache zero-stats` zeroes them.
///
/// # Safety
/// `disk` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_reset_stats(disk: *mut kc_disk) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        unsafe { handle_ref(disk, "disk") }?.reset_stats();
        Ok(())
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
        let disk = unsafe { handle_ref(disk, "disk") }?;
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
        let disk = unsafe { handle_ref(disk, "disk") }?;
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

/// Waits until every background write of this disk submitted so far has finished (written
/// or failed): the tiered lookups' and the backend caches' that use it. `kc_disk_free` does it
/// too.
///
/// # Safety
/// `disk` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_flush(disk: *const kc_disk) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        unsafe { handle_ref(disk, "disk") }?.flush();
        Ok(())
    })
}

/// Waits for the scan of the directory that `kc_disk_new` starts in the background
/// (milliseconds even for a full cache). Until it has finished, `kc_disk_stats` counts only
/// this disk's own writes, and writes wait for it; reads do not.
///
/// # Safety
/// `disk` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_disk_wait_scan(disk: *const kc_disk) -> kc_status {
    guard(|| {
        // SAFETY: pointer validity is the caller's contract, NULLs are checked.
        unsafe { handle_ref(disk, "disk") }?.wait_scan();
        Ok(())
    })
}

// ---------------------------------------------------------------------------------------
