//! The files a build from source reads besides the source: the headers its `#include`s name,
//! found the way the compiler finds them, so that a binary is keyed by what it was compiled
//! from and a changed header never gets the binary of the old one.
//!
//! Each file a source names ([`scan`]) is looked for in every place a compiler may take it
//! from ([`Headers::read`]): the directory of the file that names it (the working directory,
//! for the source itself), each `-I` directory ([`search`]) and the working directory. Every
//! candidate's state, a file's contents or its absence, is an input, so a header that appears
//! earlier on the search path changes the key as surely as one that changes; the files found
//! are scanned in turn. Keying every candidate rather than the first one found makes the key
//! hold whatever order a driver searches in. A computed `#include` is expanded with the
//! macros of the build's `-D` options ([`macros`]). A name found in none of these places nor in
//! the system's include directories is the compiler's own header, or in a branch not compiled:
//! keyed by every place's absence. Where kcache cannot know what a build reads (a computed
//! `#include` whose macros a file the build reads defines too, an option that reads a file),
//! the build is not served: [`Unknowable`] says why, and the backend passes it to the driver.

mod macros;
mod scan;
mod search;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use crate::key::KeyBuilder;
pub(crate) use search::{Search, nvrtc_search, opencl_search};

/// Why kcache cannot know every input of a build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknowable(String);

impl Unknowable {
    fn new(reason: impl Into<String>) -> Self {
        Unknowable(reason.into())
    }
}

impl fmt::Display for Unknowable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The most bytes of headers one build is keyed by: past it the build is not served, rather
/// than read without bound on every lookup.
const MAX_BYTES: u64 = 256 << 20;
/// The directories compilers search last for `<…>` (and for `"…"` found nowhere else).
const SYSTEM_DIRS: [&str; 2] = ["/usr/local/include", "/usr/include"];

/// The most files one build may name, all candidates counted.
const MAX_FILES: usize = 16_384;

/// A header an application hands the compiler itself (`clCompileProgram`'s input headers):
/// found by its include name before any file.
#[derive(Debug, Clone, Copy)]
pub struct Embedded<'a> {
    pub name: &'a str,
    pub text: &'a str,
}

/// What a candidate place held.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Absent,
    File(blake3::Hash),
    Embedded(blake3::Hash),
}

/// The headers of one build: every place looked in and what it held, in the order looked.
/// Empty (and free: no allocation, no file touched) for a source that names no file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    places: Vec<(String, State)>,
}

impl Headers {
    /// The headers `sources` (one text, as the driver concatenates them) read with what the
    /// build's options say (`search`: the `-I` directories and `-D` macros) and `embedded`
    /// headers, from the working directory.
    pub fn read(
        sources: &[&str],
        search: &Search,
        embedded: &[Embedded<'_>],
    ) -> Result<Headers, Unknowable> {
        let mut headers = Headers::default();
        let texts = || {
            sources
                .iter()
                .copied()
                .chain(embedded.iter().map(|h| h.text))
        };
        if !texts().any(scan::may_name_files) {
            return Ok(headers);
        }
        let mut reader = Reader {
            search,
            embedded,
            seen: HashMap::new(),
            bytes: 0,
            expander: None,
            defined: HashSet::new(),
            headers: &mut headers,
        };
        let mut named = Vec::new();
        for text in texts() {
            named.extend(reader.scan(text)?);
        }
        reader.follow("", named)?;
        reader.check_expansions()?;
        Ok(headers)
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// One digest of every place and its state, for a key that holds no names.
    pub fn digest(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        for (place, state) in &self.places {
            hasher.update(&(place.len() as u64).to_le_bytes());
            hasher.update(place.as_bytes());
            hasher.update(&state_bytes(state));
        }
        *hasher.finalize().as_bytes()
    }

    /// Adds every place and its state to `builder` as dependencies.
    pub fn add_to(&self, builder: &mut KeyBuilder) {
        for (place, state) in &self.places {
            builder.dependency(place, state_bytes(state));
        }
    }
}

/// A state as key input: a tag, then the contents' digest.
fn state_bytes(state: &State) -> Vec<u8> {
    match state {
        State::Absent => vec![0],
        State::File(hash) => [&[1], &hash.as_bytes()[..]].concat(),
        State::Embedded(hash) => [&[2], &hash.as_bytes()[..]].concat(),
    }
}

struct Reader<'r, 'a> {
    search: &'r Search,
    embedded: &'r [Embedded<'a>],
    /// Places already looked in, and whether each held a file: each is keyed once, and a
    /// header included twice (or including itself) is read once.
    seen: HashMap<String, bool>,
    bytes: u64,
    /// The options' macros, made at the first computed include.
    expander: Option<macros::Expander>,
    /// Every name a file read defines or undefines.
    defined: HashSet<String>,
    headers: &'r mut Headers,
}

impl Reader<'_, '_> {
    /// The files `text` names; the macros it defines are noted.
    fn scan(&mut self, text: &str) -> Result<Vec<scan::Named>, Unknowable> {
        let found = scan::named(text)?;
        self.defined.extend(found.defined);
        Ok(found.named)
    }

