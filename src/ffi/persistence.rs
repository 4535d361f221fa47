//! `kc_persistence`: the persistent tiers through the C ABI, the disk tier and, when
//! configured, the remote tier behind it. One object serves every cache and tiered lookup it
//! is given (one background writer, one set of lock files, one remote connection, one set of
//! counters); this file opens it and resolves the `kc_persistence *` argument of those
//! functions. Its entries are in `persistence_entries.rs`, its counters in
//! `persistence_stats.rs`.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::args::{
    GrownInput, Handle, c_str, dir_arg, free_handle, handle_ref, invalid, new_handle,
    operator_key_arg, optional_path, read_input,
};
use super::status::{guard, guard_value, kc_status, non_null};
use crate::disk::Durability;
use crate::remote::RemoteConfig;
use crate::{Error, Result};
use crate::{Persistence, PersistenceConfig};

/// Length of an operator key fingerprint in bytes.
pub const KC_FINGERPRINT_LEN: usize = 8;

// The constant is a literal so cbindgen can emit it; this keeps it equal to the Rust type.
const _: () = assert!(KC_FINGERPRINT_LEN == size_of::<crate::disk::Fingerprint>());

/// The persistent tiers: the disk tier and, when configured, the remote tier behind it. Open
/// one with `kc_persistence_open` and hand it to every cache and tiered lookup of the process:
/// they share its writer, lock files, remote connection and counters. Reference counted: a
/// cache holds its own reference, so the caller may `kc_persistence_free` its own.
///
/// Where a function takes a `kc_persistence *` for a cache or lookup, NULL means the process's
/// default object (`kc_persistence_default`) and `kc_persistence_none()` means no persistent
/// tier at all: memory only.
pub struct kc_persistence {
    _opaque: [u8; 0],
}

impl Handle for kc_persistence {
    type Rust = Arc<Persistence>;
}

/// How to open the persistent tiers. Start from `kc_persistence_options_default()`. Unset
/// fields (NULL / 0) come from the environment unless `ignore_env` is set, then from the
/// defaults (`docs/disk-tier.md`, `docs/remote.md`). A secure-execution process reads no
/// environment (`KCACHE_DISABLE=1` excepted): the disk tier then needs `dir`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct kc_persistence_options {
    pub struct_size: usize,
    /// Cache directory, an absolute path, owned by the effective user and not writable by others
    /// (created mode 0700); NULL: `KCACHE_DIR`, `$XDG_CACHE_HOME/kcache`, `$HOME/.cache/kcache`.
    pub dir: *const c_char,
    /// Size cap in bytes; 0: `KCACHE_MAX_SIZE`, else 1 GiB.
    pub max_size: u64,
    /// Most entry files the directory holds (evicted least recently used first, as the size
    /// cap's are); 0: `KCACHE_MAX_FILES`, else the default; `UINT64_MAX`: no limit.
    pub max_files: u64,
    /// Operator key authenticating entries with HMAC-SHA256 (16 to 4096 bytes; copied, the copy
    /// wiped once used); NULL: the file named by `KCACHE_KEY_FILE`, else unkeyed BLAKE3 checksums.
    pub key: *const u8,
    /// Length of `key`.
    pub key_len: usize,
    /// Skip the fsyncs: writes stay atomic but a power loss may lose recent entries.
    pub relaxed_durability: bool,
    /// Ignore the environment entirely (`KCACHE_*`, `XDG_CACHE_HOME`, `HOME`; `KCACHE_DISABLE`
    /// included): `dir` must then be set (NULL is `KC_ERR_INVALID_ARGUMENT`).
    pub ignore_env: bool,
    /// Refuse to open (`KC_ERR_UNTRUSTED`) without an operator key instead of writing unkeyed
    /// entries. `KCACHE_REQUIRE_KEY=1` sets it too.
    pub require_key: bool,
    /// How long a lookup that misses waits for another process building the same entry, in
    /// milliseconds, before it builds too; 0: `KCACHE_LOCK_TIMEOUT` (seconds), else 120 s.
    pub lock_timeout_ms: u64,
    /// How long such a wait goes on once the builder shows no sign of life, in milliseconds (at
    /// least 1000), before taking the build over; 0: `KCACHE_LOCK_LIVENESS` (seconds), else 5 s.
    pub lock_liveness_ms: u64,
    /// The shared tier behind the disk: `redis://[user:password@]host[:port]`, `rediss://…`,
    /// `redis+unix:///path` or Redis Cluster seed URLs, comma-separated; NULL: `KCACHE_REMOTE_URL`,
    /// else none. An unusable URL leaves the remote off (one warning). It needs an operator key
    /// unless `remote_allow_unkeyed` (**unsafe**). A `remote_*` field left NULL or 0 takes
    /// `KCACHE_REMOTE_*`, else its default; paths are absolute (`docs/remote.md`).
    pub remote_url: *const c_char,
    pub remote_read_only: bool,
    pub remote_allow_unkeyed: bool,
    pub remote_timeout_ms: u64,
    pub remote_ttl_s: u64,
    pub remote_prefix: *const c_char,
    pub remote_max_entry_size: u64,
    pub remote_lease_wait_ms: u64,
    pub remote_ca_file: *const c_char,
    pub remote_cert_file: *const c_char,
    pub remote_key_file: *const c_char,
}

