//! Minimal SPIR-V checks run before a module reaches the driver.
//!
//! Drivers are entitled to crash on malformed SPIR-V (the Vulkan spec makes valid code a
//! precondition of `vkCreateShaderModule`), so kcache checks the part it can check cheaply: the
//! header, that every instruction lies inside the module, and that the requested entry point
//! exists as a `GLCompute` entry point. It is not a validator; full validation is `spirv-val`'s job.

use crate::{Error, Result};

pub(crate) const MAGIC: u32 = 0x0723_0203;
const HEADER_WORDS: usize = 5;
/// 256 MiB of SPIR-V: far beyond any real compute shader, small enough to reject a length
/// computed from garbage before anything is copied or hashed.
const MAX_WORDS: usize = 64 << 20;
const OP_ENTRY_POINT: u32 = 15;
const EXECUTION_MODEL_GL_COMPUTE: u32 = 5;

fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(format!("SPIR-V: {}", message.into()))
}

/// Checks `words` and that it declares `entry_point` as a compute entry point.
pub(crate) fn validate(words: &[u32], entry_point: &str) -> Result<()> {
    if words.len() < HEADER_WORDS {
        return Err(invalid(format!(
            "{} words is shorter than the 5-word header",
            words.len()
        )));
    }
    if words.len() > MAX_WORDS {
        return Err(invalid(format!(
            "{} words exceeds the limit of {MAX_WORDS}",
            words.len()
        )));
    }
    if words[0] != MAGIC {
        if words[0].swap_bytes() == MAGIC {
            return Err(invalid("module is byte-swapped (big-endian words)"));
        }
        return Err(invalid(format!(
            "bad magic number {:#010x} (expected {MAGIC:#010x})",
            words[0]
        )));
    }
    let version = words[1];
    let major = (version >> 16) & 0xff;
    if version & 0xff00_00ff != 0 || major != 1 {
        return Err(invalid(format!("unsupported version word {version:#010x}")));
    }
    if words[3] == 0 {
        return Err(invalid("id bound is zero"));
    }
    if words[4] != 0 {
        return Err(invalid("reserved schema word is not zero"));
    }

    let mut found_entry = false;
    let mut at = HEADER_WORDS;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 {
            return Err(invalid(format!(
                "instruction at word {at} has word count 0"
            )));
        }
        let end = at + count;
        if end > words.len() {
            return Err(invalid(format!(
                "instruction at word {at} ({count} words) runs past the end ({} words)",
                words.len()
            )));
        }
        if opcode == OP_ENTRY_POINT && count >= 4 && words[at + 1] == EXECUTION_MODEL_GL_COMPUTE {
            found_entry |= literal_string_equals(&words[at + 3..end], entry_point);
        }
        at = end;
    }
    if !found_entry {
        return Err(invalid(format!(
            "no GLCompute entry point named {entry_point:?}"
        )));
    }
    Ok(())
}

/// SPIR-V literal strings are UTF-8, NUL-terminated, packed little-endian into words.
fn literal_string_equals(words: &[u32], expected: &str) -> bool {
    let expected = expected.as_bytes();
    let mut bytes = words.iter().flat_map(|w| w.to_le_bytes());
    for &b in expected {
        if bytes.next() != Some(b) {
            return false;
        }
    }
    bytes.next() == Some(0)
}

/// Reinterprets a byte buffer (as read from a `.spv` file) as words, checking the length.
pub fn words_from_bytes(bytes: &[u8]) -> Result<Vec<u32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(invalid(format!(
            "{} bytes is not a multiple of 4",
            bytes.len()
        )));
    }
    if bytes.len() / 4 > MAX_WORDS {
        return Err(invalid(format!(
            "{} bytes exceeds the limit of {MAX_WORDS} words",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest module these checks accept: header, OpEntryPoint GLCompute %1 "main".
    fn module(name_words: &[u32]) -> Vec<u32> {
        let mut w = vec![MAGIC, 0x0001_0300, 0, 2, 0];
        w.push(((3 + name_words.len() as u32) << 16) | OP_ENTRY_POINT);
        w.push(EXECUTION_MODEL_GL_COMPUTE);
        w.push(1);
        w.extend_from_slice(name_words);
        w
    }

    fn main_name() -> Vec<u32> {
        vec![u32::from_le_bytes(*b"main"), 0]
    }

    #[test]
    fn accepts_entry_point_and_rejects_other_names() {
        let m = module(&main_name());
        validate(&m, "main").unwrap();
        assert!(matches!(
            validate(&m, "mai"),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            validate(&m, "main2"),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn rejects_bad_header_and_overrun() {
        let good = module(&main_name());
        let mut bad_magic = good.clone();
        bad_magic[0] = 0xdead_beef;
        let msg = validate(&bad_magic, "main").unwrap_err().to_string();
        assert!(msg.contains("magic"), "{msg}");
        let swapped: Vec<u32> = good.iter().map(|w| w.swap_bytes()).collect();
        let msg = validate(&swapped, "main").unwrap_err().to_string();
        assert!(msg.contains("byte-swapped"), "{msg}");
        let truncated = &good[..good.len() - 1];
        let msg = validate(truncated, "main").unwrap_err().to_string();
        assert!(msg.contains("past the end"), "{msg}");
        assert!(validate(&good[..4], "main").is_err());
        let mut zero_count = good.clone();
        zero_count.push(0);
        assert!(validate(&zero_count, "main").is_err());
    }

    #[test]
    fn bytes_must_be_whole_words() {
        assert!(words_from_bytes(&[1, 2, 3]).is_err());
        assert_eq!(words_from_bytes(&[3, 2, 0x23, 7]).unwrap(), vec![MAGIC]);
    }
}
