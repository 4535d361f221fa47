//! Status codes, the per-thread failure detail, and the boundary every exported function runs
//! its body in: Rust errors become a status plus a message, and a panic never unwinds into C.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{self, AssertUnwindSafe};

use crate::{Error, Result};

/// Major version of the C ABI this header describes: the SONAME's number (`libkcache.so.3`).
pub const KCACHE_VERSION_MAJOR: u32 = 3;
/// Minor version of the C ABI this header describes.
pub const KCACHE_VERSION_MINOR: u32 = 1;
/// Patch version of the C ABI this header describes.
pub const KCACHE_VERSION_PATCH: u32 = 0;

// The macros above are literals so that cbindgen can emit them; these checks keep them equal
// to `abi-version` in Cargo.toml (which build.rs passes on, and which names the SONAME, CMake's
// and pkg-config's version), at compile time: C users see one version number.
const _: () = assert!(KCACHE_VERSION_MAJOR == decimal(env!("KCACHE_ABI_VERSION_MAJOR")));
const _: () = assert!(KCACHE_VERSION_MINOR == decimal(env!("KCACHE_ABI_VERSION_MINOR")));
const _: () = assert!(KCACHE_VERSION_PATCH == decimal(env!("KCACHE_ABI_VERSION_PATCH")));

const fn decimal(digits: &str) -> u32 {
    let digits = digits.as_bytes();
    let mut value = 0;
    let mut i = 0;
    while i < digits.len() {
        assert!(digits[i].is_ascii_digit(), "version part is not a number");
        value = value * 10 + (digits[i] - b'0') as u32;
        i += 1;
    }
    value
}

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("KCACHE_ABI_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("the crate version contains a NUL byte"),
    };

/// The outcome of a kcache call. `KC_OK` is zero. Every other code also leaves a detail for
/// `kc_last_error_message()` on the calling thread. New codes may be added at the end.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kc_status {
    /// Success.
    KC_OK = 0,
    /// A required pointer was NULL, a length or size was out of range, or an id was invalid.
    KC_ERR_INVALID_ARGUMENT = 1,
    /// The build callback returned non-zero; `kc_last_build_error()` gives its code.
    KC_ERR_BUILD_FAILED = 2,
    /// The device was evicted while the value was being built; the new value was destroyed.
    KC_ERR_DEVICE_DESTROYED = 3,
    /// A cache created with `invalidated_by_clear` was cleared while the value was being
    /// built; the new value was destroyed.
    KC_ERR_CACHE_CLEARED = 4,
    /// A destroy callback returned non-zero. Every other victim was still destroyed.
    KC_ERR_DESTROY_FAILED = 5,
    /// A build callback asked the cache for the key it is building.
    KC_ERR_REENTRANT = 6,
    /// No entry for the key.
    KC_ERR_NOT_FOUND = 7,
    /// A bug inside kcache was caught before it could unwind into the caller.
    KC_ERR_PANIC = 8,
    /// A runtime or a facility kcache needs is not available on this machine.
    KC_ERR_UNAVAILABLE = 9,
    /// A file-system operation failed.
    KC_ERR_IO = 10,
    /// Stored data failed its integrity check.
    KC_ERR_INTEGRITY = 11,
    /// A cache directory is not owned by this user or is writable by others.
    KC_ERR_UNTRUSTED = 12,
    /// A GPU runtime call failed.
    KC_ERR_BACKEND = 13,
    /// The caller's buffer cannot hold the result; the size it needs was reported.
    KC_ERR_BUFFER_TOO_SMALL = 14,
}

/// Every code, in numeric order.
const ALL_STATUSES: [kc_status; 15] = [
    kc_status::KC_OK,
    kc_status::KC_ERR_INVALID_ARGUMENT,
    kc_status::KC_ERR_BUILD_FAILED,
    kc_status::KC_ERR_DEVICE_DESTROYED,
    kc_status::KC_ERR_CACHE_CLEARED,
    kc_status::KC_ERR_DESTROY_FAILED,
    kc_status::KC_ERR_REENTRANT,
    kc_status::KC_ERR_NOT_FOUND,
    kc_status::KC_ERR_PANIC,
    kc_status::KC_ERR_UNAVAILABLE,
    kc_status::KC_ERR_IO,
    kc_status::KC_ERR_INTEGRITY,
    kc_status::KC_ERR_UNTRUSTED,
    kc_status::KC_ERR_BACKEND,
    kc_status::KC_ERR_BUFFER_TOO_SMALL,
];

