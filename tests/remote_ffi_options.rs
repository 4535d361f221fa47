//! The remote tier configured through the C options of the persistent tiers alone (the
//! `remote_*` fields of `kc_persistence_options`, the environment holding no `KCACHE_REMOTE_*`
//! variable) and handed to backend caches, called as C would call it, with one `redis-server`
//! on loopback. OpenCL on PoCL: a cache writes its program binary to the store under the
//! prefix the options name; a second cache on persistent tiers with another disk directory
//! loads it without compiling. Vulkan on lavapipe under the validation layer: a cache writes a
//! device's pipeline-cache data to the store; a second cache with another disk directory seeds
//! its device's pipeline cache from it.

mod vulkan_common;

use std::ffi::{CStr, CString, c_void};
use std::path::Path;
use std::ptr;

use ash::vk::Handle;
use kcache::backend::vulkan::DeviceOwner;
use kcache::ffi::kc_status;
use kcache::ffi::opencl::*;
use kcache::ffi::persistence::*;
use kcache::ffi::persistence_stats::*;
use kcache::ffi::vulkan::*;
use kcache::ffi::vulkan_spec::*;
use kcache_testkit::cache_data;
use kcache_testkit::ffi::{last_error, pipeline_desc};
use kcache_testkit::opencl::Context;
use kcache_testkit::redis::RedisServer;
use kcache_testkit::vulkan::TestGpu;

const KEY: [u8; 32] = [3; 32];
const SOURCE: &CStr = c"__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }\n";

/// The server's keys, checked to be one: an entry under `prefix`.
fn the_one_entry(server: &RedisServer, prefix: &str) -> Vec<String> {
    let keys = server.keys();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with(prefix) && keys[0].ends_with(".kce"),
        "{keys:?}"
    );
    keys
}

fn c_path(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

/// Persistent tiers on a disk in `dir`, keyed, with the store at `url` under `prefix`, as C
/// opens them; freed on drop.
struct Persistence(*mut kc_persistence);

impl Persistence {
    fn open(dir: &Path, url: &CStr, prefix: &CStr) -> Persistence {
        let dir = c_path(dir);
        let mut opts = kc_persistence_options_default();
        opts.dir = dir.as_ptr();
        opts.key = KEY.as_ptr();
        opts.key_len = KEY.len();
        opts.remote_url = url.as_ptr();
        opts.remote_prefix = prefix.as_ptr();
        opts.remote_timeout_ms = 2000;
        let mut out = ptr::null_mut();
        // SAFETY: valid options (strings live for the call) and out-pointer.
        let status = unsafe { kc_persistence_open(&opts, &mut out) };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        Persistence(out)
    }

    fn stats(&self) -> kc_persistence_statistics {
        kcache_testkit::c_stats!(kc_persistence_stats, self.0, kc_persistence_statistics)
    }
}

impl Drop for Persistence {
    fn drop(&mut self) {
        // SAFETY: from kc_persistence_open, freed once.
        unsafe { kc_persistence_free(self.0) };
    }
}

/// The remote must come from the options alone.
fn assert_no_remote_environment() {
    for (name, _) in std::env::vars_os() {
        assert!(
            !name.to_string_lossy().starts_with("KCACHE_REMOTE_"),
            "{name:?} is set"
        );
    }
}

struct Cache(*mut kc_opencl_cache);

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: a cache from kc_opencl_cache_new, freed once.
        unsafe { kc_opencl_cache_free(self.0) };
    }
}

impl Cache {
    /// A cache on `persistence`, which it holds a reference of its own to.
    fn new(persistence: &Persistence) -> Cache {
        let opts = kc_opencl_options_default();
        let mut cache = ptr::null_mut();
        // SAFETY: valid options, a live persistence object and an out-pointer.
        let status = unsafe { kc_opencl_cache_new(&opts, persistence.0, &mut cache) };
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
        kcache_testkit::c_stats!(kc_opencl_cache_stats, self.0, kc_opencl_cache_statistics)
    }
}

#[test]
fn opencl_caches_share_programs_through_their_c_options_alone() {
    assert_no_remote_environment();
    let Some(context) = Context::for_test() else {
        return;
    };
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = CString::new(server.url()).unwrap();
    let prefix = c"ffi:";
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let a_tiers = Persistence::open(a_dir.path(), &url, prefix);
    let a = Cache::new(&a_tiers).lookup(&context);
    assert_eq!((a.source_builds, a.binary_loads), (1, 0));
    let p = a_tiers.stats();
    assert!(p.remote);
    assert_eq!((p.remote_puts, p.remote_leases, p.remote_errors), (1, 1, 0));
    let keys = the_one_entry(&server, "ffi:");

    let b_tiers = Persistence::open(b_dir.path(), &url, prefix);
    let b = Cache::new(&b_tiers).lookup(&context);
    assert_eq!((b.source_builds, b.binary_loads), (0, 1));
    let p = b_tiers.stats();
    assert_eq!((p.remote_hits, p.remote_puts), (1, 0));
    assert_eq!(server.keys(), keys);
}

