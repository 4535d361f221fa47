//! Where a compiler looks for the files a source names, and the macros a computed `#include`
//! expands with: the directories of its `-I` options and its `-D`/`-U` options, read from the
//! build options as the OpenCL and NVRTC compilers read them.

use super::Unknowable;

/// What a build's options tell its preprocessor about the files it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Search {
    /// The `-I` directories, in order.
    pub dirs: Vec<String>,
    /// The `-D` and `-U` options, in order.
    pub defines: Vec<Define>,
}

/// One `-D` or `-U` option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Define {
    /// `-D NAME`, `-D NAME=BODY`, `-D NAME(PARAMS)=BODY`, as written after `-D`.
    Set(String),
    /// `-U NAME`.
    Unset(String),
}

/// What an OpenCL build-options string (blank-separated, a double-quoted part kept whole)
/// tells the preprocessor. Fails on an option that makes the compiler read a file kcache
/// does not follow (`-include`, `-imacros`, `-isystem`, `@file`, …): keyed by its text alone,
/// a change of that file would not change the key.
pub(crate) fn opencl_search(options: &str) -> Result<Search, Unknowable> {
    // The common case: no option that could name a file or a macro.
    if !options.contains("-I")
        && !options.contains("-i")
        && !options.contains('@')
        && !options.contains("-D")
        && !options.contains("-U")
    {
        return Ok(Search::default());
    }
    let words = split(options);
    search(words.iter().map(String::as_str))
}

/// What NVRTC's options, one argument each (`-I dir`, `-Idir`, `--include-path=dir`,
/// `--include-path dir`, and the same spellings of `-D`/`--define-macro` and
/// `-U`/`--undefine-macro`), tell the preprocessor.
pub(crate) fn nvrtc_search(options: &[&str]) -> Result<Search, Unknowable> {
    search(options.iter().copied())
}

/// The spellings of the options that take a value: `(short, long, what)`.
const VALUED: [(&str, &str, Kind); 3] = [
    ("-I", "--include-path", Kind::Dir),
    ("-D", "--define-macro", Kind::Set),
    ("-U", "--undefine-macro", Kind::Unset),
];

#[derive(Clone, Copy)]
enum Kind {
    Dir,
    Set,
    Unset,
}

fn search<'a>(words: impl Iterator<Item = &'a str>) -> Result<Search, Unknowable> {
    let mut found = Search::default();
    let mut words = words.peekable();
    'words: while let Some(word) = words.next() {
        for (short, long, kind) in VALUED {
            let joined = word
                .strip_prefix(long)
                .map(|rest| rest.strip_prefix('=').unwrap_or(rest))
                .or_else(|| word.strip_prefix(short));
            let value = match joined {
                None => continue,
                Some("") => words
                    .next()
                    .map(str::to_string)
                    .ok_or_else(|| Unknowable::new(format!("the option {word} without a value")))?,
                Some(value) => value.to_string(),
            };
            match kind {
                Kind::Dir => found
                    .dirs
                    .push(value.strip_prefix('=').unwrap_or(&value).to_string()),
                Kind::Set => found.defines.push(Define::Set(value)),
                Kind::Unset => found.defines.push(Define::Unset(value)),
            }
            continue 'words;
        }
        if reads_files(word) {
            return Err(Unknowable::new(format!(
                "the build option {word}, which reads files kcache does not follow"
            )));
        }
    }
    Ok(found)
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
            opencl_search("-cl-fast-relaxed-math -DN=4 -w")
                .unwrap()
                .dirs
                .is_empty()
        );
        assert_eq!(opencl_search("").unwrap(), Search::default());
    }

    #[test]
    fn every_spelling_of_a_directory_in_order() {
        assert_eq!(
            opencl_search("-I one -Itwo -DX=1 -I \"three dir\" -I\"four\"")
                .unwrap()
                .dirs,
            ["one", "two", "three dir", "four"]
        );
        assert_eq!(
            nvrtc_search(&[
                "-I",
                "a",
                "-Ib",
                "--include-path=c",
                "--include-path",
                "d",
                "-arch=sm_90"
            ])
            .unwrap()
            .dirs,
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
            assert!(opencl_search(options).is_err(), "{options:?} was keyed");
        }
        assert!(nvrtc_search(&["--pre-include=p.h"]).is_err());
    }

    #[test]
    fn every_spelling_of_a_macro_in_order() {
        use Define::{Set, Unset};
        let set = |text: &str| Set(text.to_string());
        assert_eq!(
            opencl_search("-DA -D B=2 -D \"M2S(x)=#x\" -UA -U C -cl-mad-enable")
                .unwrap()
                .defines,
            [
                set("A"),
                set("B=2"),
                set("M2S(x)=#x"),
                Unset("A".into()),
                Unset("C".into())
            ]
        );
        assert_eq!(
            nvrtc_search(&[
                "--define-macro=X=1",
                "--define-macro",
                "Y",
                "-DZ",
                "-U",
                "X"
            ])
            .unwrap()
            .defines,
            [set("X=1"), set("Y"), set("Z"), Unset("X".into())]
        );
        assert!(opencl_search("-D").is_err(), "-D without a macro");
    }
}