impl kc_status {
    pub fn name(self) -> &'static CStr {
        match self {
            kc_status::KC_OK => c"KC_OK",
            kc_status::KC_ERR_INVALID_ARGUMENT => c"KC_ERR_INVALID_ARGUMENT",
            kc_status::KC_ERR_BUILD_FAILED => c"KC_ERR_BUILD_FAILED",
            kc_status::KC_ERR_DEVICE_DESTROYED => c"KC_ERR_DEVICE_DESTROYED",
            kc_status::KC_ERR_CACHE_CLEARED => c"KC_ERR_CACHE_CLEARED",
            kc_status::KC_ERR_DESTROY_FAILED => c"KC_ERR_DESTROY_FAILED",
            kc_status::KC_ERR_REENTRANT => c"KC_ERR_REENTRANT",
            kc_status::KC_ERR_NOT_FOUND => c"KC_ERR_NOT_FOUND",
            kc_status::KC_ERR_PANIC => c"KC_ERR_PANIC",
            kc_status::KC_ERR_UNAVAILABLE => c"KC_ERR_UNAVAILABLE",
            kc_status::KC_ERR_IO => c"KC_ERR_IO",
            kc_status::KC_ERR_INTEGRITY => c"KC_ERR_INTEGRITY",
            kc_status::KC_ERR_UNTRUSTED => c"KC_ERR_UNTRUSTED",
            kc_status::KC_ERR_BACKEND => c"KC_ERR_BACKEND",
            kc_status::KC_ERR_BUFFER_TOO_SMALL => c"KC_ERR_BUFFER_TOO_SMALL",
        }
    }

    /// The code for `value`, or `None` when it is not one (C may pass any `int`).
    pub fn from_code(value: c_int) -> Option<kc_status> {
        ALL_STATUSES.into_iter().find(|s| *s as c_int == value)
    }
}

/// The one place a crate error becomes a C status.
pub fn status_of(error: &Error) -> kc_status {
    match error {
        Error::InvalidArgument(_) => kc_status::KC_ERR_INVALID_ARGUMENT,
        Error::Build(_) => kc_status::KC_ERR_BUILD_FAILED,
        // In the C ABI builds are C callbacks, which cannot panic: a build panic is a Rust bug.
        Error::BuildPanicked => kc_status::KC_ERR_PANIC,
        Error::DeviceDestroyed(_) => kc_status::KC_ERR_DEVICE_DESTROYED,
        Error::CacheCleared => kc_status::KC_ERR_CACHE_CLEARED,
        Error::Destroy(_) => kc_status::KC_ERR_DESTROY_FAILED,
        Error::Reentrant => kc_status::KC_ERR_REENTRANT,
        Error::NotFound => kc_status::KC_ERR_NOT_FOUND,
        Error::Unavailable(_) => kc_status::KC_ERR_UNAVAILABLE,
        Error::Io(_) => kc_status::KC_ERR_IO,
        Error::Integrity(_) => kc_status::KC_ERR_INTEGRITY,
        Error::Untrusted(_) => kc_status::KC_ERR_UNTRUSTED,
        Error::Backend(_) => kc_status::KC_ERR_BACKEND,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_BUILD_ERROR: Cell<c_int> = const { Cell::new(0) };
}

/// Records `error` as this thread's last failure and returns its status.
#[cold]
pub fn fail(error: &Error) -> kc_status {
    if let Error::Build(build) = error {
        // A thread being torn down has nowhere to keep the code; the status still reports it.
        let _ = LAST_BUILD_ERROR.try_with(|code| code.set(build.code));
    }
    record_message(&error.to_string());
    status_of(error)
}

fn record_message(message: &str) {
    // C strings end at the first NUL: drop interior ones so the whole detail survives.
    let bytes: Vec<u8> = message.bytes().filter(|&b| b != 0).collect();
    let message = CString::new(bytes).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

fn record_panic(payload: &(dyn Any + Send)) {
    let detail = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    record_message(&format!("panic inside kcache: {detail}"));
}

/// The boundary for exported functions that return a status: runs `body`, turns its error
/// into a status plus this thread's message, and a panic into `KC_ERR_PANIC`.
#[inline]
pub fn guard(body: impl FnOnce() -> Result<()>) -> kc_status {
    // The error becomes a status inside the unwind boundary, so that what crosses it is one
    // integer rather than a whole `Result` (measurably cheaper on a cache hit).
    let status = || match body() {
        Ok(()) => kc_status::KC_OK,
        Err(error) => fail(&error),
    };
    match panic::catch_unwind(AssertUnwindSafe(status)) {
        Ok(status) => status,
        Err(payload) => {
            record_panic(&*payload);
            kc_status::KC_ERR_PANIC
        }
    }
}

/// The boundary for exported functions without a status (they return a value, NULL or 0):
/// a panic records its message and yields `on_panic`.
#[inline]
pub fn guard_value<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    panic::catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        record_panic(&*payload);
        on_panic
    })
}