/// `kc_persistence_options` in ABI 3.0, its first layout in this major and the least
/// `struct_size` accepted. `kc_persistence_options_default` returns it by value, which a 3.0
/// program holds in this size, so it can never grow (`kc_store_options` holds what came later).
const SIZE_3_0: usize = 152;
const _: () = assert!(size_of::<kc_persistence_options>() == SIZE_3_0);

// SAFETY: every field but the bools is an integer or a raw pointer.
unsafe impl GrownInput for kc_persistence_options {
    const C_NAME: &str = "kc_persistence_options";
    const MIN_SIZE: usize = SIZE_3_0;
    const BOOLS: &[usize] = &[
        offset_of!(kc_persistence_options, relaxed_durability),
        offset_of!(kc_persistence_options, ignore_env),
        offset_of!(kc_persistence_options, require_key),
        offset_of!(kc_persistence_options, remote_read_only),
        offset_of!(kc_persistence_options, remote_allow_unkeyed),
    ];
    const DEFAULT: kc_persistence_options = kc_persistence_options {
        struct_size: size_of::<kc_persistence_options>(),
        dir: ptr::null(),
        max_size: 0,
        max_files: 0,
        key: ptr::null(),
        key_len: 0,
        relaxed_durability: false,
        ignore_env: false,
        require_key: false,
        lock_timeout_ms: 0,
        lock_liveness_ms: 0,
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

/// Default options: everything from the environment, fsyncs on.
#[unsafe(no_mangle)]
pub extern "C" fn kc_persistence_options_default() -> kc_persistence_options {
    kc_persistence_options::DEFAULT
}

/// The configuration `opts` describes.
///
/// # Safety
/// `opts` must be non-NULL and point to `opts->struct_size` readable bytes; its strings NULL
/// or C strings; `key` NULL or `key_len` readable bytes.
unsafe fn read_options(opts: *const kc_persistence_options) -> Result<PersistenceConfig> {
    // SAFETY: readable for its size by the caller's contract.
    let opts = unsafe { read_input(opts, "opts") }?;
    if opts.ignore_env && opts.dir.is_null() {
        return Err(invalid(
            "opts->ignore_env is set and opts->dir is NULL: no cache directory",
        ));
    }
    let millis = |ms: u64| (ms != 0).then(|| Duration::from_millis(ms));
    Ok(PersistenceConfig {
        // SAFETY: NULL or a C string by contract.
        dir: unsafe { dir_arg(opts.dir, "opts->dir") }?,
        max_size: (opts.max_size != 0).then_some(opts.max_size),
        max_files: match opts.max_files {
            0 => None,
            u64::MAX => Some(0),
            n => Some(n),
        },
        // SAFETY: NULL or `key_len` readable bytes by contract.
        key: unsafe { operator_key_arg(opts.key, opts.key_len, "opts->key") }?,
        require_key: opts.require_key,
        durability: if opts.relaxed_durability {
            Durability::Relaxed
        } else {
            Durability::Sync
        },
        read_env: !opts.ignore_env,
        lock_timeout: millis(opts.lock_timeout_ms),
        lock_liveness: millis(opts.lock_liveness_ms),
        // SAFETY: NULL or C strings by contract.
        remote: Some(unsafe { remote_config(&opts) }?),
        ..PersistenceConfig::from_env()
    })
}

/// The C string `p` (`name` in messages) as an owned string; NULL: `None`.
///
/// # Safety
/// `p` must be NULL or a C string.
pub(super) unsafe fn optional_text(p: *const c_char, name: &str) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, hence a C string by the caller's contract.
    unsafe { c_str(p, name) }.map(|s| Some(s.to_owned()))
}

/// The remote tier's settings of `opts`: NULL or 0 leaves one to the environment (unless
/// `ignore_env`), else to the default.
///
/// # Safety
/// The strings of `opts` must be NULL or C strings.
unsafe fn remote_config(opts: &kc_persistence_options) -> Result<RemoteConfig> {
    // SAFETY: NULL or C strings by the caller's contract.
    let text =
        |p: *const c_char, field: &str| unsafe { optional_text(p, &format!("opts->{field}")) };
    // SAFETY: NULL or C strings by the caller's contract.
    let path =
        |p: *const c_char, field: &str| unsafe { optional_path(p, &format!("opts->{field}")) };
    let nonzero = |n: u64| (n != 0).then_some(n);
    Ok(RemoteConfig {
        url: text(opts.remote_url, "remote_url")?,
        read_only: opts.remote_read_only.then_some(true),
        timeout: nonzero(opts.remote_timeout_ms).map(Duration::from_millis),
        ttl: nonzero(opts.remote_ttl_s).map(Duration::from_secs),
        prefix: text(opts.remote_prefix, "remote_prefix")?,
        max_entry_size: nonzero(opts.remote_max_entry_size),
        lease_wait: nonzero(opts.remote_lease_wait_ms).map(Duration::from_millis),
        ca_file: path(opts.remote_ca_file, "remote_ca_file")?,
        cert_file: path(opts.remote_cert_file, "remote_cert_file")?,
        key_file: path(opts.remote_key_file, "remote_key_file")?,
        allow_unkeyed: opts.remote_allow_unkeyed,
        read_env: !opts.ignore_env,
        ..RemoteConfig::default()
    })
}

/// Opens the persistent tiers (`opts` NULL: all from the environment) as a new object with its
/// own writer and counters. Refusals, also logged once at `KC_LOG_WARN`: `KC_ERR_UNAVAILABLE`
/// (`KCACHE_DISABLE=1`, no directory, an invalid `KCACHE_MAX_SIZE`, secure execution without
/// `opts->dir`), `KC_ERR_UNTRUSTED` (directory not private or a symlink; no operator key while one
/// is required), `KC_ERR_INVALID_ARGUMENT`, `KC_ERR_IO`: go on with `kc_persistence_none()`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_open(
    opts: *const kc_persistence_options,
    out: *mut *mut kc_persistence,
) -> kc_status {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: forwarded from the caller's contract.
        let config = unsafe { config_of(opts) }?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { open_into(config, out) }
    })
}

