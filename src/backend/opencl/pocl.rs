//! Warm end to end on PoCL: the stored binary carries the work-group code that launches
//! compiled, so that the next process's first launches compile nothing; and a lone process's
//! miss costs what a plain build costs.
//!
//! A PoCL program binary is PoCL's own directory for the program, packed: its bitcode,
//! work-group code for any local size (compiled by the first binary query, which can take
//! longer than the build, and holds PoCL's compiler meanwhile) and the code specialised for
//! each launch configuration compiled so far. It is packed once, at the first query, and never
//! again. Querying the cached program right after its build would freeze a binary without any
//! launch's code, and compete with the caller's first launches for PoCL's compiler. So on PoCL
//! the bytes are held back ([`DiskBytes::held`](crate::disk::DiskBytes::held)):
//! - when another process waits for the entry, the background writer builds a *sibling* from
//!   the same source ([`Sibling`]) and stores its binary. It costs a build more than querying
//!   the cached program, but it leaves the caller's program alone: PoCL 3.1 aborts
//!   (`pocl_release_dlhandle_cache: Assertion 'found->ref_count > 0' failed`) when a program's
//!   binary is queried on one thread while the caller launches on another; measured in about
//!   one in seven two-process runs of `benches/node.rs`, against none in eighteen with the
//!   sibling. Packing the cached program before its caller has it, and handing the caller a
//!   program loaded from those bytes instead, would save the sibling's compile but never store
//!   the launches' code: PoCL packs a program loaded from a binary as the bytes it was loaded
//!   from, whatever its launches compiled (`docs/node.md`, measured);
//! - at flush (and when the cache is freed), the cached program's binary, which then holds
//!   what its launches compiled: stored, or replacing the sibling's when it is larger. That
//!   query must not meet a launch of the caller's still compiling on PoCL's device threads
//!   (PoCL 3.1 aborts in `pocl_check_kernel_disk_cache`): under the OpenCL layer it runs
//!   behind the layer's gate ([`set_quiet`]), which waits for the application's queues;
//!   callers of the API flush once their launches have finished. The
//!   sibling is never launched: its binary holds the launches' code only when PoCL's own
//!   kernel cache is on and the launches came before the sibling's build (the two programs
//!   then share PoCL's directory for that source). Otherwise it lacks that code, and a process
//!   that loads it compiles it at its first launch. Measured on PoCL 3.1 with the node bench's
//!   kernels, the sibling built before the cached program's first launch, or with
//!   `POCL_KERNEL_CACHE=0`: `saxpy` 49 KB against 63 KB (77 KB after a second launch with
//!   another local size), a new process's first launch from it 50–66 ms against 0.3–0.5 ms;
//!   `matmul_tiled` 74 KB against 105 KB, 268–548 ms against 5–9 ms. With PoCL's cache on and
//!   the sibling built after the launch, the two binaries were byte for byte the same. So the
//!   rewrite at flush is what makes the processes that come later warm; it costs one binary
//!   query per program a waiting process was served.
//!
//! Other drivers' binaries do not change with launches: the cached program is queried right
//! after its build, on the caller's thread, before anything else has it.
//!
//! A PoCL binary also names the directory PoCL unpacks it into when it is loaded, under
//! PoCL's cache directory (`$XDG_CACHE_HOME/pocl/…` by default, one per user). With PoCL's own
//! kernel cache on, the name is a hash of the program, the directory is kept, and its files
//! are written whole (a temporary file renamed), so processes can share it. With the cache off
//! (`POCL_KERNEL_CACHE=0`), it is the random directory the program was built in
//! (`_UNCACHED_xxxxxx`), and PoCL removes it when the loaded program is released: every
//! process that loaded the binary would unpack into, compile its launches' code into and then
//! remove one shared directory, and the others' launches fail (`Final linking of kernel …
//! failed`, or a failed `dlopen` of a file in it; PoCL 3.1, six processes of one user at
//! once). So with the cache off, each load gets a directory of its own: [`loadable`] renames
//! it in the bytes given to PoCL (the stored entry stays as it is).

use std::borrow::Cow;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use super::runtime::{self, ContextRef, Device, DeviceIdentity, Program};
use super::sys::{Api, cl_context};
use crate::Persistence;
use crate::disk::Reported;
use crate::error::BuildError;
use crate::metrics::{self, Backend, Totals};

