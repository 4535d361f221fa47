//! The reader on real files. Paths are absolute: the working directory is the process's, shared
//! by tests running at once (the layer's tests cover names relative to it, in processes of
//! their own).

use super::*;

struct Tree(tempfile::TempDir);

impl Tree {
    fn new(files: &[(&str, &str)]) -> Tree {
        let tree = Tree(tempfile::tempdir().unwrap());
        for (name, text) in files {
            tree.write(name, text);
        }
        tree
    }

    fn path(&self, name: &str) -> String {
        self.0.path().join(name).to_string_lossy().into_owned()
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.0.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

fn in_dirs(dirs: &[String]) -> Search {
    Search {
        dirs: dirs.to_vec(),
        defines: Vec::new(),
    }
}

fn read(source: &str, dirs: &[String]) -> Headers {
    Headers::read(&[source], &in_dirs(dirs), &[]).unwrap()
}

#[test]
fn a_source_without_includes_reads_nothing() {
    assert!(read("__kernel void k() {}", &[]).is_empty());
}

#[test]
fn a_changed_header_changes_the_digest() {
    let tree = Tree::new(&[("inc/h.h", "#define VAL 1\n")]);
    let dirs = [tree.path("inc")];
    let before = read("#include <h.h>\n", &dirs);
    assert!(!before.is_empty());
    assert_eq!(read("#include <h.h>\n", &dirs), before);
    tree.write("inc/h.h", "#define VAL 2\n");
    assert_ne!(read("#include <h.h>\n", &dirs).digest(), before.digest());
}

#[test]
fn a_nested_header_is_found_beside_the_one_that_includes_it() {
    let tree = Tree::new(&[
        ("inc/h.h", "#include \"inner.h\"\n"),
        ("inc/inner.h", "#define INNER 1\n"),
    ]);
    let dirs = [tree.path("inc")];
    let before = read("#include \"h.h\"\n", &dirs).digest();
    tree.write("inc/inner.h", "#define INNER 2\n");
    assert_ne!(read("#include \"h.h\"\n", &dirs).digest(), before);
}

#[test]
fn a_header_appearing_earlier_on_the_search_path_changes_the_digest() {
    let tree = Tree::new(&[("b/h.h", "#define VAL 1\n")]);
    let dirs = [tree.path("a"), tree.path("b")];
    let before = read("#include <h.h>\n", &dirs).digest();
    tree.write("a/h.h", "#define VAL 1\n");
    assert_ne!(read("#include <h.h>\n", &dirs).digest(), before);
}

#[test]
fn an_absolute_include_is_read() {
    let tree = Tree::new(&[("abs.h", "#define VAL 1\n")]);
    let source = format!("#include \"{}\"\n", tree.path("abs.h"));
    let before = read(&source, &[]).digest();
    tree.write("abs.h", "#define VAL 3\n");
    assert_ne!(read(&source, &[]).digest(), before);
}

#[test]
fn a_probe_of_an_absent_file_is_keyed_by_its_absence() {
    let tree = Tree::new(&[]);
    let dirs = [tree.path("inc")];
    let probe_only = "#if __has_include(<opt.h>)\n#define HAVE 1\n#endif\n";
    let absent = read(probe_only, &dirs).digest();
    tree.write("inc/opt.h", "\n");
    assert_ne!(read(probe_only, &dirs).digest(), absent);
}

#[test]
fn a_header_found_nowhere_is_keyed_by_every_absence() {
    // The compiler's own header, or a directive in a branch not compiled (hashcat's
    // `#include <metal_stdlib>` under `#if defined IS_METAL`).
    let tree = Tree::new(&[]);
    let dirs = [tree.path("inc")];
    let source = "#if defined IS_METAL\n#include <nowhere-kcache-test.h>\n#endif\n";
    let nowhere = read(source, &dirs);
    let places: Vec<&str> = nowhere.places.iter().map(|(p, _)| p.as_str()).collect();
    for place in [
        tree.path("inc/nowhere-kcache-test.h").as_str(),
        "nowhere-kcache-test.h",
        "/usr/local/include/nowhere-kcache-test.h",
        "/usr/include/nowhere-kcache-test.h",
    ] {
        assert!(places.contains(&place), "{place} in {places:?}");
    }
    assert!(
        nowhere
            .places
            .iter()
            .all(|(_, state)| *state == State::Absent)
    );
    tree.write("inc/nowhere-kcache-test.h", "#define IS 1\n");
    assert_ne!(read(source, &dirs).digest(), nowhere.digest());
}

#[test]
fn a_header_that_includes_itself_is_read_once() {
    let tree = Tree::new(&[("inc/loop.h", "#pragma once\n#include \"loop.h\"\n")]);
    let headers = read("#include <loop.h>\n", &[tree.path("inc")]);
    let files = headers
        .places
        .iter()
        .filter(|(_, state)| matches!(state, State::File(_)))
        .count();
    assert_eq!(files, 1, "{headers:?}");
}

#[test]
fn embedded_headers_are_found_by_name_and_keyed_by_text() {
    let one = [Embedded {
        name: "e.h",
        text: "#define E 1\n",
    }];
    let two = [Embedded {
        name: "e.h",
        text: "#define E 2\n",
    }];
    let source = ["#include \"e.h\"\n"];
    let first = Headers::read(&source, &Search::default(), &one).unwrap();
    assert_ne!(
        Headers::read(&source, &Search::default(), &two).unwrap(),
        first
    );
    assert_eq!(
        Headers::read(&source, &Search::default(), &one).unwrap(),
        first
    );
}

#[test]
fn the_key_changes_with_a_header() {
    let tree = Tree::new(&[("inc/h.h", "#define VAL 1\n")]);
    let dirs = [tree.path("inc")];
    let key = |headers: &Headers| {
        let mut builder = KeyBuilder::new();
        builder.source("#include <h.h>\n");
        headers.add_to(&mut builder);
        builder.finish().unwrap()
    };
    let before = key(&read("#include <h.h>\n", &dirs));
    tree.write("inc/h.h", "#define VAL 2\n");
    assert_ne!(key(&read("#include <h.h>\n", &dirs)), before);
}

#[test]
fn a_header_that_is_a_named_pipe_is_unknowable() {
    let tree = Tree::new(&[]);
    let pipe = tree.path("pipe.h");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .unwrap()
            .success()
    );
    let source = format!("#include \"{pipe}\"\n");
    let error = Headers::read(&[&source], &Search::default(), &[]).unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

/// hashcat's way: `#include M2S(INCLUDE_PATH/name)` with the macros from `-D` options.
fn hashcat_style(tree: &Tree, extra: &str) -> Result<Headers, Unknowable> {
    let options = format!(
        "-D INCLUDE_PATH={} -D XM2S(x)=#x -D M2S(x)=XM2S(x) {extra}",
        tree.path("OpenCL")
    );
    let source = "#ifdef KERNEL_STATIC\n#include M2S(INCLUDE_PATH/inc_vendor.h)\n#endif\n";
    Headers::read(&[source], &opencl_search(&options)?, &[])
}

#[test]
fn a_computed_include_is_expanded_with_the_options_macros_and_keyed() {
    let tree = Tree::new(&[
        (
            "OpenCL/inc_vendor.h",
            "#include M2S(INCLUDE_PATH/inc_types.h)\n",
        ),
        ("OpenCL/inc_types.h", "typedef int u32x;\n"),
    ]);
    let before = hashcat_style(&tree, "").unwrap();
    let files = |headers: &Headers| -> Vec<String> {
        headers
            .places
            .iter()
            .filter(|(_, state)| matches!(state, State::File(_)))
            .map(|(place, _)| place.clone())
            .collect()
    };
    assert_eq!(
        files(&before),
        [
            tree.path("OpenCL/inc_vendor.h"),
            tree.path("OpenCL/inc_types.h")
        ]
    );
    tree.write("OpenCL/inc_types.h", "typedef uint u32x;\n");
    assert_ne!(hashcat_style(&tree, "").unwrap().digest(), before.digest());
}

#[test]
fn a_computed_include_whose_macros_a_file_defines_is_unknowable() {
    let tree = Tree::new(&[(
        "OpenCL/inc_vendor.h",
        "#undef INCLUDE_PATH\n#define INCLUDE_PATH /elsewhere\n",
    )]);
    let error = hashcat_style(&tree, "").unwrap_err();
    assert!(error.to_string().contains("INCLUDE_PATH"), "{error}");
    // Without the options' macros the operand names no file.
    let source = "#include M2S(INCLUDE_PATH/inc_vendor.h)\n";
    assert!(Headers::read(&[source], &Search::default(), &[]).is_err());
    // -U takes a macro away again.
    let tree = Tree::new(&[("OpenCL/inc_vendor.h", "\n")]);
    assert!(hashcat_style(&tree, "").is_ok());
    assert!(hashcat_style(&tree, "-U M2S").is_err());
}