/// The configuration `opts` describes; NULL: all from the environment.
///
/// # Safety
/// `opts` must be NULL or as [`kc_persistence_open`] says.
pub(super) unsafe fn config_of(opts: *const kc_persistence_options) -> Result<PersistenceConfig> {
    if opts.is_null() {
        return Ok(PersistenceConfig::from_env());
    }
    // SAFETY: non-NULL; its size is the caller's promise.
    unsafe { read_options(opts) }
}

/// Opens the tiers `config` describes into `*out`.
///
/// # Safety
/// `out` must be non-NULL and writable.
pub(super) unsafe fn open_into(
    config: PersistenceConfig,
    out: *mut *mut kc_persistence,
) -> Result<()> {
    let inner = Arc::new(Persistence::open(config)?);
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { new_handle(out, inner) };
    Ok(())
}

/// The process's default persistent tiers, opened from the environment on first use and
/// shared by every cache and lookup given a NULL `kc_persistence *`; `None` when the
/// environment turns the disk tier off or it is refused (warned about once). An I/O error is
/// returned, and the next use tries again.
fn default_persistence() -> Result<Option<&'static Arc<Persistence>>> {
    static DEFAULT: OnceLock<Option<Arc<Persistence>>> = OnceLock::new();
    static OPENING: Mutex<()> = Mutex::new(());
    if let Some(opened) = DEFAULT.get() {
        return Ok(opened.as_ref());
    }
    // One opener at a time, so that the process never holds two default objects.
    let _opening = OPENING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(opened) = DEFAULT.get() {
        return Ok(opened.as_ref());
    }
    let opened = match Persistence::open(PersistenceConfig::from_env()) {
        Ok(disk) => Some(Arc::new(disk)),
        Err(Error::Unavailable(_) | Error::Untrusted(_)) => None,
        Err(e) => return Err(e),
    };
    Ok(DEFAULT.get_or_init(|| opened).as_ref())
}

/// A new reference to the process's default persistent tiers (what a NULL `kc_persistence *`
/// gives a cache or lookup), to read its statistics or flush it; free it with
/// `kc_persistence_free`. Opened from the environment by the first use, as
/// `kc_persistence_open(NULL, …)` would: `KC_ERR_UNAVAILABLE` when the environment turns the
/// disk tier off or it was refused (then every NULL means memory only), `KC_ERR_IO`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_default(out: *mut *mut kc_persistence) -> kc_status {
    guard(|| {
        non_null(out, "out")?;
        let shared = default_persistence()?
            .ok_or_else(|| Error::Unavailable("the environment gives no persistent tier".into()))?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { new_handle(out, Arc::clone(shared)) };
        Ok(())
    })
}

/// The address `kc_persistence_none()` returns; never read.
static NO_PERSISTENCE: u8 = 0;

fn is_none_marker(p: *const kc_persistence) -> bool {
    ptr::eq(p.cast::<u8>(), &NO_PERSISTENCE)
}

