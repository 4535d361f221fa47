//! The name of a computed `#include` (`#include M2S(INCLUDE_PATH/inc_vendor.h)`), found the way
//! the preprocessor finds it: the operand's tokens macro-expanded (object-like and
//! function-like macros, `#` and `##`, `__VA_ARGS__`, rescanning with each macro hidden inside
//! its own expansion) with the macros of the build's `-D` and `-U` options, then read as a
//! `"name"` or a `<name>`.
//!
//! Only the options' macros are known here: a `#define` in a file the build reads could come
//! before the directive or not, in a branch taken or not. So every identifier an expansion
//! looks at is recorded ([`Expander::consulted`]), and the caller refuses the build when a file
//! it reads defines or undefines one of them; an identifier a compiler may define itself
//! (reserved names, `cl_*`, `CL_*`, `FP_*`, `linux`, `unix`) is refused as soon as it is met.

use std::collections::{HashMap, HashSet, VecDeque};

use super::Unknowable;
use super::search::Define;

/// The most tokens one expansion may handle: a guard against macros that grow without end.
const MAX_STEPS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Identifier,
    /// A string or character literal.
    Literal,
    /// A number, a punctuator or any other character.
    Other,
}

#[derive(Debug, Clone)]
struct Token {
    text: String,
    kind: Kind,
    /// Blanks came before it (stringizing writes one space there).
    space: bool,
    /// The macros this token came out of, which do not expand it again.
    hidden: HashSet<String>,
}

impl Token {
    fn is(&self, text: &str) -> bool {
        self.kind == Kind::Other && self.text == text
    }
}

/// The preprocessing tokens of `text` (one logical line).
fn tokens(text: &str) -> Result<Vec<Token>, Unknowable> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut space = false;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = if c.is_ascii_whitespace() {
            space = true;
            i += 1;
            continue;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            Kind::Identifier
        } else if c.is_ascii_digit()
            || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            // A pp-number: digits, letters, `_`, `.`, and a sign after an exponent letter.
            i += 1;
            while i < bytes.len() {
                let d = bytes[i];
                let signed =
                    matches!(d, b'+' | b'-') && matches!(bytes[i - 1], b'e' | b'E' | b'p' | b'P');
                if !(d.is_ascii_alphanumeric() || d == b'_' || d == b'.' || signed) {
                    break;
                }
                i += 1;
            }
            Kind::Other
        } else if c == b'"' || c == b'\'' {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => {
                        return Err(Unknowable::new(format!(
                            "an unterminated literal in a computed #include ({text})"
                        )));
                    }
                    Some(b'\\') => i += 2,
                    Some(&d) if d == c => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            Kind::Literal
        } else if text[i..].starts_with("##") {
            i += 2;
            Kind::Other
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
            Kind::Other
        };
        out.push(Token {
            text: text[start..i].to_string(),
            kind,
            space,
            hidden: HashSet::new(),
        });
        space = false;
    }
    Ok(out)
}

#[derive(Debug)]
struct Macro {
    /// None for an object-like macro.
    params: Option<Vec<String>>,
    variadic: bool,
    body: Vec<Token>,
}

impl Macro {
    /// `NAME`, `NAME=BODY` or `NAME(PARAMS)=BODY`, as `-D` takes it (a bare name is `1`).
    fn from_option(definition: &str) -> Result<(String, Macro), Unknowable> {
        let bad = || Unknowable::new(format!("the macro option -D{definition}"));
        let end = definition
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(definition.len());
        let (name, mut rest) = definition.split_at(end);
        if name.is_empty() || name.as_bytes()[0].is_ascii_digit() {
            return Err(bad());
        }
        let mut params = None;
        let mut variadic = false;
        if let Some(list) = rest.strip_prefix('(') {
            let close = list.find(')').ok_or_else(bad)?;
            let mut names = Vec::new();
            for param in list[..close].split(',').map(str::trim) {
                match param {
                    "" if names.is_empty() && list[..close].trim().is_empty() => {}
                    "..." => variadic = true,
                    _ if variadic => return Err(bad()),
                    _ if tokens(param)?.iter().all(|t| t.kind == Kind::Identifier) => {
                        names.push(param.to_string());
                    }
                    _ => return Err(bad()),
                }
            }
            params = Some(names);
            rest = &list[close + 1..];
        }
        let body = match rest.strip_prefix('=') {
            Some(body) => tokens(body)?,
            None if rest.is_empty() => tokens("1")?,
            None => return Err(bad()),
        };
        Ok((
            name.to_string(),
            Macro {
                params,
                variadic,
                body,
            },
        ))
    }

