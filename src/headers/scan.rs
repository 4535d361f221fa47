//! Which files a source names to the preprocessor: its `#include` directives (and
//! `#include_next`, `#import`) and its `__has_include` probes, read the way the preprocessor
//! reads them (lines spliced at a backslash-newline, comments gone, strings kept whole).
//!
//! A computed include (`#include MACRO(...)`) is returned as written, for [`super::macros`] to
//! expand; the names every `#define` and `#undef` defines are returned too, since such a file
//! changes what an expansion with the options' macros alone would give.
//!
//! The scan does not evaluate conditionals: a directive inside `#if 0` counts too, so the
//! files it finds are a superset of those a build reads, which keys a binary by a header it did
//! not read (a needless miss) but never leaves out one it did (a stale kernel).

use super::Unknowable;

/// One file a source names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    /// As written between the quotes or angle brackets.
    pub name: String,
    /// A `__has_include` probe: a build reads nothing when the file is absent, so an absent
    /// file is an input (its absence) rather than an unknown.
    pub probe: bool,
    /// `name` is a computed operand, macros to expand, not a name.
    pub computed: bool,
}

/// What a scan of one text found.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub named: Vec<Named>,
    /// The names of its `#define` and `#undef` directives.
    pub defined: Vec<String>,
}

/// Whether `text` may name a file: the common case costs a few substring searches, as a
/// source that never writes `include` or `embed` (nor splits a line, which could split the
/// word) names none.
pub(super) fn may_name_files(text: &str) -> bool {
    text.contains("include") || text.contains("embed") || text.contains('\\')
}

/// The files `text` names and the macros it defines. Fails on `#embed`, and on an operand that
/// cannot be a name (an unterminated quote).
pub(super) fn named(text: &str) -> Result<Scan, Unknowable> {
    let mut found = Scan::default();
    if !may_name_files(text) && !text.contains("define") && !text.contains("undef") {
        return Ok(found);
    }
    let clean = without_comments(&spliced(text));
    for line in clean.lines() {
        if let Some(rest) = directive(line) {
            let (word, rest) = identifier(rest);
            match word {
                "include" | "include_next" | "import" => {
                    found.named.push(operand(word, rest)?);
                    continue;
                }
                "define" | "undef" => {
                    let (name, _) = identifier(rest.trim_start());
                    found.defined.push(name.to_string());
                }
                "embed" => {
                    return Err(Unknowable::new(format!("#embed {}", rest.trim())));
                }
                _ => {}
            }
        }
        probes(line, &mut found.named)?;
    }
    Ok(found)
}

/// What `#WORD REST` names: a written-out name, or the operand to expand.
fn operand(word: &str, rest: &str) -> Result<Named, Unknowable> {
    if let Some((name, _)) = quoted_name(rest) {
        return Ok(Named {
            name,
            probe: false,
            computed: false,
        });
    }
    let rest = rest.trim();
    if rest.is_empty() || rest.starts_with(['"', '<']) {
        return Err(Unknowable::new(format!(
            "#{word} of a name that is not written out ({rest})"
        )));
    }
    Ok(Named {
        name: rest.to_string(),
        probe: false,
        computed: true,
    })
}

/// The text of `line` after its `#` (or the digraph `%:`), if it is a directive.
fn directive(line: &str) -> Option<&str> {
    let line = line.trim_start();
    line.strip_prefix('#')
        .or_else(|| line.strip_prefix("%:"))
        .map(str::trim_start)
}

fn identifier(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    text.split_at(end)
}

/// `"name"` or `<name>` at the start of `text` (after blanks), and what follows it.
fn quoted_name(text: &str) -> Option<(String, &str)> {
    let text = text.trim_start();
    let close = match text.chars().next()? {
        '"' => '"',
        '<' => '>',
        _ => return None,
    };
    let body = &text[1..];
    let end = body.find(close)?;
    Some((body[..end].to_string(), &body[end + 1..]))
}

/// Adds the `__has_include` (and `__has_include_next`) probes of `line` to `found`.
fn probes(line: &str, found: &mut Vec<Named>) -> Result<(), Unknowable> {
    const PROBE: &str = "__has_include";
    let mut rest = line;
    while let Some(at) = rest.find(PROBE) {
        let after = &rest[at + PROBE.len()..];
        let after = after.strip_prefix("_next").unwrap_or(after);
        let unknowable = || {
            Unknowable::new(format!(
                "__has_include of a name that is not written out ({})",
                line.trim()
            ))
        };
        let argument = after
            .trim_start()
            .strip_prefix('(')
            .ok_or_else(unknowable)?;
        if let Some((name, tail)) = quoted_name(argument) {
            found.push(Named {
                name,
                probe: true,
                computed: false,
            });
            rest = tail;
            continue;
        }
        // A computed probe: its operand runs to the parenthesis that closes the call.
        let mut depth = 0usize;
        let close = argument
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map(|(at, _)| at)
            .ok_or_else(unknowable)?;
        let operand = argument[..close].trim();
        if operand.is_empty() || operand.starts_with(['"', '<']) {
            return Err(unknowable());
        }
        found.push(Named {
            name: operand.to_string(),
            probe: true,
            computed: true,
        });
        rest = &argument[close + 1..];
    }
    Ok(())
}

