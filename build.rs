//! Gives the shared library its SONAME from the C ABI version in `Cargo.toml`
//! (`[package.metadata.kcache] abi-version`), which is kept apart from the crate version: the crate
//! version follows the Rust API, the ABI version follows `include/kcache.h`.
//!
//! Only when the CMake build asks for it, by setting `KCACHE_SONAME` to the name it installs
//! (`libkcache.so.MAJOR`, checked here against `abi-version`). A plain `cargo build` leaves the
//! SONAME out: cargo writes only `libkcache.so`, and a program linked against a library whose
//! SONAME is `libkcache.so.MAJOR` asks the dynamic loader for that file, which cargo's output
//! directory never has. Without a SONAME the program asks for `libkcache.so` and finds it through
//! its rpath or `LD_LIBRARY_PATH`. The installed library, which CMake stages and names, keeps the
//! SONAME that versioned installs need.
//!
//! Exports need no version script of ours: rustc links every cdylib with its own, which exports
//! exactly the crate's `#[no_mangle]` functions and hides everything else, std included. GNU ld
//! lets the exact names in that script win over any pattern in a second one, so a second script
//! could neither narrow nor version that list. That every export is a `kc_*` function is checked
//! on the built library instead (`cmake/check-library.cmake`, run by the CMake build and the
//! packaging tests).

use std::env;
use std::fs;
use std::path::Path;

fn main() {
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let manifest = Path::new(&manifest_dir).join("Cargo.toml");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", manifest.display());

    let text = fs::read_to_string(&manifest).expect("read Cargo.toml");
    let abi = abi_version(&text).unwrap_or_else(|why| panic!("Cargo.toml: {why}"));
    let major = abi.split('.').next().expect("validated above");
    // The header's KCACHE_VERSION_* macros and `kc_version()` are checked against these.
    println!("cargo:rustc-env=KCACHE_ABI_VERSION={abi}");
    for (part, value) in ["MAJOR", "MINOR", "PATCH"].iter().zip(abi.split('.')) {
        println!("cargo:rustc-env=KCACHE_ABI_VERSION_{part}={value}");
    }

    println!("cargo:rerun-if-env-changed=KCACHE_SONAME");
    let soname = format!("libkcache.so.{major}");
    match env::var("KCACHE_SONAME") {
        Ok(asked) if asked == soname => {
            if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
                println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
            }
        }
        Ok(asked) => panic!("KCACHE_SONAME={asked}, but abi-version {abi} gives {soname}"),
        Err(_) => {}
    }
}

/// Reads `abi-version = "MAJOR.MINOR.PATCH"` from the `[package.metadata.kcache]` table.
fn abi_version(manifest: &str) -> Result<String, String> {
    let mut in_table = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == "[package.metadata.kcache]";
            continue;
        }
        let Some(value) = line
            .strip_prefix("abi-version")
            .and_then(|rest| rest.trim_start().strip_prefix('='))
        else {
            continue;
        };
        if !in_table {
            continue;
        }
        let value = value.trim().trim_matches('"');
        let parts: Vec<&str> = value.split('.').collect();
        if parts.len() != 3
            || parts
                .iter()
                .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("abi-version {value:?} is not MAJOR.MINOR.PATCH"));
        }
        return Ok(value.to_owned());
    }
    Err("no abi-version in [package.metadata.kcache]".to_owned())
}