    /// Which argument `token` names in the body, if any.
    fn param(&self, token: &Token) -> Option<usize> {
        let params = self.params.as_ref()?;
        if token.kind != Kind::Identifier {
            return None;
        }
        if self.variadic && token.text == "__VA_ARGS__" {
            return Some(params.len());
        }
        params.iter().position(|p| *p == token.text)
    }
}

/// The macros of a build's options, and what expanding include operands with them looked at.
pub(super) struct Expander {
    macros: Result<HashMap<String, Macro>, Unknowable>,
    consulted: HashSet<String>,
    steps: usize,
}

impl Expander {
    pub fn new(defines: &[Define]) -> Expander {
        let mut macros = HashMap::new();
        let mut table = Ok(());
        for define in defines {
            match define {
                Define::Set(text) => match Macro::from_option(text) {
                    Ok((name, definition)) => {
                        macros.insert(name, definition);
                    }
                    // The compiler rejects it or reads it some way of its own: neither is
                    // known here, and it matters only to a computed include.
                    Err(why) => table = Err(why),
                },
                Define::Unset(name) => {
                    macros.remove(name.trim());
                }
            }
        }
        Expander {
            macros: table.map(|()| macros),
            consulted: HashSet::new(),
            steps: 0,
        }
    }

    /// Every identifier an expansion so far looked up.
    pub fn consulted(&self) -> &HashSet<String> {
        &self.consulted
    }

    /// The file a computed `#include OPERAND` names, as written between its quotes or angle
    /// brackets.
    pub fn include_name(&mut self, operand: &str) -> Result<String, Unknowable> {
        let expanded = self.expand(tokens(operand)?)?;
        let unknowable = || {
            Unknowable::new(format!(
                "#include {operand}, which expands to neither \"name\" nor <name>"
            ))
        };
        match expanded.as_slice() {
            [one] if one.kind == Kind::Literal && one.text.starts_with('"') => {
                let name = &one.text[1..one.text.len() - 1];
                // Escapes are not read in a header's name; a stringized one holds them.
                if name.contains(['\\', '"']) {
                    return Err(unknowable());
                }
                Ok(name.to_string())
            }
            [open, inner @ .., close] if open.is("<") && close.is(">") => {
                let mut name = String::new();
                for (i, token) in inner.iter().enumerate() {
                    if i > 0 && token.space {
                        name.push(' ');
                    }
                    name.push_str(&token.text);
                }
                Ok(name)
            }
            _ => Err(unknowable()),
        }
    }

    fn expand(&mut self, input: Vec<Token>) -> Result<Vec<Token>, Unknowable> {
        let mut input = VecDeque::from(input);
        let mut out = Vec::new();
        while let Some(token) = input.pop_front() {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(Unknowable::new(format!(
                    "a computed #include of more than {MAX_STEPS} macro steps"
                )));
            }
            if token.kind != Kind::Identifier || token.hidden.contains(&token.text) {
                out.push(token);
                continue;
            }
            self.consulted.insert(token.text.clone());
            let macros = self.macros.as_ref().map_err(Clone::clone)?;
            let Some(definition) = macros.get(&token.text) else {
                if may_be_predefined(&token.text) {
                    return Err(Unknowable::new(format!(
                        "a computed #include that uses {}, which the compiler may define",
                        token.text
                    )));
                }
                out.push(token);
                continue;
            };
            let args = match &definition.params {
                None => Vec::new(),
                Some(_) if !input.front().is_some_and(|t| t.is("(")) => {
                    // A function-like macro's name without arguments is not a call.
                    out.push(token);
                    continue;
                }
                Some(_) => arguments(&mut input, definition)?,
            };
            let mut hidden = token.hidden.clone();
            hidden.insert(token.text.clone());
            let name = token.text.clone();
            let body = self.substitute(&name, &args, hidden, token.space)?;
            for token in body.into_iter().rev() {
                input.push_front(token);
            }
        }
        Ok(out)
    }

    /// The body of macro `name` with `args` in place of its parameters, every token hidden
    /// from the macros in `hidden`.
    fn substitute(
        &mut self,
        name: &str,
        args: &[Vec<Token>],
        hidden: HashSet<String>,
        space: bool,
    ) -> Result<Vec<Token>, Unknowable> {
        let macros = self.macros.as_ref().map_err(Clone::clone)?;
        let definition = &macros[name];
        let body = definition.body.clone();
        let params: Vec<Option<usize>> = body.iter().map(|t| definition.param(t)).collect();
        let function_like = definition.params.is_some();
        let mut out: Vec<Token> = Vec::new();
        let mut i = 0;
        while i < body.len() {
            let token = &body[i];
            let next_param = params.get(i + 1).copied().flatten();
            if function_like && token.is("#") {
                let Some(arg) = next_param else {
                    return Err(Unknowable::new(format!(
                        "# not before a parameter in {name}"
                    )));
                };
                out.push(stringized(&args[arg], token.space));
                i += 2;
                continue;
            }
            if token.is("##") {
                let right = match (next_param, body.get(i + 1)) {
                    (Some(arg), _) => args[arg].clone(),
                    (None, Some(next)) => vec![next.clone()],
                    (None, None) => {
                        return Err(Unknowable::new(format!("## at the end of {name}")));
                    }
                };
                paste(&mut out, right)?;
                i += 2;
                continue;
            }
            match params[i] {
                Some(arg) => {
                    let pasted = body.get(i + 1).is_some_and(|t| t.is("##"));
                    let mut value = if pasted {
                        args[arg].clone()
                    } else {
                        self.expand(args[arg].clone())?
                    };
                    if let Some(first) = value.first_mut() {
                        first.space = token.space;
                    }
                    out.extend(value);
                }
                None => out.push(token.clone()),
            }
            i += 1;
        }
        for token in &mut out {
            token.hidden.extend(hidden.iter().cloned());
        }
        if let Some(first) = out.first_mut() {
            first.space = space;
        }
        Ok(out)
    }
}