/// Runs a binary query while none of the application's launches run (the OpenCL layer's gate,
/// see `layer::entry::launches`); an error when that could not be had.
pub(crate) type Quiet = fn(&mut dyn FnMut()) -> Result<(), String>;

static QUIET: OnceLock<Quiet> = OnceLock::new();

/// Makes `quiet` the way the binary of a cached program is asked for once its caller may use
/// it: set by the OpenCL layer, which sees the application's queues and launches.
pub(crate) fn set_quiet(quiet: Quiet) {
    let _ = QUIET.set(quiet);
}

/// `query` run under the layer's gate, when there is one.
fn quietly<T>(query: impl FnOnce() -> T) -> Result<T, String> {
    let Some(quiet) = QUIET.get() else {
        return Ok(query());
    };
    let mut query = Some(query);
    let mut answer = None;
    quiet(&mut || answer = query.take().map(|q| q()))?;
    answer.ok_or_else(|| "the binary query did not run".to_string())
}

/// The binary of `program`, a cached program its callers may be launching: asked for under
/// the layer's gate (see [`set_quiet`]).
pub(super) fn settled_binary(program: &Program) -> Result<Vec<u8>, BuildError> {
    quietly(|| program.binary())
        .map_err(|why| BuildError::new(0, format!("the binary was not taken: {why}")))?
        .map_err(|e| BuildError::new(0, e.to_string()))
}

/// The platform name PoCL reports.
const POCL_PLATFORM: &str = "Portable Computing Language";

/// Whether the binaries of programs built for `identity` are held back (see above).
pub(super) fn applies_to(identity: &DeviceIdentity) -> bool {
    identity.platform_name == POCL_PLATFORM
}

/// The start of every PoCL binary (`POCLCC_STRING_ID`).
const MAGIC: &[u8] = b"poclbin\0";
/// Where a PoCL binary names its program's directory: after the magic, the device id (8
/// bytes), the format version (4), the kernel count (4), the flags (8) and the root entry count
/// (4); a NUL-terminated name of at most 40 bytes (PoCL's `SHA1_digest_t`).
const DIRECTORY_NAME: std::ops::Range<usize> = 36..77;
/// How PoCL starts the names of the directories it removes when a program is released.
const UNCACHED: &str = "_UNCACHED_";

/// `binary` as it is given to PoCL to load: with PoCL's own kernel cache off in this process,
/// renamed to a directory of this load's own (see above).
pub(super) fn loadable(binary: &[u8]) -> Cow<'_, [u8]> {
    if kernel_cache_on() {
        return Cow::Borrowed(binary);
    }
    renamed(binary)
}

/// `binary` naming a directory of its own; anything but a PoCL binary as it is.
fn renamed(binary: &[u8]) -> Cow<'_, [u8]> {
    if binary.len() < DIRECTORY_NAME.end || !binary.starts_with(MAGIC) {
        return Cow::Borrowed(binary);
    }
    let mut renamed = binary.to_vec();
    let name = &mut renamed[DIRECTORY_NAME];
    name.fill(0);
    let unique = unique_name();
    name[..unique.len()].copy_from_slice(unique.as_bytes());
    Cow::Owned(renamed)
}

/// Whether PoCL keeps its kernel cache: `POCL_KERNEL_CACHE` unset (PoCL's default is on) or
/// starting with `1`, as PoCL reads it.
fn kernel_cache_on() -> bool {
    std::env::var_os("POCL_KERNEL_CACHE")
        .is_none_or(|value| value.as_encoded_bytes().starts_with(b"1"))
}

/// A directory name no other load on this machine uses: 40 bytes, PoCL's prefix and a hash
/// of this process, this load and the time (a directory a crashed process left behind keeps
/// the name of a process that is gone).
fn unique_name() -> String {
    static LOADS: AtomicU64 = AtomicU64::new(0);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&LOADS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hasher.update(&now.as_nanos().to_le_bytes());
    let hex = hasher.finalize().to_hex();
    format!(
        "{UNCACHED}{}",
        &hex[..DIRECTORY_NAME.len() - 1 - UNCACHED.len()]
    )
}

/// A second build of a program's source, made on the background writer for its binary.
pub(super) struct Sibling {
    api: &'static Api,
    /// A reference to the cached program: it keeps the context alive until the sibling is
    /// built.
    of: Program,
    context: cl_context,
    device: Device,
    source: String,
    options: CString,
    /// The cache's `source_builds`, and where else the build is counted.
    counts: (Arc<AtomicU64>, Arc<SiblingBuilds>),
}

