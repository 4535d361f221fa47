//! The objects a store's reads refused lately, by entry name and content digest: a lookup
//! looks at an entry more than once (its first read, then again once it holds the lease, and a
//! waiting node every poll), and the same refused object is then neither verified nor counted
//! again. A verdict is the same for the same bytes under the same name.

use std::collections::VecDeque;

use parking_lot::Mutex;

/// Verdicts kept: the names a process has looked up while their objects were refused; the
/// oldest goes first (forgetting one costs a verification and a reject counted again).
const KEPT: usize = 64;

#[derive(Default)]
pub(crate) struct Rejected {
    seen: Mutex<VecDeque<(String, blake3::Hash)>>,
}

impl Rejected {
    /// Whether the object of `digest` ([`blake3::hash`] of its bytes) is the one last
    /// refused under `name`.
    pub(crate) fn already(&self, name: &str, digest: &blake3::Hash) -> bool {
        let seen = self.seen.lock();
        seen.iter().any(|(n, d)| n == name && d == digest)
    }

    /// Whether an object under `name` was refused lately (whatever it holds now).
    pub(crate) fn named(&self, name: &str) -> bool {
        self.seen.lock().iter().any(|(n, _)| n == name)
    }

    /// Records that the object of `digest` under `name` was refused.
    pub(crate) fn record(&self, name: &str, digest: blake3::Hash) {
        let mut seen = self.seen.lock();
        seen.retain(|(n, _)| n != name);
        if seen.len() == KEPT {
            seen.pop_front();
        }
        seen.push_back((name.to_owned(), digest));
    }

    /// Forgets `name`'s verdict (its object was accepted).
    pub(crate) fn forget(&self, name: &str) {
        self.seen.lock().retain(|(n, _)| n != name);
    }

    /// `verify`'s verdict on `bytes`, the object under `name` read up to one byte over the
    /// entry size limit `limit` (a larger object is refused unverified), unless it is the
    /// object last refused there (`None`: refused again, neither verified nor counted). A
    /// refusal is recorded, an acceptance forgets the name's verdict.
    pub(crate) fn judge<T>(
        &self,
        name: &str,
        bytes: Vec<u8>,
        limit: u64,
        verify: impl FnOnce(Vec<u8>) -> Result<T, String>,
    ) -> Option<Result<T, String>> {
        let digest = blake3::hash(&bytes);
        if self.already(name, &digest) {
            crate::log::debug(|| format!("{name}: the object refused already: not read again"));
            return None;
        }
        let verdict = if bytes.len() as u64 > limit {
            Err(format!("larger than the entry size limit of {limit} bytes"))
        } else {
            verify(bytes)
        };
        match &verdict {
            Ok(_) => self.forget(name),
            Err(_) => self.record(name, digest),
        }
        Some(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_holds_for_the_same_bytes_under_the_same_name() {
        let r = Rejected::default();
        let (tampered, other) = (blake3::hash(b"tampered"), blake3::hash(b"other"));
        r.record("a", tampered);
        assert!(r.already("a", &tampered) && r.named("a"));
        assert!(!r.already("a", &other) && !r.already("b", &tampered));
        r.forget("a");
        assert!(!r.already("a", &tampered) && !r.named("a"));
        for i in 0..=KEPT {
            r.record(&i.to_string(), other);
        }
        assert!(!r.named("0") && r.named("1") && r.named(&KEPT.to_string()));
    }
}
