//! Cache keys: 32 bytes derived from everything that determines a compiled binary.
//!
//! Each field is digested on its own (BLAKE3, domain-separated per field), and the key hashes
//! those fixed-width digests, in a fixed order, under [`KEY_SCHEMA_VERSION`]. Because every
//! digest has the same width and position, bytes cannot shift from one field into the next
//! (`"ab" + "c"` and `"a" + "bc"` give different keys), and a field that was never set differs
//! from a field set to the empty string.
//!
//! Build options and extra fields are name/value pairs sorted by name before hashing, so the
//! order a caller adds them in does not matter; the same name twice is an error rather than a
//! silent pick of one value. Options whose meaning depends on their position (`-DX=1 -UX`,
//! `-O2 -O0`, include search paths) go through [`KeyBuilder::ordered_option`] instead, which
//! keeps them in the order given.
//!
//! kcache never reads files: the contents of headers a source `#include`s (and of any other
//! file the compiler reads) reach the key only through [`KeyBuilder::dependency`].
//!
//! Ordered options and dependencies enter the key only when some are given, so keys made
//! without them are those of earlier versions under the same [`KEY_SCHEMA_VERSION`].

use std::fmt;

use crate::error::{Error, Result};

/// Version of the key derivation. Bump it whenever the inputs or their combination change:
/// entries written under an older schema then become unreachable (and `gc` removes them)
/// instead of matching a key that no longer means the same thing.
pub const KEY_SCHEMA_VERSION: u32 = 1;

/// Length of a key in bytes.
pub const KEY_LEN: usize = 32;

const FIELD_CONTEXT: &str = "kcache 2026-12 key field";
const KEY_CONTEXT: &str = "kcache 2026-12 cache key";

/// A derived cache key. On disk it appears only as fixed-width hex, never as caller text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Key(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Lowercase hex, 64 characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// Parses exactly 64 lowercase hex characters.
    pub fn from_hex(text: &str) -> Option<Key> {
        let mut out = [0u8; KEY_LEN];
        parse_hex(text, &mut out).then_some(Key(out))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_hex())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The single-valued inputs of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Field {
    /// "opencl", "vulkan", "cuda", or a caller-defined backend name.
    Backend = 0,
    DeviceName = 1,
    DeviceVendor = 2,
    DriverVersion = 3,
    CompilerVersion = 4,
    /// Kernel or entry-point name: one source may define several kernels.
    Entry = 5,
    /// Source text, SPIR-V or PTX bytes.
    Source = 6,
}

const FIELD_COUNT: usize = 7;

impl Field {
    pub const ALL: [Field; FIELD_COUNT] = [
        Field::Backend,
        Field::DeviceName,
        Field::DeviceVendor,
        Field::DriverVersion,
        Field::CompilerVersion,
        Field::Entry,
        Field::Source,
    ];

    pub fn from_index(index: u32) -> Option<Field> {
        Field::ALL.get(usize::try_from(index).ok()?).copied()
    }
}

// Tags that keep the digest of one kind of input from ever equalling the digest of another.
const TAG_OPTION_NAME: u8 = 0x40;
const TAG_OPTION_VALUE: u8 = 0x41;
const TAG_EXTRA_NAME: u8 = 0x50;
const TAG_EXTRA_VALUE: u8 = 0x51;
const TAG_ORDERED_OPTION: u8 = 0x60;
const TAG_DEPENDENCY_NAME: u8 = 0x70;
const TAG_DEPENDENCY_VALUE: u8 = 0x71;
// Markers of the sections that are hashed only when non-empty (after the options and extras,
// whose counts fix where each section starts).
const SECTION_ORDERED_OPTIONS: u8 = 1;
const SECTION_DEPENDENCIES: u8 = 2;

fn digest(tag: u8, bytes: &[u8]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new_derive_key(FIELD_CONTEXT);
    hasher.update(&[tag]);
    hasher.update(bytes);
    *hasher.finalize().as_bytes()
}

/// Adds a named input to one of [`KeyBuilder`]'s sorted lists, its value hashed under `tag`.
fn push_named(
    list: &mut Vec<(Vec<u8>, [u8; 32])>,
    tag: u8,
    name: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
) {
    list.push((name.as_ref().to_vec(), digest(tag, value.as_ref())));
}