/// Records that a buffer of `len` bytes cannot hold the `needed` ones, as this thread's last
/// failure, and returns `KC_ERR_BUFFER_TOO_SMALL`.
pub fn buffer_too_small(len: usize, needed: usize) -> kc_status {
    record_message(&format!(
        "the buffer holds {len} bytes, {needed} are needed"
    ));
    kc_status::KC_ERR_BUFFER_TOO_SMALL
}

/// Records "`name` is NULL" as this thread's last failure, for functions without a status.
pub fn null_argument(name: &str) {
    record_message(&format!("invalid argument: {name} is NULL"));
}

/// The NULL check for pointer arguments that must not be NULL.
pub fn non_null<T>(ptr: *const T, name: &str) -> Result<()> {
    if ptr.is_null() {
        Err(is_null(name))
    } else {
        Ok(())
    }
}

/// The error of [`byte_slice`] for a length no object has; out of line, as [`is_null`].
#[cold]
#[inline(never)]
fn too_long(name: &str, len: usize) -> Error {
    Error::InvalidArgument(format!("{name}_len {len} is larger than any object"))
}

/// The error of [`non_null`], out of line: formatted in place, the message would make every
/// call store the argument's name on the stack, failing or not.
#[cold]
#[inline(never)]
fn is_null(name: &str) -> Error {
    Error::InvalidArgument(format!("{name} is NULL"))
}

/// Borrows `len` bytes at `ptr`. A zero length is the empty slice whatever `ptr` is (NULL
/// included); a NULL `ptr` with a non-zero length is an invalid argument.
///
/// # Safety
/// When `len > 0` and `ptr` is not NULL, `ptr` must point to `len` readable bytes that stay
/// valid and unchanged for `'a`.
pub unsafe fn byte_slice<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    non_null(ptr, name)?;
    if len > isize::MAX as usize {
        return Err(too_long(name, len));
    }
    // SAFETY: `ptr` is non-NULL and the caller promises `len` readable bytes for `'a`; the
    // length fits `isize` as `from_raw_parts` requires.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The static name of a status code: "KC_OK", "KC_ERR_CACHE_CLEARED", ... and
/// "KC_UNKNOWN_STATUS" for any other value. Takes an `int` so that any value is safe to pass;
/// passing a `kc_status` is the same thing. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn kc_status_name(status: c_int) -> *const c_char {
    guard_value(c"KC_UNKNOWN_STATUS".as_ptr(), || {
        kc_status::from_code(status)
            .map_or(c"KC_UNKNOWN_STATUS", kc_status::name)
            .as_ptr()
    })
}

/// A NUL-terminated detail of the last failure of a kcache call on this thread, or "" if none
/// failed yet. Successful calls leave it unchanged. The string belongs to kcache and stays
/// valid until the next kcache call on this thread; copy it to keep it. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn kc_last_error_message() -> *const c_char {
    guard_value(c"".as_ptr(), || {
        LAST_ERROR
            .try_with(|last| last.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    })
}