// SAFETY: the context handle is used only while `of`, which holds a reference to that
// context, is alive; OpenCL contexts are thread-safe (OpenCL 1.1+, appendix A.2).
unsafe impl Send for Sibling {}

impl Sibling {
    pub(super) fn new(
        api: &'static Api,
        of: &Program,
        context: ContextRef<'_>,
        device: Device,
        sources: &[&str],
        options: &CString,
        counts: (Arc<AtomicU64>, Arc<SiblingBuilds>),
    ) -> Option<Sibling> {
        Some(Sibling {
            api,
            of: of.retain().ok()?,
            context: context.raw(),
            device,
            source: sources.concat(),
            options: options.clone(),
            counts,
        })
    }

    /// Builds the sibling and returns its binary.
    pub(super) fn binary(self) -> Result<Vec<u8>, BuildError> {
        // SAFETY: `self.of` holds a reference to the context, so it is live.
        let context = unsafe { ContextRef::from_raw(self.context) };
        let sibling = runtime::build_from_source(
            self.api,
            context,
            self.device,
            &[&self.source],
            &self.options,
        )?;
        drop(self.of);
        let (source_builds, siblings) = self.counts;
        source_builds.fetch_add(1, Ordering::Relaxed);
        siblings.count();
        sibling
            .binary()
            .map_err(|e| BuildError::new(0, e.to_string()))
    }
}

/// The sibling builds of one cache, for what counts compiles outside the cache's statistics:
/// metrics (`kcache_builds_total`, as builds of the OpenCL backend) and the disk directory's
/// figures (`kcache stats`). Never zeroed, as metrics' counters are not.
pub(super) struct SiblingBuilds {
    builds: AtomicU64,
    /// Weak: the disk tier's writer runs the sibling builds, and must not keep it alive.
    disk: Option<Weak<Persistence>>,
}

impl SiblingBuilds {
    /// Listed in metrics until dropped.
    pub(super) fn new(disk: Option<&Arc<Persistence>>) -> Arc<SiblingBuilds> {
        let siblings = Arc::new(SiblingBuilds {
            builds: AtomicU64::new(0),
            disk: disk.map(Arc::downgrade),
        });
        let source: Arc<dyn metrics::Source> = siblings.clone();
        metrics::register(Arc::downgrade(&source));
        siblings
    }

    fn count(&self) {
        self.builds.fetch_add(1, Ordering::Relaxed);
        if let Some(disk) = self.disk.as_ref().and_then(Weak::upgrade) {
            disk.record(Reported {
                builds: 1,
                ..Reported::default()
            });
        }
    }
}

impl metrics::Source for SiblingBuilds {
    fn add_to(&self, totals: &mut Totals) {
        totals.backend(Backend::OpenCl).builds += self.builds.load(Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each load names a directory of its own, NUL-terminated in the header's 41 bytes, and
    /// leaves every other byte alone; bytes that are not a PoCL binary pass unchanged.
    #[test]
    fn each_load_names_a_directory_of_its_own() {
        let mut binary = MAGIC.to_vec();
        binary.extend_from_slice(&[9; 28]);
        binary.extend_from_slice(b"_UNCACHED_abcdef");
        binary.resize(DIRECTORY_NAME.end + 100, 7);
        let (first, second) = (renamed(&binary), renamed(&binary));
        assert_ne!(first[DIRECTORY_NAME], second[DIRECTORY_NAME]);
        for load in [&first, &second] {
            let name = &load[DIRECTORY_NAME];
            assert!(name.starts_with(UNCACHED.as_bytes()), "{name:?}");
            assert_eq!(name[DIRECTORY_NAME.len() - 1], 0, "NUL-terminated");
            assert!(
                name[..DIRECTORY_NAME.len() - 1]
                    .iter()
                    .all(|&b| b == b'_' || b.is_ascii_alphanumeric())
            );
            assert_eq!(load[..DIRECTORY_NAME.start], binary[..DIRECTORY_NAME.start]);
            assert_eq!(load[DIRECTORY_NAME.end..], binary[DIRECTORY_NAME.end..]);
        }
        let other = b"not a PoCL binary, but long enough to hold a header of 77 bytes and more...";
        assert!(matches!(renamed(other), Cow::Borrowed(b) if b == other));
    }
}