/// The arguments of a call of `definition`, from `input` (at its `(`) through the matching `)`.
fn arguments(
    input: &mut VecDeque<Token>,
    definition: &Macro,
) -> Result<Vec<Vec<Token>>, Unknowable> {
    input.pop_front();
    let named = definition.params.as_ref().map_or(0, Vec::len);
    let mut args = vec![Vec::new()];
    let mut depth = 0usize;
    loop {
        let Some(token) = input.pop_front() else {
            return Err(Unknowable::new(
                "a macro call without its ')' in a computed #include",
            ));
        };
        if token.is(")") && depth == 0 {
            break;
        }
        if token.is("(") {
            depth += 1;
        } else if token.is(")") {
            depth -= 1;
        } else if token.is(",") && depth == 0 && !(definition.variadic && args.len() > named) {
            args.push(Vec::new());
            continue;
        }
        args.last_mut().expect("one argument at least").push(token);
    }
    if named == 0 && !definition.variadic && args.len() == 1 && args[0].is_empty() {
        args.clear();
    }
    if definition.variadic && args.len() == named {
        args.push(Vec::new());
    }
    let wanted = named + usize::from(definition.variadic);
    if args.len() != wanted {
        return Err(Unknowable::new(format!(
            "a macro call with {} arguments for {wanted} in a computed #include",
            args.len()
        )));
    }
    Ok(args)
}

/// `#arg`: the argument's spelling as a string literal, one space where blanks were.
fn stringized(arg: &[Token], space: bool) -> Token {
    let mut text = String::from("\"");
    for (i, token) in arg.iter().enumerate() {
        if i > 0 && token.space {
            text.push(' ');
        }
        if token.kind == Kind::Literal {
            for c in token.text.chars() {
                if c == '"' || c == '\\' {
                    text.push('\\');
                }
                text.push(c);
            }
        } else {
            text.push_str(&token.text);
        }
    }
    text.push('"');
    Token {
        text,
        kind: Kind::Literal,
        space,
        hidden: HashSet::new(),
    }
}

/// `left ## right`: the last token of `out` and the first of `right` made one.
fn paste(out: &mut Vec<Token>, mut right: Vec<Token>) -> Result<(), Unknowable> {
    let Some(last) = out.pop() else {
        out.extend(right);
        return Ok(());
    };
    if right.is_empty() {
        out.push(last);
        return Ok(());
    }
    let first = right.remove(0);
    let joined = format!("{}{}", last.text, first.text);
    let mut pasted = tokens(&joined)?;
    if pasted.len() != 1 {
        return Err(Unknowable::new(format!(
            "## makes {joined}, not one token, in a computed #include"
        )));
    }
    let mut token = pasted.remove(0);
    token.space = last.space;
    token.hidden = last.hidden;
    out.push(token);
    out.extend(right);
    Ok(())
}

