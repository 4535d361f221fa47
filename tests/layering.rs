//! The persistent tiers' layering, checked in the sources: the disk tier knows nothing of
//! what sits behind it. The chain (`src/persistence`) composes the disk tier and the shared
//! stores; the disk tier is told of entries through its `Behind` interface only, so a new
//! store never goes inside it.

use std::path::Path;

/// Every line of `src/disk` that holds one of `words` (ignoring case), comments included
/// unless `code_only`.
fn disk_lines_naming(words: &[&str], code_only: bool) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/disk");
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() > 10, "src/disk has its modules: {files:?}");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            let comment = line.trim_start().starts_with("//");
            if !(code_only && comment) && words.iter().any(|w| lower.contains(w)) {
                found.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    found
}

#[test]
fn the_disk_tier_names_no_store_behind_it() {
    let found = disk_lines_naming(&["remote", "redis", "object_store", "s3"], false);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_disk_tier_imports_neither_the_chain_nor_a_store() {
    let words = [
        "crate::persistence",
        "crate::remote",
        "crate::tiered",
        "crate::object_store",
    ];
    let found = disk_lines_naming(&words, true);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
