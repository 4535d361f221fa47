//! Where a compiler looks for the files a source names: the directories of its `-I` options,
//! read from the build options as the OpenCL and NVRTC compilers read them.

use super::Unknowable;

/// The `-I` directories of an OpenCL build-options string (blank-separated, a double-quoted
/// part kept whole), in order. Fails on an option that makes the compiler read a file kcache
/// does not follow (`-include`, `-imacros`, `-isystem`, `@file`, …): keyed by its text alone,
/// a change of that file would not change the key.
pub(crate) fn opencl_dirs(options: &str) -> Result<Vec<String>, Unknowable> {
    // The common case: no option that could name a file.
    if !options.contains("-I") && !options.contains("-i") && !options.contains('@') {
        return Ok(Vec::new());
    }
    let words = split(options);
    dirs(words.iter().map(String::as_str))
}

/// The `-I` directories of NVRTC's options, one argument each (`-I dir`, `-Idir`,
/// `--include-path=dir`, `--include-path dir`).
pub(crate) fn nvrtc_dirs(options: &[&str]) -> Result<Vec<String>, Unknowable> {
    dirs(options.iter().copied())
}

fn dirs<'a>(words: impl Iterator<Item = &'a str>) -> Result<Vec<String>, Unknowable> {
    let mut dirs = Vec::new();
    let mut words = words.peekable();
    while let Some(word) = words.next() {
        let joined = word
            .strip_prefix("-I")
            .or_else(|| word.strip_prefix("--include-path="));
        let dir = match joined {
            Some("") | None if word == "-I" || word == "--include-path" => words
                .next()
                .map(str::to_string)
                .ok_or_else(|| Unknowable::new(format!("the option {word} without a directory")))?,
            Some(dir) => dir.strip_prefix('=').unwrap_or(dir).to_string(),
            None if reads_files(word) => {
                return Err(Unknowable::new(format!(
                    "the build option {word}, which reads files kcache does not follow"
                )));
            }
            None => continue,
        };
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Options of clang, GCC and NVRTC that make the compiler read a file or search a directory
/// other than through `-I`.
fn reads_files(word: &str) -> bool {
    const PREFIXES: [&str; 9] = [
        "-include",
        "-imacros",
        "-isystem",
        "-iquote",
        "-idirafter",
        "-iprefix",
        "-isysroot",
        "--pre-include",
        "--system-include",
    ];
    word.starts_with('@') || PREFIXES.iter().any(|prefix| word.starts_with(prefix))
}

/// Blank-separated words; a double-quoted part (`-I "a dir"`) is kept whole, its quotes
/// dropped.
fn split(options: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut started = false;
    for c in options.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                started = true;
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_without_directories_give_none() {
        assert!(
            opencl_dirs("-cl-fast-relaxed-math -DN=4 -w")
                .unwrap()
                .is_empty()
        );
        assert!(opencl_dirs("").unwrap().is_empty());
    }

    #[test]
    fn every_spelling_of_a_directory_in_order() {
        assert_eq!(
            opencl_dirs("-I one -Itwo -DX=1 -I \"three dir\" -I\"four\"").unwrap(),
            ["one", "two", "three dir", "four"]
        );
        assert_eq!(
            nvrtc_dirs(&[
                "-I",
                "a",
                "-Ib",
                "--include-path=c",
                "--include-path",
                "d",
                "-arch=sm_90"
            ])
            .unwrap(),
            ["a", "b", "c", "d"]
        );
    }

    #[test]
    fn options_that_read_other_files_are_unknowable() {
        for options in [
            "-include pre.h",
            "-imacros m.h",
            "-isystem sys",
            "-iquote q",
            "@opts.txt",
            "-I",
        ] {
            assert!(opencl_dirs(options).is_err(), "{options:?} was keyed");
        }
        assert!(nvrtc_dirs(&["--pre-include=p.h"]).is_err());
    }
}
