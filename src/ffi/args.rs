//! Argument and result conventions shared by every `kc_*` function: boxed handles (and the
//! [`Handle`] casts between a C handle type and its Rust value), leases carried as raw
//! reference counts, `struct_size`-prefixed structs, optional out-parameters, C strings and
//! arrays.

use std::ffi::{CStr, OsStr, c_char};
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr;
use std::sync::Arc;

use super::status::{byte_slice, guard, guard_value, kc_status, non_null, null_argument};
use crate::disk::OperatorKey;
use crate::disk::config::{MAX_OPERATOR_KEY_LEN, MIN_OPERATOR_KEY_LEN};
use crate::memory::{Entry, Lease};
use crate::{Error, Result};

/// The error for an argument that breaks its contract, described by `message`.
pub fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Boxes `value` and hands the box to the caller through `out`.
///
/// # Safety
/// `out` must be non-NULL and writable.
pub unsafe fn write_boxed<T>(out: *mut *mut T, value: T) {
    // SAFETY: non-NULL and writable by the caller's contract.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
}

/// Frees a handle made by [`write_boxed`]; NULL is a no-op, as every `*_free` promises.
///
/// # Safety
/// `handle` must be NULL or a box from [`write_boxed`] not yet freed.
pub unsafe fn free_boxed<T>(handle: *mut T) {
    if !handle.is_null() {
        // SAFETY: the caller hands back the box it got.
        drop(unsafe { Box::from_raw(handle) });
    }
}

/// Borrows a handle argument that must not be NULL.
///
/// # Safety
/// `handle` must be NULL or point to a live `T` that outlives `'a`, only shared meanwhile.
pub unsafe fn live<'a, T>(handle: *const T, name: &str) -> Result<&'a T> {
    non_null(handle, name)?;
    // SAFETY: non-NULL, hence live by the caller's contract.
    Ok(unsafe { &*handle })
}

/// An opaque C handle type that stands for a Rust value: a `*mut Self` handed to C is a boxed
/// `Self::Rust`. The C type is only a name (cbindgen emits `typedef struct kc_x kc_x;`), so the
/// Rust value needs no wrapper, and every cast between the two goes through [`new_handle`],
/// [`handle_ref`], [`handle_mut`] and [`free_handle`].
pub trait Handle {
    /// The value behind a handle pointer.
    type Rust;
}

/// Boxes `value` and hands it to the caller through `out` as its handle type.
///
/// # Safety
/// `out` must be non-NULL and writable.
pub unsafe fn new_handle<H: Handle>(out: *mut *mut H, value: H::Rust) {
    // SAFETY: forwarded from the caller's contract; a handle pointer is the boxed value.
    unsafe { write_boxed(out.cast::<*mut H::Rust>(), value) };
}

/// Frees a handle made by [`new_handle`]; NULL is a no-op.
///
/// # Safety
/// `handle` must be NULL or from [`new_handle`], not yet freed.
pub unsafe fn free_handle<H: Handle>(handle: *mut H) {
    // SAFETY: a handle pointer is the box [`new_handle`] made, or NULL.
    unsafe { free_boxed(handle.cast::<H::Rust>()) };
}

/// Borrows the value behind a handle argument that must not be NULL.
///
/// # Safety
/// `handle` must be NULL or from [`new_handle`] and live for `'a`, only shared meanwhile.
#[inline]
pub unsafe fn handle_ref<'a, H: Handle>(handle: *const H, name: &str) -> Result<&'a H::Rust> {
    // SAFETY: a handle pointer is the boxed value; liveness is the caller's contract.
    unsafe { live(handle.cast::<H::Rust>(), name) }
}

/// Borrows the value behind a handle argument mutably.
///
/// # Safety
/// `handle` must be NULL or from [`new_handle`] and live for `'a`, used by no one else
/// meanwhile.
pub unsafe fn handle_mut<'a, H: Handle>(handle: *mut H, name: &str) -> Result<&'a mut H::Rust> {
    non_null(handle, name)?;
    // SAFETY: non-NULL, hence the boxed value, live and unshared by the caller's contract.
    Ok(unsafe { &mut *handle.cast::<H::Rust>() })
}