/// The non-zero code the build callback returned for the last `KC_ERR_BUILD_FAILED` seen on
/// this thread, or 0 if there was none. Every caller that waited on the same single-flight
/// build gets the builder's code. Other failures leave it unchanged.
#[unsafe(no_mangle)]
pub extern "C" fn kc_last_build_error() -> c_int {
    guard_value(0, || LAST_BUILD_ERROR.try_with(Cell::get).unwrap_or(0))
}

/// The library's C ABI version, "MAJOR.MINOR.PATCH", a static string. Compare with the
/// KCACHE_VERSION_* macros to detect a header/library mismatch.
#[unsafe(no_mangle)]
pub extern "C" fn kc_version() -> *const c_char {
    VERSION.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BuildError;

    fn last_message() -> String {
        // SAFETY: kc_last_error_message never returns NULL and the string lives until the next
        // kcache call on this thread, which comes after the copy.
        unsafe { CStr::from_ptr(kc_last_error_message()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn codes_are_dense_and_named_after_themselves() {
        for (i, status) in ALL_STATUSES.into_iter().enumerate() {
            assert_eq!(status as usize, i);
            assert_eq!(status.name().to_str().unwrap(), format!("{status:?}"));
            assert_eq!(kc_status::from_code(i as c_int), Some(status));
        }
        assert_eq!(kc_status::from_code(-1), None);
        assert_eq!(kc_status::from_code(15), None);
    }

    #[test]
    fn a_panic_becomes_kc_err_panic_with_its_message() {
        let status = guard(|| panic!("boom {}", 42));
        assert_eq!(status, kc_status::KC_ERR_PANIC);
        assert_eq!(last_message(), "panic inside kcache: boom 42");

        let value = guard_value(7u32, || panic!("static"));
        assert_eq!(value, 7);
        assert_eq!(last_message(), "panic inside kcache: static");
    }

    #[test]
    fn errors_map_to_their_status_and_keep_the_build_code() {
        let status = guard(|| Err(Error::Build(BuildError::new(-77, "log\0tail"))));
        assert_eq!(status, kc_status::KC_ERR_BUILD_FAILED);
        assert_eq!(kc_last_build_error(), -77);
        assert_eq!(last_message(), "build failed with code -77: logtail");

        // Another kind of failure leaves the build code alone.
        assert_eq!(guard(|| Err(Error::NotFound)), kc_status::KC_ERR_NOT_FOUND);
        assert_eq!(kc_last_build_error(), -77);
        assert_eq!(last_message(), "not found");

        // Success leaves the message alone.
        assert_eq!(guard(|| Ok(())), kc_status::KC_OK);
        assert_eq!(last_message(), "not found");
    }

    #[test]
    fn messages_are_per_thread() {
        assert_eq!(guard(|| Err(Error::Reentrant)), kc_status::KC_ERR_REENTRANT);
        let other = std::thread::spawn(last_message).join().unwrap();
        assert_eq!(other, "");
        assert_eq!(
            last_message(),
            "a build asked the cache for the key it is building"
        );
    }

    #[test]
    fn byte_slices_accept_the_empty_key_and_reject_null_with_a_length() {
        // SAFETY: zero lengths never read; the NULL case is rejected before any read.
        unsafe {
            assert_eq!(byte_slice(std::ptr::null(), 0, "key").unwrap(), b"");
            assert_eq!(
                byte_slice(std::ptr::null(), 3, "key").unwrap_err(),
                Error::InvalidArgument("key is NULL".into())
            );
            let bytes = [1u8, 2, 3];
            assert_eq!(byte_slice(bytes.as_ptr(), 3, "key").unwrap(), &bytes);
        }
    }

    #[test]
    fn version_matches_the_crate() {
        // SAFETY: kc_version returns a static NUL-terminated string.
        let version = unsafe { CStr::from_ptr(kc_version()) };
        assert_eq!(
            version.to_str().unwrap(),
            format!("{KCACHE_VERSION_MAJOR}.{KCACHE_VERSION_MINOR}.{KCACHE_VERSION_PATCH}")
        );
    }
}