/// One setter of [`KeyBuilder`] per single-valued field: `backend(v)` is
/// `set(Field::Backend, v)`.
macro_rules! field_setters {
    ($($method:ident => $field:ident),* $(,)?) => {
        $(
            #[doc = concat!("Sets [`Field::", stringify!($field), "`], as [`KeyBuilder::set`].")]
            pub fn $method(&mut self, value: impl AsRef<[u8]>) -> &mut Self {
                self.set(Field::$field, value)
            }
        )*
    };
}

/// Collects key inputs. Only digests are kept, so a large source costs no copy.
#[derive(Clone, Debug, Default)]
pub struct KeyBuilder {
    fields: [Option<[u8; 32]>; FIELD_COUNT],
    options: Vec<(Vec<u8>, [u8; 32])>,
    extras: Vec<(Vec<u8>, [u8; 32])>,
    ordered_options: Vec<[u8; 32]>,
    dependencies: Vec<(Vec<u8>, [u8; 32])>,
}

impl KeyBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `field`, replacing an earlier value of it.
    pub fn set(&mut self, field: Field, value: impl AsRef<[u8]>) -> &mut Self {
        self.fields[field as usize] = Some(digest(field as u8, value.as_ref()));
        self
    }

    field_setters! {
        backend => Backend,
        device_name => DeviceName,
        device_vendor => DeviceVendor,
        driver_version => DriverVersion,
        compiler_version => CompilerVersion,
        entry => Entry,
        source => Source,
    }

    /// Adds a build option; a flag without a value uses an empty value. Adding the same name
    /// twice makes [`KeyBuilder::finish`] fail.
    ///
    /// Options are sorted by name before hashing, so `a` then `b` gives the key of `b` then
    /// `a`. That is safe only for options whose effect does not depend on their position
    /// relative to the others: each named once, none overriding or extending another (for
    /// example `-cl-fast-relaxed-math`, or `-D` definitions of different macros when nothing
    /// undefines them). Options that interact by position — `-DX=1` with `-UX`, `-O2` with
    /// `-O0`, `-I` search paths, `-include` — must go through
    /// [`KeyBuilder::ordered_option`]; when in doubt, pass the whole command line that way.
    pub fn option(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        push_named(&mut self.options, TAG_OPTION_VALUE, name, value);
        self
    }

    /// Adds a caller-defined input (a specialization constant, a layout description, …).
    /// Same rules as options, in a separate namespace.
    pub fn extra(&mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> &mut Self {
        push_named(&mut self.extras, TAG_EXTRA_VALUE, name, value);
        self
    }

    /// Appends one command-line argument (`-DX=1`, `-UX`, `-I`, `dir`, …) to the ordered
    /// options: they are hashed in the order given, so `-DX=1 -UX` and `-UX -DX=1` give
    /// different keys, as they compile differently. Repeats are allowed. Separate from
    /// [`KeyBuilder::option`]: an argument given both ways counts twice.
    pub fn ordered_option(&mut self, argument: impl AsRef<[u8]>) -> &mut Self {
        self.ordered_options
            .push(digest(TAG_ORDERED_OPTION, argument.as_ref()));
        self
    }

    /// Adds an input the compiler reads besides the source: a header the source `#include`s,
    /// a precompiled module, a library linked in. `name` identifies it (the include name or
    /// path as the compiler resolves it), `contents` are its bytes. kcache never reads files
    /// itself, so a header left out here can change without changing the key, and the cache
    /// would hand out a binary built from the old header. Sorted by name like options; the
    /// same name twice makes [`KeyBuilder::finish`] fail.
    pub fn dependency(&mut self, name: impl AsRef<[u8]>, contents: impl AsRef<[u8]>) -> &mut Self {
        push_named(&mut self.dependencies, TAG_DEPENDENCY_VALUE, name, contents);
        self
    }

    /// The key under the current [`KEY_SCHEMA_VERSION`].
    pub fn finish(&self) -> Result<Key> {
        self.finish_with_schema(KEY_SCHEMA_VERSION)
    }

    /// The key under an explicit schema version: for tools that migrate or collect entries
    /// of older schemas.
    pub fn finish_with_schema(&self, schema: u32) -> Result<Key> {
        let mut hasher = blake3::Hasher::new_derive_key(KEY_CONTEXT);
        hasher.update(&schema.to_le_bytes());
        for field in &self.fields {
            match field {
                Some(d) => hasher.update(&[1]).update(d),
                None => hasher.update(&[0]).update(&[0; 32]),
            };
        }
        hash_pairs(&mut hasher, &self.options, TAG_OPTION_NAME, "build option")?;
        hash_pairs(&mut hasher, &self.extras, TAG_EXTRA_NAME, "extra field")?;
        // Hashed only when used, so that keys built without them keep their old value.
        if !self.ordered_options.is_empty() {
            hasher.update(&[SECTION_ORDERED_OPTIONS]);
            hasher.update(&(self.ordered_options.len() as u64).to_le_bytes());
            for argument in &self.ordered_options {
                hasher.update(argument);
            }
        }
        if !self.dependencies.is_empty() {
            hasher.update(&[SECTION_DEPENDENCIES]);
            hash_pairs(
                &mut hasher,
                &self.dependencies,
                TAG_DEPENDENCY_NAME,
                "dependency",
            )?;
        }
        Ok(Key(*hasher.finalize().as_bytes()))
    }
}