/// Writes an optional out-parameter: NULL means the caller does not want the value.
///
/// # Safety
/// `out` must be NULL or writable.
pub unsafe fn write_optional<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-NULL, hence writable by the caller's contract.
        unsafe { out.write(value) };
    }
}

/// An opaque C lease type: a pointer to it is `Arc::into_raw` of a `Lease`'s entry, so a
/// lookup that hits allocates nothing and a release is one reference-count decrement.
pub trait LeaseHandle {
    type Key;
    type Value;
}

/// [`LeaseHandle`] for a lease type on entries keyed by bytes, holding `$value`s.
macro_rules! lease_handle {
    ($lease:ty, $value:ty) => {
        impl $crate::ffi::args::LeaseHandle for $lease {
            type Key = Vec<u8>;
            type Value = $value;
        }
    };
}
pub(super) use lease_handle;

/// The lease as the opaque pointer handed to C.
pub fn lease_into_raw<H: LeaseHandle>(lease: Lease<H::Key, H::Value>) -> *mut H {
    Arc::into_raw(lease.into_arc()).cast_mut().cast()
}

/// Borrows the entry behind a lease pointer.
///
/// # Safety
/// `lease` must be a non-NULL lease from [`lease_into_raw`], not yet released.
pub unsafe fn lease_entry<'a, H: LeaseHandle>(lease: *const H) -> &'a Entry<H::Key, H::Value> {
    // SAFETY: a lease pointer is `Arc::into_raw` of its entry, alive until released.
    unsafe { &*lease.cast::<Entry<H::Key, H::Value>>() }
}

/// Borrows the entry behind a lease argument that must not be NULL.
///
/// # Safety
/// `lease` must be NULL or a lease from [`lease_into_raw`], not yet released.
pub unsafe fn live_lease<'a, H: LeaseHandle>(
    lease: *const H,
) -> Result<&'a Entry<H::Key, H::Value>> {
    non_null(lease, "lease")?;
    // SAFETY: non-NULL, and live by the caller's contract.
    Ok(unsafe { lease_entry(lease) })
}

/// The body of a lease accessor without a status: what `read` makes of the leased entry, or
/// `none` when `lease` is NULL (recorded as the invalid argument) or `read` panics.
///
/// # Safety
/// `lease` must be NULL or a lease from [`lease_into_raw`], not yet released.
#[inline]
pub unsafe fn read_lease<H: LeaseHandle, T: Copy>(
    lease: *const H,
    none: T,
    read: impl FnOnce(&Entry<H::Key, H::Value>) -> T,
) -> T {
    guard_value(none, || {
        if lease.is_null() {
            null_argument("lease");
            return none;
        }
        // SAFETY: non-NULL, and live by the caller's contract.
        read(unsafe { lease_entry(lease) })
    })
}

/// Gives back the reference a lease pointer owns; NULL is a no-op, as every `*_release`
/// promises. Dropping the lease runs the value's destroy if it was the last one of an
/// unlinked entry.
///
/// # Safety
/// `lease` must be NULL or a lease from [`lease_into_raw`], not yet released; it must not be
/// used afterwards.
pub unsafe fn release_lease<H: LeaseHandle>(lease: *mut H) {
    if !lease.is_null() {
        // SAFETY: the caller hands back the reference it owns, made by `Arc::into_raw`.
        let entry = unsafe { Arc::from_raw(lease.cast_const().cast::<Entry<H::Key, H::Value>>()) };
        drop(Lease::from_arc(entry));
    }
}

// Structs that start with `size_t struct_size` follow one rule, described in
// docs/c-api-conventions.md: a size below the first published layout is refused; inputs are
// read up to what both sides know, with defaults past an older caller's struct and zero
// required past the fields this library knows; outputs are written up to what both sides know.
// [`struct_size`] checks the size, [`read_sized`] and [`read_grown`] read inputs, and
// [`write_sized`] writes outputs.

