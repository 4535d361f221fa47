//! `kc_key_builder`: key derivation through the C ABI. Keys cross the boundary as
//! `KC_KEY_LEN` (32) raw bytes.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ptr;

use super::args::{Handle, free_handle, handle_mut, handle_ref, invalid, new_handle};
use super::status::{byte_slice, guard, guard_value, kc_status, non_null};
use crate::Result;
use crate::key::{Field, KEY_LEN, Key, KeyBuilder};

/// Length of a cache key in bytes.
pub const KC_KEY_LEN: usize = 32;

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
    _opaque: [u8; 0],
}

impl Handle for kc_key_builder {
    type Rust = KeyBuilder;
}

/// Reads a 32-byte key.
///
/// # Safety
/// `key` must be NULL or point to `KC_KEY_LEN` readable bytes.
pub(super) unsafe fn key_arg(key: *const u8) -> Result<Key> {
    non_null(key, "key")?;
    // SAFETY: non-NULL and the caller promises `KC_KEY_LEN` readable bytes.
    Ok(Key::from_bytes(unsafe {
        ptr::read_unaligned(key.cast::<[u8; KEY_LEN]>())
    }))
}

/// Creates an empty key builder.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_new(out_builder: *mut *mut kc_key_builder) -> kc_status {
    guard(|| {
        non_null(out_builder, "out_builder")?;
        // SAFETY: non-NULL and writable by contract.
        unsafe { new_handle(out_builder, KeyBuilder::new()) };
        Ok(())
    })
}

/// Sets one field (`KC_KEY_BACKEND` … `KC_KEY_SOURCE`), replacing an earlier value. An
/// unset field differs from an empty one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_set(
    builder: *mut kc_key_builder,
    field: u32,
    bytes: *const u8,
    len: usize,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live builder, used by one thread at a time by contract.
        let builder = unsafe { handle_mut(builder, "builder") }?;
        let field = Field::from_index(field)
            .ok_or_else(|| invalid(format!("unknown key field {field}")))?;
        // SAFETY: the caller promises `len` readable bytes.
        builder.set(field, unsafe { byte_slice(bytes, len, "bytes") }?);
        Ok(())
    })
}

/// Adds a build option (a flag has an empty value). Options are sorted by name, so their
/// order does not matter; the same name twice makes `kc_key_builder_finish` fail. Sorting is
/// safe only for options whose effect does not depend on their position: each named once, none
/// overriding or extending another. Options that interact by position (`-DX=1` with `-UX`,
/// `-O2` with `-O0`, `-I` search paths, `-include`) go through
/// `kc_key_builder_ordered_option`; when in doubt, pass the whole command line that way.
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
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_ordered_option(
    builder: *mut kc_key_builder,
    argument: *const u8,
    argument_len: usize,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live builder, used by one thread at a time by contract.
        let builder = unsafe { handle_mut(builder, "builder") }?;
        // SAFETY: the caller promises `argument_len` readable bytes.
        builder.ordered_option(unsafe { byte_slice(argument, argument_len, "argument") }?);
        Ok(())
    })
}

/// Adds a file the compiler reads besides the source (a header the source `#include`s, a
/// precompiled module): `name` as the compiler resolves it, `contents` its bytes. kcache never
/// reads files itself, so a header not added here can change without changing the key. Sorted
/// by name; the same name twice makes `kc_key_builder_finish` fail.
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
    // SAFETY: NULL or a live builder, used by one thread at a time by contract.
    let builder = unsafe { handle_mut(builder, "builder") }?;
    // SAFETY: the caller promises readable bytes of the given lengths.
    let (name, value) = unsafe {
        (
            byte_slice(name, name_len, "name")?,
            byte_slice(value, value_len, "value")?,
        )
    };
    add(builder, name, value);
    Ok(())
}

/// Derives the key into `out_key` (`KC_KEY_LEN` bytes). The builder stays usable.
/// `KC_ERR_INVALID_ARGUMENT` for a duplicate option, extra or dependency name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_finish(
    builder: *const kc_key_builder,
    out_key: *mut u8,
) -> kc_status {
    guard(|| {
        // SAFETY: NULL or a live builder; only read.
        let builder = unsafe { handle_ref(builder, "builder") }?;
        non_null(out_key, "out_key")?;
        let key = builder.finish()?;
        // SAFETY: `out_key` has `KC_KEY_LEN` writable bytes by contract.
        unsafe { ptr::copy_nonoverlapping(key.as_bytes().as_ptr(), out_key, KEY_LEN) };
        Ok(())
    })
}

/// Frees a builder.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_key_builder_free(builder: *mut kc_key_builder) {
    // SAFETY: the caller hands back the builder from `kc_key_builder_new`, or NULL.
    guard_value((), || unsafe { free_handle(builder) });
}