/// `text` with every backslash-newline removed (translation phase 2).
fn spliced(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('\\') {
        return text.into();
    }
    text.replace("\\\r\n", "").replace("\\\n", "").into()
}

/// `text` with each comment replaced by a space (a line comment by nothing up to its line's
/// end), string and character literals kept as they are, so that a `/*` in a string opens
/// nothing. Newlines stay, so lines stay lines.
fn without_comments(text: &str) -> String {
    #[derive(PartialEq)]
    enum State {
        Code,
        Line,
        Block,
        Literal(char),
    }
    let mut out = String::with_capacity(text.len());
    let mut state = State::Code;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match state {
            State::Code => match (c, chars.peek()) {
                ('/', Some('/')) => {
                    chars.next();
                    state = State::Line;
                }
                ('/', Some('*')) => {
                    chars.next();
                    out.push(' ');
                    state = State::Block;
                }
                ('"' | '\'', _) => {
                    out.push(c);
                    state = State::Literal(c);
                }
                _ => out.push(c),
            },
            State::Line => {
                if c == '\n' {
                    out.push('\n');
                    state = State::Code;
                }
            }
            State::Block => match (c, chars.peek()) {
                ('*', Some('/')) => {
                    chars.next();
                    state = State::Code;
                }
                ('\n', _) => out.push('\n'),
                _ => {}
            },
            State::Literal(quote) => {
                out.push(c);
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        out.push(escaped);
                    }
                } else if c == quote || c == '\n' {
                    // A literal ends at its quote; an unterminated one at its line's end.
                    state = State::Code;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(text: &str) -> Vec<(String, bool)> {
        named(text)
            .unwrap()
            .named
            .into_iter()
            .map(|n| (n.name, n.probe))
            .collect()
    }

    fn include(name: &str) -> (String, bool) {
        (name.to_string(), false)
    }

    #[test]
    fn a_source_without_directives_names_nothing() {
        assert!(names("__kernel void k(__global int *x) { x[0] = 1; }").is_empty());
    }

    #[test]
    fn quoted_and_angled_includes_with_any_spacing() {
        let text =
            "#include \"a.h\"\n  #  include <b/c.h>\n%:include \"d.h\"\n#include_next <e.h>\n";
        assert_eq!(
            names(text),
            [
                include("a.h"),
                include("b/c.h"),
                include("d.h"),
                include("e.h")
            ]
        );
    }

    #[test]
    fn comments_hide_directives_and_strings_hide_comments() {
        let text = "// #include \"no1.h\"\n/* #include \"no2.h\"\n */ #include \"yes1.h\"\n\
                    const char *s = \"/*\";\n#include \"yes2.h\" /* trailing */\n\
                    #/**/include \"yes3.h\"\n";
        assert_eq!(
            names(text),
            [include("yes1.h"), include("yes2.h"), include("yes3.h")]
        );
    }

    #[test]
    fn a_spliced_line_is_one_line() {
        assert_eq!(names("#inc\\\nlude \"split.h\"\n"), [include("split.h")]);
        assert_eq!(names("#include \\\r\n  \"crlf.h\"\n"), [include("crlf.h")]);
    }

    #[test]
    fn probes_are_found_in_conditions_and_macros() {
        let text = "#if __has_include(\"x.h\") && __has_include_next( <y.h> )\n#endif\n\
                    #define HAVE_Z __has_include(\"z.h\")\n";
        assert_eq!(
            names(text),
            [
                ("x.h".to_string(), true),
                ("y.h".to_string(), true),
                ("z.h".to_string(), true)
            ]
        );
    }

    #[test]
    fn a_directive_in_a_dead_branch_still_counts() {
        assert_eq!(
            names("#if 0\n#include \"dead.h\"\n#endif\n"),
            [include("dead.h")]
        );
    }

    #[test]
    fn computed_operands_and_defined_names_are_returned() {
        let scan = named(
            "#define H \"a.h\"\n#include H\n# include FILE(x) // why\n\
             #if __has_include(M(a, (b)))\n#endif\n#undef H\n",
        )
        .unwrap();
        let computed: Vec<_> = scan
            .named
            .iter()
            .map(|n| (n.name.as_str(), n.probe, n.computed))
            .collect();
        assert_eq!(
            computed,
            [
                ("H", false, true),
                ("FILE(x)", false, true),
                ("M(a, (b))", true, true)
            ]
        );
        assert_eq!(scan.defined, ["H", "H"]);
        // A file that names none still says what it defines.
        assert_eq!(named("#define ONLY 1\n").unwrap().defined, ["ONLY"]);
    }

    #[test]
    fn operands_that_cannot_be_names_are_unknowable() {
        for text in [
            "#embed \"data.bin\"\n",
            "#include \"unterminated\n",
            "#include <unterminated\n",
            "#include\n",
            "#if __has_include(M(x)\n#endif\n",
        ] {
            assert!(named(text).is_err(), "{text:?} was keyed");
        }
    }

    #[test]
    fn the_word_include_elsewhere_is_not_a_directive() {
        assert!(names("int include = 1; // includes nothing\n#define INCLUDE 2\n").is_empty());
    }
}