/// A Vulkan cache made by `kc_vulkan_cache_new` and a device of its own registered with it,
/// as one process on one machine has them; dropped, it unregisters the device (which writes its
/// data back) and frees the cache (which waits for the remote write).
struct VulkanNode {
    cache: *mut kc_vulkan_cache,
    device: *mut kc_vulkan_device,
    tiers: Persistence,
    /// Dropped after the cache: it checks that the validation layer reported nothing.
    gpu: TestGpu,
}

impl VulkanNode {
    /// `None` when there is no Vulkan device (the test skipped).
    fn new(dir: &Path, url: &CStr, prefix: &CStr) -> Option<VulkanNode> {
        let gpu = TestGpu::for_test()?;
        let mut node = VulkanNode {
            cache: ptr::null_mut(),
            device: ptr::null_mut(),
            tiers: Persistence::open(dir, url, prefix),
            gpu,
        };
        let opts = kc_vulkan_options_default();
        // SAFETY: valid options (the system's loader), a live persistence object and an
        // out-pointer.
        let status = unsafe { kc_vulkan_cache_new(&opts, node.tiers.0, &mut node.cache) };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        // Dispatchable handles cross the C ABI as pointers.
        let raw = |handle: u64| handle as *mut c_void;
        let g = &node.gpu;
        // SAFETY: a live cache; related handles of the system's loader (the one the cache
        // loaded), which outlive the registration (`gpu` is dropped last).
        let status = unsafe {
            kc_vulkan_cache_register_device(
                node.cache,
                raw(g.instance().as_raw()),
                raw(g.physical_device().as_raw()),
                raw(g.device().as_raw()),
                &mut node.device,
            )
        };
        assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        Some(node)
    }

    /// Creates a pipeline (and releases it), then writes the device's data back; returns
    /// whether it wrote to disk.
    fn build_and_flush(&self) -> bool {
        let code = vulkan_common::spirv();
        // No bindings and no push-constant range: the layout is derived from the shader.
        let desc = pipeline_desc(code, &[], &[]);
        let (mut spec, mut lease, mut written) = (ptr::null_mut(), ptr::null_mut(), false);
        // SAFETY: a description whose code is valid for its size; live cache and device; the
        // lease and the description released once.
        unsafe {
            assert_eq!(kc_vulkan_spec_new(&desc, &mut spec), kc_status::KC_OK);
            let status = kc_vulkan_cache_find_or_build(self.cache, self.device, spec, &mut lease);
            assert_eq!(status, kc_status::KC_OK, "{}", last_error());
            assert_ne!(kc_vulkan_lease_pipeline(lease), 0);
            kc_vulkan_lease_release(lease);
            kc_vulkan_spec_free(spec);
            let status = kc_vulkan_cache_flush(self.cache, self.device, &mut written);
            assert_eq!(status, kc_status::KC_OK, "{}", last_error());
        }
        assert_eq!(self.gpu.validation_messages(), Vec::<String>::new());
        written
    }

    fn stats(&self) -> kc_vulkan_cache_statistics {
        kcache_testkit::c_stats!(
            kc_vulkan_cache_stats,
            self.cache,
            kc_vulkan_cache_statistics
        )
    }
}

impl Drop for VulkanNode {
    fn drop(&mut self) {
        let mut still_leased = u64::MAX;
        // SAFETY: the device (or NULL) of this live cache (or NULL), each released once.
        let status = unsafe {
            let status =
                kc_vulkan_cache_unregister_device(self.cache, self.device, &mut still_leased);
            kc_vulkan_cache_free(self.cache);
            status
        };
        if !std::thread::panicking() && !self.device.is_null() {
            assert_eq!((status, still_leased), (kc_status::KC_OK, 0));
        }
    }
}

#[test]
fn vulkan_caches_share_pipeline_cache_data_through_their_c_options_alone() {
    assert_no_remote_environment();
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = CString::new(server.url()).unwrap();
    let prefix = c"vk:";
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    let Some(a) = VulkanNode::new(a_dir.path(), &url, prefix) else {
        return;
    };
    assert!(a.build_and_flush(), "its disk had nothing");
    let s = a.stats();
    assert_eq!(
        (
            s.pipelines_created,
            s.cache_data_missing,
            s.cache_data_loaded
        ),
        (1, 1, 0)
    );
    assert_eq!(s.cache_data_written, 1);
    let p = a.tiers.stats();
    assert!(p.remote);
    // Nothing in the store at registration, nor when the write-back read it to merge.
    assert_eq!((p.remote_misses, p.remote_hits, p.remote_errors), (2, 0, 0));
    drop(a);
    let keys = the_one_entry(&server, "vk:");

    let Some(b) = VulkanNode::new(b_dir.path(), &url, prefix) else {
        return;
    };
    assert_eq!(
        cache_data!(b.stats()),
        (1, 1, 0),
        "missing on disk, seeded from the remote"
    );
    let p = b.tiers.stats();
    assert_eq!(
        (p.remote_hits, p.remote_misses, p.remote_rejects),
        (1, 0, 0)
    );
    drop(b);
    assert_eq!(server.keys(), keys);
}