fn hash_pairs(
    hasher: &mut blake3::Hasher,
    pairs: &[(Vec<u8>, [u8; 32])],
    name_tag: u8,
    what: &str,
) -> Result<()> {
    let mut sorted: Vec<&(Vec<u8>, [u8; 32])> = pairs.iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    if let Some(pair) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidArgument(format!(
            "duplicate {what} {:?}",
            String::from_utf8_lossy(&pair[0].0)
        )));
    }
    hasher.update(&(sorted.len() as u64).to_le_bytes());
    for (name, value_digest) in sorted {
        hasher.update(&digest(name_tag, name));
        hasher.update(value_digest);
    }
    Ok(())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

/// Parses lowercase hex of exactly `out.len() * 2` characters.
pub(crate) fn parse_hex(text: &str, out: &mut [u8]) -> bool {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let text = text.as_bytes();
    if text.len() != out.len() * 2 {
        return false;
    }
    for (i, pair) in text.chunks_exact(2).enumerate() {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => out[i] = (hi << 4) | lo,
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> KeyBuilder {
        let mut b = KeyBuilder::new();
        b.backend("opencl")
            .device_name("pthread-cpu")
            .device_vendor("PoCL")
            .driver_version("6.0")
            .compiler_version("clang 18")
            .entry("saxpy")
            .source("__kernel void saxpy() {}")
            .option("-cl-fast-relaxed-math", "")
            .option("-DN", "4");
        b
    }

    /// The key of a builder that must succeed.
    fn key(builder: &mut KeyBuilder) -> Key {
        builder.finish().unwrap()
    }

    #[test]
    fn deterministic() {
        assert_eq!(base().finish().unwrap(), base().finish().unwrap());
    }

    #[test]
    fn boundary_shift_does_not_collide() {
        let mut a = KeyBuilder::new();
        a.device_name("ab").entry("c");
        let mut b = KeyBuilder::new();
        b.device_name("a").entry("bc");
        assert_ne!(a.finish().unwrap(), b.finish().unwrap());

        let mut a = KeyBuilder::new();
        a.option("ab", "c");
        let mut b = KeyBuilder::new();
        b.option("a", "bc");
        assert_ne!(a.finish().unwrap(), b.finish().unwrap());
    }

    #[test]
    fn option_order_does_not_matter() {
        let mut a = KeyBuilder::new();
        a.option("-DA", "1").option("-DB", "2").option("-w", "");
        let mut b = KeyBuilder::new();
        b.option("-w", "").option("-DB", "2").option("-DA", "1");
        assert_eq!(a.finish().unwrap(), b.finish().unwrap());
    }

    #[test]
    fn duplicate_option_is_an_error() {
        let mut b = base();
        b.option("-DN", "5");
        assert!(matches!(b.finish(), Err(Error::InvalidArgument(_))));
        let mut b = base();
        b.extra("layout", "x").extra("layout", "x");
        assert!(matches!(b.finish(), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn every_field_changes_the_key() {
        let reference = base().finish().unwrap();
        let mut seen = vec![reference];
        for field in Field::ALL {
            let mut b = base();
            b.set(field, "changed");
            let key = b.finish().unwrap();
            assert!(!seen.contains(&key), "{field:?} did not change the key");
            seen.push(key);
        }
        let mut b = base();
        b.option("-DM", "1");
        seen.push(b.finish().unwrap());
        let mut b = base();
        b.extra("spec", "1");
        seen.push(b.finish().unwrap());
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), Field::ALL.len() + 3);
    }

    #[test]
    fn option_value_and_extra_namespace_change_the_key() {
        let keys = [
            key(base().option("-DX", "1")),
            key(base().option("-DX", "2")),
            key(base().extra("-DX", "1")),
        ];
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
    }

    #[test]
    fn ordered_options_keep_their_order() {
        let mut define_then_undefine = base();
        define_then_undefine
            .ordered_option("-DX=1")
            .ordered_option("-UX");
        let mut undefine_then_define = base();
        undefine_then_define
            .ordered_option("-UX")
            .ordered_option("-DX=1");
        let a = define_then_undefine.finish().unwrap();
        let b = undefine_then_define.finish().unwrap();
        assert_ne!(a, b);
        // The sorted options cannot tell these apart: that is what the ordered ones are for.
        let sorted_a = key(base().option("-DX=1", "").option("-UX", ""));
        let sorted_b = key(base().option("-UX", "").option("-DX=1", ""));
        assert_eq!(sorted_a, sorted_b);
        // Neither the sorted options nor the boundaries between arguments alias them.
        assert_ne!(a, sorted_a);
        assert_ne!(a, key(base().ordered_option("-DX=1-UX")));
        let repeated = key(base().ordered_option("-UX").ordered_option("-UX"));
        assert_ne!(repeated, key(base().ordered_option("-UX")));
    }

    #[test]
    fn dependency_contents_change_the_key() {
        let mut old_header = base();
        old_header.dependency("defs.h", "#define N 4\n");
        let keys = [
            base().finish().unwrap(),
            old_header.finish().unwrap(),
            key(base().dependency("defs.h", "#define N 8\n")),
            key(base().dependency("other.h", "#define N 4\n")),
        ];
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        // Sorted by name, and a dependency is not an extra of the same name.
        let ab = key(base().dependency("a.h", "1").dependency("b.h", "2"));
        let ba = key(base().dependency("b.h", "2").dependency("a.h", "1"));
        assert_eq!(ab, ba);
        assert_ne!(key(base().extra("defs.h", "#define N 4\n")), keys[1]);
        old_header.dependency("defs.h", "#define N 4\n");
        assert!(matches!(
            old_header.finish(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn unset_differs_from_empty() {
        let mut a = KeyBuilder::new();
        a.entry("");
        assert_ne!(a.finish().unwrap(), KeyBuilder::new().finish().unwrap());
    }

    #[test]
    fn schema_version_changes_the_key() {
        let b = base();
        assert_eq!(
            b.finish().unwrap(),
            b.finish_with_schema(KEY_SCHEMA_VERSION).unwrap()
        );
        assert_ne!(
            b.finish_with_schema(KEY_SCHEMA_VERSION).unwrap(),
            b.finish_with_schema(KEY_SCHEMA_VERSION + 1).unwrap()
        );
    }

    /// A known answer: if this changes, the derivation changed, and entries written by
    /// earlier versions would be misread as current. Bump `KEY_SCHEMA_VERSION` with it.
    #[test]
    fn derivation_is_stable() {
        assert_eq!(
            base().finish().unwrap().to_hex(),
            "c95fe6b379560aae8fb86d6c73fcb69975bfd61002dabfbc77323a6e25e93845"
        );
    }

    #[test]
    fn hex_round_trip() {
        let key = base().finish().unwrap();
        let text = key.to_hex();
        assert_eq!(text.len(), 64);
        assert_eq!(Key::from_hex(&text), Some(key));
        assert_eq!(Key::from_hex(&text.to_uppercase()), None);
        assert_eq!(Key::from_hex(&text[1..]), None);
    }
}