    /// Refuses the build where a file it reads defines a name a computed include's expansion
    /// used: whether that definition came first is not known without running the preprocessor.
    fn check_expansions(&self) -> Result<(), Unknowable> {
        let Some(expander) = &self.expander else {
            return Ok(());
        };
        let mut clash: Vec<&String> = expander.consulted().intersection(&self.defined).collect();
        clash.sort();
        match clash.first() {
            None => Ok(()),
            Some(name) => Err(Unknowable::new(format!(
                "a computed #include expands {name}, which a file of the build defines or \
                 undefines"
            ))),
        }
    }

    /// Looks for each of `named`, named by a file in directory `from`, and follows what it
    /// finds.
    fn follow(&mut self, from: &str, named: Vec<scan::Named>) -> Result<(), Unknowable> {
        for mut file in named {
            if file.computed {
                let defines = &self.search.defines;
                let expander = self
                    .expander
                    .get_or_insert_with(|| macros::Expander::new(defines));
                file.name = expander.include_name(&file.name)?;
            }
            let mut found = false;
            if let Some(header) = self.embedded.iter().find(|h| h.name == file.name) {
                found = true;
                let place = format!("embedded:{}", header.name);
                if self.seen.insert(place.clone(), true).is_none() {
                    let hash = blake3::hash(header.text.as_bytes());
                    self.headers.places.push((place, State::Embedded(hash)));
                }
            }
            for place in candidates(from, &self.search.dirs, &file.name) {
                found |= self.look(place)?;
            }
            if !found && !Path::new(&file.name).is_absolute() {
                // Compilers search the system's directories after every other place, and take
                // the first file found there.
                for dir in SYSTEM_DIRS {
                    let place = Path::new(dir)
                        .join(&file.name)
                        .to_string_lossy()
                        .into_owned();
                    if self.look(place)? {
                        break;
                    }
                }
            }
            // Found nowhere, a name is the compiler's own header (`stddef.h`, `opencl-c.h`:
            // part of the compiler, whose version is in the key) or in a branch that is not
            // compiled, since a build that includes a missing file fails and is not cached.
            // Each place looked in is keyed absent, so the file appearing there is a new key.
        }
        Ok(())
    }

    /// Keys what `place` holds and, for a file seen for the first time, follows its own
    /// includes. True when it is a file.
    fn look(&mut self, place: String) -> Result<bool, Unknowable> {
        if let Some(&file) = self.seen.get(&place) {
            return Ok(file);
        }
        if self.seen.len() >= MAX_FILES {
            return Err(Unknowable::new(format!(
                "more than {MAX_FILES} places to look for headers in"
            )));
        }
        let path = Path::new(&place);
        let contents = match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {
                self.bytes += meta.len();
                if self.bytes > MAX_BYTES {
                    return Err(Unknowable::new(format!(
                        "headers of more than {} MiB",
                        MAX_BYTES >> 20
                    )));
                }
                std::fs::read(path).map_err(|e| {
                    Unknowable::new(format!("the header {place} cannot be read: {e}"))
                })?
            }
            // A named pipe or a device gives the compiler what kcache cannot read without
            // taking it away.
            Ok(meta) if !meta.is_dir() => {
                return Err(Unknowable::new(format!(
                    "the header {place} is not a regular file"
                )));
            }
            _ => {
                self.seen.insert(place.clone(), false);
                self.headers.places.push((place, State::Absent));
                return Ok(false);
            }
        };
        self.seen.insert(place.clone(), true);
        let text = String::from_utf8_lossy(&contents);
        let named = self.scan(&text)?;
        let dir = path
            .parent()
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.headers
            .places
            .push((place, State::File(blake3::hash(&contents))));
        self.follow(&dir, named)?;
        Ok(true)
    }
}

/// Every place a compiler may take `name` from, named by a file in directory `from`: an
/// absolute name itself; else `from`, each of `dirs`, then the working directory. Repeats
/// left out.
fn candidates(from: &str, dirs: &[String], name: &str) -> Vec<String> {
    if Path::new(name).is_absolute() {
        return vec![name.to_string()];
    }
    let mut places: Vec<String> = Vec::new();
    for dir in std::iter::once(from)
        .chain(dirs.iter().map(String::as_str))
        .chain(std::iter::once(""))
    {
        let place = if dir.is_empty() {
            name.to_string()
        } else {
            Path::new(dir).join(name).to_string_lossy().into_owned()
        };
        if !places.contains(&place) {
            places.push(place);
        }
    }
    places
}

#[cfg(test)]
mod tests;