/// What to pass as the `kc_persistence *` of a cache or tiered lookup that must keep nothing
/// beyond memory, whatever the environment says. Not an object: `kc_persistence_free` ignores
/// it and the `kc_persistence_*` functions refuse it (`KC_ERR_INVALID_ARGUMENT`).
#[unsafe(no_mangle)]
pub extern "C" fn kc_persistence_none() -> *mut kc_persistence {
    ptr::from_ref(&NO_PERSISTENCE).cast_mut().cast()
}

/// The persistent tiers a cache or tiered lookup is given: NULL the process's default,
/// `kc_persistence_none()` none, else that object.
///
/// # Safety
/// `p` must be NULL, `kc_persistence_none()` or a live object, live for `'a`.
pub(super) unsafe fn persistence_arg<'a>(
    p: *const kc_persistence,
) -> Result<Option<&'a Arc<Persistence>>> {
    if p.is_null() {
        default_persistence()
    } else if is_none_marker(p) {
        Ok(None)
    } else {
        // SAFETY: a live object by contract.
        unsafe { handle_ref(p, "persistence") }.map(Some)
    }
}

/// The object of a `kc_persistence_*` function's first argument: NULL and
/// `kc_persistence_none()` are `KC_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// As [`persistence_arg`].
pub(super) unsafe fn persistence_ref<'a>(p: *const kc_persistence) -> Result<&'a Persistence> {
    if is_none_marker(p) {
        return Err(invalid(
            "persistence is kc_persistence_none(), which stands for no persistent tier",
        ));
    }
    // SAFETY: NULL or a live object by contract.
    unsafe { handle_ref(p, "persistence") }.map(|shared| &**shared)
}

/// The body of a `kc_persistence_*` function: `call` on the object of its first argument,
/// inside [`guard`].
///
/// # Safety
/// As [`persistence_arg`].
pub(super) unsafe fn with_persistence(
    persistence: *const kc_persistence,
    call: impl FnOnce(&Persistence) -> Result<()>,
) -> kc_status {
    // SAFETY: forwarded from the caller's contract.
    guard(|| call(unsafe { persistence_ref(persistence) }?))
}

/// Gives up the caller's reference; the tiers close (after their pending writes) once no
/// cache holds one either. NULL and `kc_persistence_none()` are no-ops. Buffers already
/// returned stay valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_free(persistence: *mut kc_persistence) {
    if is_none_marker(persistence) {
        return;
    }
    // SAFETY: the caller hands back its reference, or NULL.
    guard_value((), || unsafe { free_handle(persistence) });
}

/// The fingerprint of the operator key this object writes under (`KC_FINGERPRINT_LEN` bytes,
/// all zero without a key): what to pass to another process's `kc_persistence_gc` to keep its
/// entries during a key rotation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_fingerprint(
    persistence: *const kc_persistence,
    out: *mut u8,
) -> kc_status {
    let copy = |disk: &Persistence| {
        non_null(out, "out")?;
        let fp = disk.fingerprint();
        // SAFETY: `out` has `KC_FINGERPRINT_LEN` writable bytes by contract.
        unsafe { ptr::copy_nonoverlapping(fp.as_ptr(), out, KC_FINGERPRINT_LEN) };
        Ok(())
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_persistence(persistence, copy) }
}

/// The distinct operator key fingerprints of the directory's entries, ascending (all zero for
/// unkeyed entries). `*out_count` receives how many there are; at most `capacity` are written to
/// `out` (`KC_FINGERPRINT_LEN` bytes each). `out` NULL with `capacity` 0 asks for the count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_fingerprints(
    persistence: *const kc_persistence,
    out: *mut u8,
    capacity: usize,
    out_count: *mut usize,
) -> kc_status {
    let list = |disk: &Persistence| {
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
    };
    // SAFETY: forwarded from the caller's contract.
    unsafe { with_persistence(persistence, list) }
}

/// Waits until every background write of this object submitted so far has finished (written or
/// failed): the tiered lookups' and the backend caches' that use it. `kc_persistence_free` does it
/// too.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_flush(persistence: *const kc_persistence) -> kc_status {
    // SAFETY: pointer validity is the caller's contract, NULLs are checked.
    guard(|| unsafe { persistence_ref(persistence) }.map(|p| p.flush()))
}

/// Waits for the scan of the directory that `kc_persistence_open` starts in the background
/// (milliseconds even for a full cache). Until it has finished, `kc_persistence_stats` counts only
/// this object's own writes, and writes wait for it; reads do not.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_persistence_wait_scan(persistence: *const kc_persistence) -> kc_status {
    // SAFETY: pointer validity is the caller's contract, NULLs are checked.
    guard(|| unsafe { persistence_ref(persistence) }.map(|p| p.wait_scan()))
}

// ---------------------------------------------------------------------------------------