/// `From<$rust>` for the C statistics struct `$c` that mirrors it: `struct_size` set to the
/// whole struct, each listed counter copied, each nested tier's statistics (`into`) converted
/// to their own C struct, and the fields left (`..`) taken from what a function makes of the
/// Rust statistics.
macro_rules! c_statistics {
    ($rust:ty => $c:ident { $($field:ident),+ $(,)? } $(into { $($nested:ident),+ })?
        $(.. $rest:path)?) => {
        impl From<$rust> for $c {
            fn from(s: $rust) -> Self {
                $c {
                    struct_size: std::mem::size_of::<$c>(),
                    $($field: s.$field,)+
                    $($($nested: s.$nested.into(),)+)?
                    $(..$rest(&s))?
                }
            }
        }
    };
}
pub(super) use c_statistics;

/// The largest `struct_size` accepted. No struct of the API comes near it (the largest is
/// a few hundred bytes), so a larger one is a wrong or uninitialised size, refused before a
/// byte past `struct_size` itself is read: the check of the bytes past the known fields reads
/// all of them.
const MAX_STRUCT_SIZE: usize = 4096;

/// Checks the `struct_size` a caller set in a struct of type `T` (called `c_name` in C)
/// against the smallest size this library accepts and [`MAX_STRUCT_SIZE`], and returns it.
///
/// # Safety
/// `p` must be non-NULL and point to a readable struct whose first field is a `size_t`.
pub unsafe fn struct_size<T>(p: *const T, name: &str, c_name: &str, min: usize) -> Result<usize> {
    // SAFETY: `struct_size` is the first field of every version of these structs.
    let given = unsafe { p.cast::<usize>().read_unaligned() };
    if given < min {
        return Err(Error::InvalidArgument(format!(
            "{name}->struct_size is {given}, {c_name} is at least {min} bytes"
        )));
    }
    if given > MAX_STRUCT_SIZE {
        return Err(Error::InvalidArgument(format!(
            "{name}->struct_size is {given}, larger than any struct ({MAX_STRUCT_SIZE} bytes \
             at most)"
        )));
    }
    Ok(given)
}

/// The bytes of a caller's input struct that this library knows (at most `size_of::<T>()`),
/// after checking the size and that every byte past them is zero.
///
/// # Safety
/// `p` must be non-NULL and point to `p->struct_size` readable bytes.
unsafe fn known_prefix<'a, T>(
    p: *const T,
    name: &str,
    c_name: &str,
    min: usize,
) -> Result<&'a [u8]> {
    // SAFETY: forwarded from the caller's contract.
    let given = unsafe { struct_size(p, name, c_name, min) }?;
    // SAFETY: the caller promises `given` readable bytes at `p`; `given` is at most
    // `MAX_STRUCT_SIZE`, within `isize` as `from_raw_parts` requires.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), given) };
    let (known, unknown) = bytes.split_at(given.min(size_of::<T>()));
    if unknown.iter().any(|&b| b != 0) {
        return Err(Error::InvalidArgument(format!(
            "{name} sets fields beyond the {} bytes of {c_name} this library knows",
            size_of::<T>()
        )));
    }
    Ok(known)
}

/// Reads a caller's input struct that has had one layout so far: an older, shorter one is
/// refused, a newer, longer one is accepted if the bytes this library does not know are zero.
///
/// # Safety
/// `p` must be non-NULL and point to `p->struct_size` readable bytes, every field of which is
/// valid for the bits C stored in it (so `T` has no `bool`: see [`read_grown`]).
pub unsafe fn read_sized<T: Copy>(p: *const T, name: &str, c_name: &str) -> Result<T> {
    // SAFETY: forwarded from the caller's contract.
    unsafe { known_prefix(p, name, c_name, size_of::<T>()) }?;
    // SAFETY: `p` points to at least a whole struct of this version.
    Ok(unsafe { p.read_unaligned() })
}

