//! Which build of a run-time library (the driver, NVRTC) is loaded: what the disk keys hold, as
//! the library's version call gives only the CUDA release (NVRTC's `nvrtcVersion`: 13.2, for
//! every 13.2 patch release, whose code generation may differ).

use std::ffi::{CStr, OsStr, c_void};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The build identity of the loaded library that holds `symbol` (`fallback` names it when the
/// loader cannot say): its real file name, links resolved, as `libcuda.so.1` links to
/// `libcuda.so.<build>` and a CUDA toolkit's `libnvrtc.so.12` to `libnvrtc.so.12.4.127`. A
/// name that carries no build (a regular file named by its soname, as some containers install
/// the driver and as NVIDIA's Python wheels install NVRTC) is completed with the file's size
/// and a digest of its content: a same-named update would otherwise reuse the older build's
/// binaries. The digest is read once per file and process (`what` names the library in the
/// log's note of it).
pub(super) fn loaded_build(symbol: *const c_void, fallback: &Path, what: &str) -> String {
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `symbol` is an address in a loaded library (or not, and dladdr returns 0); `info`
    // is a live local.
    let found = unsafe { libc::dladdr(symbol, &mut info) } != 0 && !info.dli_fname.is_null();
    let path = if found {
        // SAFETY: dladdr set `dli_fname` to the NUL-terminated name of a loaded object, which
        // stays loaded while the library is open.
        let name = unsafe { CStr::from_ptr(info.dli_fname) };
        PathBuf::from(OsStr::from_bytes(name.to_bytes()))
    } else {
        fallback.to_path_buf()
    };
    let real = std::fs::canonicalize(&path).unwrap_or(path);
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if names_a_build(&name) {
        return name;
    }
    format!("{name} ({})", content_identity(&real, what))
}

/// `<size> bytes, blake3 <digest>` of the file at `real`, remembered per file, size and
/// modification time for the rest of the process: a library of a hundred megabytes
/// (NVRTC's) is read once, however many caches load it.
fn content_identity(real: &Path, what: &str) -> String {
    type Seen = (PathBuf, u64, Option<SystemTime>, String);
    static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
    let metadata = std::fs::metadata(real).ok();
    let size = metadata.as_ref().map_or(0, |m| m.len());
    let modified = metadata.and_then(|m| m.modified().ok());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((.., identity)) = seen
        .iter()
        .find(|(p, s, m, _)| p == real && *s == size && *m == modified)
    {
        return identity.clone();
    }
    let identity = match digest(real) {
        Ok(digest) => format!("{size} bytes, blake3 {digest}"),
        Err(e) => {
            // Unreadable (a file of another user's, gone since): the size alone, said once.
            crate::log::log(crate::log::Level::Warn, || {
                format!(
                    "the {what} library {} cannot be read ({e}): its size ({size} bytes) \
                     stands in for its build in the disk keys",
                    real.display()
                )
            });
            format!("{size} bytes")
        }
    };
    seen.push((real.to_path_buf(), size, modified, identity.clone()));
    identity
}

/// The BLAKE3 digest of the file's content, in hex.
fn digest(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize().to_hex().to_string());
        }
        hasher.update(&buf[..n]);
    }
}

/// Whether a library file name carries a build: at least two numbers after `.so.`
/// (`libcuda.so.550.54.15`, `libnvrtc.so.12.4.127`), not a bare soname (`libcuda.so.1`).
fn names_a_build(name: &str) -> bool {
    name.split_once(".so.")
        .is_some_and(|(_, version)| version.split('.').filter(|p| !p.is_empty()).count() >= 2)
}

#[cfg(test)]
mod tests {
    use super::{content_identity, names_a_build};

    #[test]
    fn a_build_is_two_numbers_after_so() {
        assert!(names_a_build("libcuda.so.550.54.15"));
        assert!(names_a_build("libnvrtc.so.12.4.127"));
        assert!(!names_a_build("libcuda.so.1"));
        assert!(!names_a_build("libnvrtc.so"));
        assert!(!names_a_build("libnvrtc.so.12"));
    }

    /// Two files of one name and size differ by their content's digest.
    #[test]
    fn a_file_that_names_no_build_is_known_by_its_content() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(a.path().join("libnvrtc.so.13"), b"build one").unwrap();
        std::fs::write(b.path().join("libnvrtc.so.13"), b"build two").unwrap();
        let first = content_identity(&a.path().join("libnvrtc.so.13"), "NVRTC");
        let second = content_identity(&b.path().join("libnvrtc.so.13"), "NVRTC");
        assert!(first.starts_with("9 bytes, blake3 "), "{first}");
        assert_eq!(
            first,
            format!("9 bytes, blake3 {}", blake3::hash(b"build one").to_hex())
        );
        assert_ne!(first, second);
    }
}
