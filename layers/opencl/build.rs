//! Exports only the layer's two entry points. A cdylib exports every `#[no_mangle]` function
//! of the crates it links, so the layer would also export the kcache library's C API (`kc_*`):
//! not the layer's interface, and a second copy of it, with state of its own, for the dynamic
//! linker to bind a process's `kc_*` calls to. The kcache crate reaches the linker as an archive (its rlib): `--exclude-libs ALL`
//! keeps every symbol of an archive out of the dynamic symbol table, and this crate's own
//! two functions are all that remain. ELF linkers (GNU ld, gold, lld) have the option.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let vendor = std::env::var("CARGO_CFG_TARGET_VENDOR").unwrap_or_default();
    if os != "windows" && vendor != "apple" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--exclude-libs,ALL");
    }
}
