//! What an entry holds, in words an operator reads: the backend that wrote it, the device it
//! was built for and a name for its content. It is stored in the entry's header (format 2,
//! `docs/disk-format.md`) under the entry's tag, so that `kcache ls`, `stats` and `evict` can
//! trust it; nothing in it takes part in a lookup.

/// Longest backend name kept, in bytes.
pub const MAX_BACKEND_LEN: usize = 32;
/// Longest device name kept, in bytes.
pub const MAX_DEVICE_LEN: usize = 256;
/// Longest entry name kept, in bytes.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest encoded descriptor: three 2-byte lengths and the three fields at their limits.
pub const MAX_ENCODED_LEN: usize = 6 + MAX_BACKEND_LEN + MAX_DEVICE_LEN + MAX_NAME_LEN;

/// The backend name of entries whose writer named none (`Persistence::put`, a tiered lookup
/// without a descriptor).
pub const CUSTOM_BACKEND: &str = "custom";

/// An entry's backend, device and name. Each field is valid UTF-8 no longer than its limit;
/// longer text is cut at the last character boundary within it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Descriptor {
    backend: String,
    device: String,
    name: String,
}

impl Default for Descriptor {
    /// Backend `custom`, no device, no name.
    fn default() -> Self {
        Descriptor::new(CUSTOM_BACKEND, "", "")
    }
}

/// `text` cut to at most `limit` bytes, on a character boundary.
fn bounded(text: &str, limit: usize) -> String {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

impl Descriptor {
    /// A descriptor of `backend` (`opencl`, `vulkan`, `cuda`, or the caller's own; empty
    /// means [`CUSTOM_BACKEND`]), `device` and `name`, each truncated to its limit.
    pub fn new(backend: &str, device: &str, name: &str) -> Descriptor {
        let backend = if backend.is_empty() {
            CUSTOM_BACKEND
        } else {
            backend
        };
        Descriptor {
            backend: bounded(backend, MAX_BACKEND_LEN),
            device: bounded(device, MAX_DEVICE_LEN),
            name: bounded(name, MAX_NAME_LEN),
        }
    }

    pub fn backend(&self) -> &str {
        &self.backend
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes [`Descriptor::encode`] writes.
    pub fn encoded_len(&self) -> usize {
        6 + self.backend.len() + self.device.len() + self.name.len()
    }

    /// Each field as a little-endian u16 length and its bytes: backend, device, name.
    pub fn encode(&self) -> Vec<u8> {
        let fields = [&self.backend, &self.device, &self.name];
        let mut out = Vec::with_capacity(self.encoded_len());
        for field in fields {
            // Within u16 by the limits `new` applies.
            out.extend_from_slice(&(field.len() as u16).to_le_bytes());
            out.extend_from_slice(field.as_bytes());
        }
        out
    }

    /// Parses exactly `bytes` as [`Descriptor::encode`] writes it; `None` when a length runs
    /// past the end, a field is over its limit or not UTF-8, or bytes are left over.
    pub fn decode(bytes: &[u8]) -> Option<Descriptor> {
        let mut rest = bytes;
        let mut field = |limit: usize| -> Option<String> {
            let (len, tail) = rest.split_first_chunk::<2>()?;
            let len = usize::from(u16::from_le_bytes(*len));
            if len > limit || len > tail.len() {
                return None;
            }
            let (text, tail) = tail.split_at(len);
            rest = tail;
            String::from_utf8(text.to_vec()).ok()
        };
        let backend = field(MAX_BACKEND_LEN)?;
        let device = field(MAX_DEVICE_LEN)?;
        let name = field(MAX_NAME_LEN)?;
        rest.is_empty().then_some(Descriptor {
            backend,
            device,
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_defaults() {
        let d = Descriptor::new("opencl", "pthread-cpu", "add mul");
        assert_eq!(Descriptor::decode(&d.encode()), Some(d));
        assert_eq!(Descriptor::new("", "x", "y").backend(), CUSTOM_BACKEND);
        assert_eq!(Descriptor::default().encode(), b"\x06\0custom\0\0\0\0");
    }

    #[test]
    fn truncates_on_character_boundaries() {
        let long = "é".repeat(600);
        let d = Descriptor::new(&"b".repeat(40), &long, &long);
        assert_eq!(d.backend().len(), MAX_BACKEND_LEN);
        assert_eq!(d.device().len(), MAX_DEVICE_LEN);
        assert_eq!(d.name().len(), 1024);
        let odd = Descriptor::new("x", &format!("a{}", "é".repeat(200)), "");
        assert_eq!(odd.device().len(), MAX_DEVICE_LEN - 1);
        assert_eq!(d.encode().len(), MAX_ENCODED_LEN);
        assert_eq!(d.encoded_len(), MAX_ENCODED_LEN);
    }

    #[test]
    fn refuses_malformed_bytes() {
        let good = Descriptor::new("cuda", "gpu", "k").encode();
        assert!(Descriptor::decode(&good[..good.len() - 1]).is_none());
        let mut extra = good.clone();
        extra.push(0);
        assert!(Descriptor::decode(&extra).is_none());
        let mut bad_utf8 = good.clone();
        bad_utf8[2] = 0xff;
        assert!(Descriptor::decode(&bad_utf8).is_none());
        let mut over = vec![33, 0];
        over.extend_from_slice(&[b'a'; 33]);
        over.extend_from_slice(&[0, 0, 0, 0]);
        assert!(Descriptor::decode(&over).is_none());
    }
}
