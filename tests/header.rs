//! `include/kcache.h` is generated from the sources by cbindgen (with `cbindgen.toml`), never
//! edited by hand: this checks that the committed header is what cbindgen generates now.
//! Regenerate it with `KCACHE_WRITE_HEADER=1 cargo test --test header` (or, with the cbindgen
//! command of the same version, `cbindgen --config cbindgen.toml --crate kcache --output
//! include/kcache.h`).

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(root)
        .with_config(config)
        .generate()
        .expect("cbindgen could not generate the header")
        .write(&mut generated);
    let path = root.join("include/kcache.h");
    if std::env::var_os("KCACHE_WRITE_HEADER").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("writing include/kcache.h");
    }
    let committed = std::fs::read(&path).expect("include/kcache.h");
    assert!(
        generated == committed,
        "include/kcache.h is not what cbindgen generates from the sources: regenerate it with \
         `KCACHE_WRITE_HEADER=1 cargo test --test header` and commit it"
    );
}

/// The C API 3.0 target: a header at least a quarter shorter than 2.x's 1796 lines. Its doc
/// comments say once what the preamble, the docs pages or another item already say.
#[test]
fn the_header_stays_a_quarter_shorter_than_2x() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kcache.h");
    let text = std::fs::read_to_string(path).expect("include/kcache.h");
    let lines = text.lines().count();
    assert!(
        lines <= 1796 * 3 / 4,
        "include/kcache.h has {lines} lines, more than 1347"
    );
}