/// Reads a caller's input struct of at least `min` bytes (its first published layout): the
/// fields it has over `defaults`, with the `bool` fields at `bools` (byte offsets) read as
/// "non-zero" since C may store any byte in one.
///
/// # Safety
/// `p` must be non-NULL and point to `p->struct_size` readable bytes. Every field of `T` but
/// those at `bools` must be valid for any bits (integers, raw pointers, optional function
/// pointers), and `bools` must list every `bool` field.
pub unsafe fn read_grown<T: Copy>(
    p: *const T,
    name: &str,
    c_name: &str,
    min: usize,
    defaults: T,
    bools: &[usize],
) -> Result<T> {
    // SAFETY: forwarded from the caller's contract.
    let known = unsafe { known_prefix(p, name, c_name, min) }?;
    let mut value = defaults;
    let image = (&raw mut value).cast::<u8>();
    // SAFETY: `known` holds at most `size_of::<T>()` bytes and `value` is a distinct local of
    // that size. Then each listed bool byte (within `value`) is made 0 or 1, which makes the
    // whole valid by the caller's contract.
    unsafe {
        ptr::copy_nonoverlapping(known.as_ptr(), image, known.len());
        for &offset in bools {
            let byte = image.add(offset);
            byte.write(u8::from(byte.read() != 0));
        }
    }
    Ok(value)
}

/// An input struct that grows by the `struct_size` rule, described once so that reading one is
/// a single call, [`read_input`].
///
/// # Safety
/// Every field but those at `BOOLS` must be valid for any bits (integers, raw pointers,
/// optional function pointers), and `BOOLS` must list every `bool` field.
pub unsafe trait GrownInput: Copy {
    /// The struct's name in C, for messages.
    const C_NAME: &'static str;
    /// The size of its first published layout: a smaller `struct_size` is refused.
    const MIN_SIZE: usize;
    /// The byte offsets of its `bool` fields.
    const BOOLS: &'static [usize];
    /// The values of the fields an older caller's struct does not have.
    const DEFAULT: Self;
}

/// [`read_grown`] for a [`GrownInput`] called `name` in messages.
///
/// # Safety
/// `p` must be non-NULL and point to `p->struct_size` readable bytes.
pub unsafe fn read_input<T: GrownInput>(p: *const T, name: &str) -> Result<T> {
    // SAFETY: the caller's contract for `p`, and `T`'s as a `GrownInput` for its fields.
    unsafe { read_grown(p, name, T::C_NAME, T::MIN_SIZE, T::DEFAULT, T::BOOLS) }
}

/// The body of a `kc_*_new` made from one input struct: checks `input` (`name` in messages)
/// and `out` (`out_name`), reads `input` at the caller's size, and hands the caller the box of
/// what `make` makes of it.
///
/// # Safety
/// `input` must be NULL or point to `input->struct_size` readable bytes; `out` NULL or
/// writable.
pub unsafe fn new_from_input<T: GrownInput, O>(
    input: *const T,
    name: &str,
    out: *mut *mut O,
    out_name: &str,
    make: impl FnOnce(T) -> Result<O>,
) -> kc_status {
    guard(|| {
        non_null(input, name)?;
        non_null(out, out_name)?;
        // SAFETY: `input` is non-NULL; its size is the caller's promise.
        let value = make(unsafe { read_input(input, name) }?)?;
        // SAFETY: `out` is non-NULL and writable by contract.
        unsafe { write_boxed(out, value) };
        Ok(())
    })
}

/// Writes `value` (a `repr(C)` struct whose first field is its size) into the caller's struct
/// of `out->struct_size` bytes, at least `min`: as many bytes as both sides know, with
/// `struct_size` set to that count. A NULL `out` is `KC_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `out` must be NULL or point to a writable struct of at least its `struct_size` bytes;
/// `T` must have no padding before the bytes written.
pub unsafe fn write_sized<T: Copy>(
    out: *mut T,
    value: T,
    name: &str,
    c_name: &str,
    min: usize,
) -> Result<()> {
    non_null(out, name)?;
    // SAFETY: forwarded from the caller's contract.
    let given = unsafe { struct_size(out.cast_const(), name, c_name, min) }?;
    let n = given.min(size_of::<T>());
    // SAFETY: `value` is a local of `size_of::<T>()` bytes and `out` has at least `given`
    // writable bytes; the regions are distinct.
    unsafe {
        ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), out.cast::<u8>(), n);
        out.cast::<usize>().write_unaligned(n);
    }
    Ok(())
}