/// A name a compiler may define without being asked: reserved names, OpenCL's extension and
/// version macros, and the system names GNU modes define.
fn may_be_predefined(name: &str) -> bool {
    name.starts_with('_')
        || ["cl_", "CL_", "FP_"].iter().any(|p| name.starts_with(p))
        || ["linux", "unix", "i386", "defined"].contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expander(defines: &[&str]) -> Expander {
        let defines: Vec<Define> = defines
            .iter()
            .map(|d| match d.strip_prefix("-U") {
                Some(name) => Define::Unset(name.to_string()),
                None => Define::Set(d.to_string()),
            })
            .collect();
        Expander::new(&defines)
    }

    fn name(defines: &[&str], operand: &str) -> Result<String, Unknowable> {
        expander(defines).include_name(operand)
    }

    #[test]
    fn hashcats_two_level_stringizing() {
        let defines = [
            "INCLUDE_PATH=/usr/share/hashcat/OpenCL",
            "XM2S(x)=#x",
            "M2S(x)=XM2S(x)",
        ];
        assert_eq!(
            name(&defines, "M2S(INCLUDE_PATH/inc_vendor.h)").unwrap(),
            "/usr/share/hashcat/OpenCL/inc_vendor.h"
        );
        // One level stringizes the argument as written: no expansion under #.
        assert_eq!(
            name(&defines, "XM2S(INCLUDE_PATH/inc_vendor.h)").unwrap(),
            "INCLUDE_PATH/inc_vendor.h"
        );
        let mut expander = expander(&defines);
        expander.include_name("M2S(INCLUDE_PATH/a.h)").unwrap();
        for seen in ["M2S", "XM2S", "INCLUDE_PATH", "a", "h", "usr", "OpenCL"] {
            assert!(expander.consulted().contains(seen), "{seen}");
        }
    }

    #[test]
    fn object_like_angled_pasted_and_variadic() {
        assert_eq!(name(&["H=\"a.h\""], "H").unwrap(), "a.h");
        assert_eq!(name(&["H=<sys/b.h>"], "H").unwrap(), "sys/b.h");
        assert_eq!(name(&["H=<a b.h>"], "H").unwrap(), "a b.h");
        assert_eq!(
            name(
                &["CAT(a,b)=a##b", "S(x)=#x", "X(x)=S(x)", "AB=\"ab.h\""],
                "CAT(A,B)"
            )
            .unwrap(),
            "ab.h"
        );
        assert_eq!(
            name(
                &["S(...)=#__VA_ARGS__", "X(...)=S(__VA_ARGS__)"],
                "X(a,b.h)"
            )
            .unwrap(),
            "a,b.h"
        );
        assert_eq!(name(&["S(x)=#x", "V=2"], "S(v1 . h)").unwrap(), "v1 . h");
        assert_eq!(name(&["F()=\"f.h\""], "F()").unwrap(), "f.h");
    }

    #[test]
    fn the_last_definition_wins_and_undefined_names_stay() {
        assert_eq!(name(&["H=\"1.h\"", "H=\"2.h\""], "H").unwrap(), "2.h");
        assert_eq!(
            name(&["S(x)=#x", "X(x)=S(x)", "D=dir", "-UD"], "X(D/f.h)").unwrap(),
            "D/f.h"
        );
    }

    #[test]
    fn a_macro_is_hidden_inside_its_own_expansion() {
        assert_eq!(
            name(&["S(x)=#x", "X(x)=S(x)", "A=A/b"], "X(A.h)").unwrap(),
            "A/b.h"
        );
        // Mutual recursion ends too.
        assert!(name(&["A=B", "B=A"], "A").is_err());
    }

    #[test]
    fn what_cannot_be_known_is_unknowable() {
        for (defines, operand) in [
            (&[][..], "H"),
            (&["H=1"][..], "H"),
            (&["H=\"a\\\\b.h\""][..], "H"),
            (&["S(x)=#x", "X(x)=S(x)"][..], "X(__FILE__)"),
            (&["S(x)=#x", "X(x)=S(x)"][..], "X(cl_khr_fp64)"),
            (&["S(x)=#x", "X(x)=S(x)"][..], "X(linux/a.h)"),
            (&["F(a,b)=a"][..], "F(x)"),
            (&["F(a)=a"][..], "F(x"),
            (&["BAD-=1"][..], "H"),
            (&["G(x)=#"][..], "G(1)"),
        ] {
            assert!(name(defines, operand).is_err(), "{defines:?} {operand}");
        }
    }

    #[test]
    fn expansion_is_bounded() {
        let defines = [
            "A=B B B B B B B B",
            "B=C C C C C C C C",
            "C=D D D D D D D D",
            "D=E E E E E E E E",
            "E=F F F F F F F F",
            "F=G G G G G G G G",
        ];
        assert!(name(&defines, "A").is_err());
    }
}
