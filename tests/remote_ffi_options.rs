//! The remote tier configured through a backend's own C options alone (`kc_opencl_options`'s
//! `remote_*` fields, the environment holding no `KCACHE_REMOTE_*` variable), called as C
//! would call it: OpenCL on PoCL, one `redis-server` on loopback. A cache writes its program
//! binary to the store under the prefix its options name; a second cache with another disk
//! directory loads it without compiling. A caller compiled against the layout before the
//! remote fields gets no remote, whatever lies past its `struct_size`.

use std::ffi::{CStr, CString};
use std::mem::offset_of;
use std::path::Path;
use std::ptr;

use kcache::ffi::opencl::*;
use kcache::ffi::{kc_last_error_message, kc_status};
use kcache_testkit::opencl::Context;
use kcache_testkit::redis::RedisServer;

const KEY: [u8; 32] = [3; 32];
const SOURCE: &CStr = c"__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }\n";

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next kcache call on this thread.
    unsafe { CStr::from_ptr(kc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

struct Cache(*mut kc_opencl_cache);

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: a cache from kc_opencl_cache_new, freed once.
        unsafe { kc_opencl_cache_free(self.0) };
    }
}

impl Cache {
    /// A cache on a disk in `dir`, keyed, with the store at `url` under `prefix`, as a caller
    /// whose `kc_opencl_options` is `struct_size` bytes sets it up.
    fn new(dir: &Path, url: &CStr, prefix: &CStr, struct_size: usize) -> Cache {
        let dir = CString::new(dir.to_str().unwrap()).unwrap();
        let mut opts = kc_opencl_options_default();
        opts.struct_size = struct_size;
        opts.use_disk = true;
        opts.disk_dir = dir.as_ptr();
        opts.disk_key = KEY.as_ptr();
        opts.disk_key_len = KEY.len();
        opts.remote_url = url.as_ptr();
        opts.remote_prefix = prefix.as_ptr();
        opts.remote_timeout_ms = 2000;
        let mut cache = ptr::null_mut();
        // SAFETY: valid options (strings live for the call) and out-pointer.
        let status = unsafe { kc_opencl_cache_new(&opts, &mut cache) };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        Cache(cache)
    }

    /// Looks the program up (and releases it), flushes, and returns the counters.
    fn lookup(&self, context: &Context) -> kc_opencl_cache_statistics {
        let sources = [SOURCE.as_ptr()];
        let mut lease = ptr::null_mut();
        // SAFETY: a live cache, context and device; one NUL-terminated source; no options.
        let status = unsafe {
            kc_opencl_cache_find_or_build(
                self.0,
                context.context().raw(),
                context.device().raw(),
                sources.as_ptr(),
                ptr::null(),
                1,
                ptr::null(),
                &mut lease,
            )
        };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        // SAFETY: the lease just returned, released once; the cache is live.
        unsafe {
            assert!(!kc_opencl_lease_program(lease).is_null());
            kc_opencl_lease_release(lease);
            assert_eq!(kc_opencl_cache_flush(self.0), kc_status::KC_OK);
        }
        let mut out = kc_opencl_cache_statistics {
            struct_size: size_of::<kc_opencl_cache_statistics>(),
            ..Default::default()
        };
        // SAFETY: a live cache and a writable struct of its size.
        assert_eq!(
            unsafe { kc_opencl_cache_stats(self.0, &mut out) },
            kc_status::KC_OK
        );
        out
    }
}

#[test]
fn opencl_caches_share_programs_through_their_c_options_alone() {
    for (name, _) in std::env::vars_os() {
        assert!(
            !name.to_string_lossy().starts_with("KCACHE_REMOTE_"),
            "{name:?} is set"
        );
    }
    let Ok(context) = Context::first_device() else {
        panic!("no OpenCL device: PoCL must be installed");
    };
    let server = RedisServer::start();
    let url = CString::new(server.url()).unwrap();
    let prefix = c"ffi:";
    let size = size_of::<kc_opencl_options>();
    let (a_dir, b_dir, old_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );

    let a = Cache::new(a_dir.path(), &url, prefix, size).lookup(&context);
    assert_eq!((a.source_builds, a.binary_loads), (1, 0));
    assert!(a.disk.remote);
    assert_eq!(
        (
            a.disk.remote_puts,
            a.disk.remote_leases,
            a.disk.remote_errors
        ),
        (1, 1, 0)
    );
    let keys = server.keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with("ffi:") && keys[0].ends_with(".kce"),
        "{keys:?}"
    );

    let b = Cache::new(b_dir.path(), &url, prefix, size).lookup(&context);
    assert_eq!((b.source_builds, b.binary_loads), (0, 1));
    assert_eq!((b.disk.remote_hits, b.disk.remote_puts), (1, 0));
    assert_eq!(server.keys(), keys);

    // The 2.4 layout ended before `remote_url`: what lies past it is not read.
    let older = offset_of!(kc_opencl_options, remote_url);
    let old = Cache::new(old_dir.path(), &url, prefix, older).lookup(&context);
    assert_eq!((old.source_builds, old.binary_loads), (1, 0));
    assert!(!old.disk.remote);
    assert_eq!(server.keys(), keys);
}