/// Borrows a NUL-terminated UTF-8 argument.
///
/// # Safety
/// `text` must be non-NULL and a C string that outlives `'a`.
pub unsafe fn c_str<'a>(text: *const c_char, name: &str) -> Result<&'a str> {
    // SAFETY: a C string by the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| Error::InvalidArgument(format!("{name} is not valid UTF-8")))
}

/// A C string argument as a path; NULL is `None`.
///
/// # Safety
/// `text` must be NULL or a C string.
pub unsafe fn optional_path(text: *const c_char, name: &str) -> Result<Option<PathBuf>> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, hence a C string by the caller's contract.
    Ok(Some(PathBuf::from(unsafe { c_str(text, name) }?)))
}

/// Borrows `count` elements at `ptr` (which may be NULL when `count` is 0).
///
/// # Safety
/// When `count > 0`, `ptr` must be NULL or point to `count` readable elements that outlive
/// `'a`.
pub unsafe fn elements<'a, T>(ptr: *const T, count: usize, name: &str) -> Result<&'a [T]> {
    if count == 0 {
        return Ok(&[]);
    }
    non_null(ptr, name)?;
    if count > isize::MAX as usize / size_of::<T>().max(1) {
        return Err(Error::InvalidArgument(format!(
            "{name}: count {count} is too large"
        )));
    }
    // SAFETY: non-NULL, `count` readable elements by contract, size checked above.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// A C string argument naming a directory, as a path: NULL is `None`, the empty string is
/// refused. Any bytes but NUL are allowed, as in any Unix path.
///
/// # Safety
/// `dir` must be NULL or a C string.
pub unsafe fn dir_arg(dir: *const c_char, name: &str) -> Result<Option<PathBuf>> {
    if dir.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, hence a C string by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(dir) }.to_bytes();
    if bytes.is_empty() {
        return Err(Error::InvalidArgument(format!("{name} is an empty string")));
    }
    Ok(Some(PathBuf::from(OsStr::from_bytes(bytes))))
}

/// An operator key argument: NULL with `key_len` 0 is no key; NULL with a length is refused
/// (it would otherwise silently open unkeyed). The bytes are copied once, into the key, which
/// wipes them when dropped; nothing else holds a copy.
///
/// # Safety
/// `key` must be NULL or point to `key_len` readable bytes.
pub unsafe fn operator_key_arg(
    key: *const u8,
    key_len: usize,
    name: &str,
) -> Result<Option<OperatorKey>> {
    if key.is_null() && key_len == 0 {
        return Ok(None);
    }
    // The length before the bytes: a key of the wrong length is refused unread and uncopied.
    if !(MIN_OPERATOR_KEY_LEN..=MAX_OPERATOR_KEY_LEN).contains(&key_len) {
        return Err(invalid(format!(
            "{name}: an operator key must be {MIN_OPERATOR_KEY_LEN} to {MAX_OPERATOR_KEY_LEN} \
             bytes, got {key_len}"
        )));
    }
    // SAFETY: the caller promises `key_len` readable bytes; NULL is refused inside.
    let bytes = unsafe { byte_slice(key, key_len, name) }?;
    OperatorKey::new(bytes).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_grown_normalises_bools_and_defaults_missing_fields() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Grown {
            struct_size: usize,
            flag: bool,
            added: u64,
        }
        // What C may store: a bool byte of 2, and an older caller's size ending before `added`.
        let mut raw = [0u8; size_of::<Grown>()];
        let older = std::mem::offset_of!(Grown, added);
        raw[..size_of::<usize>()].copy_from_slice(&older.to_ne_bytes());
        raw[std::mem::offset_of!(Grown, flag)] = 2;
        // Past the older caller's size: never read.
        raw[older] = 0xff;
        let defaults = Grown {
            struct_size: 0,
            flag: false,
            added: 42,
        };
        // SAFETY: `raw` holds the struct's bytes; `flag` is the only bool.
        let read = unsafe {
            read_grown(
                raw.as_ptr().cast::<Grown>(),
                "g",
                "grown",
                std::mem::offset_of!(Grown, flag) + 1,
                defaults,
                &[std::mem::offset_of!(Grown, flag)],
            )
        }
        .unwrap();
        assert!(read.flag);
        assert_eq!(read.added, 42);
    }
}
