//! Vulkan's pipeline-cache data through the remote tier, on lavapipe with the validation layer
//! and a real `redis-server` on loopback: "nodes" with disk directories of their own share a
//! device's blob through the store. A node with an empty disk is seeded from the remote's blob
//! and copies it to its disk at its write-back; a write-back merges the remote's blob before
//! writing there; a changed blob is rejected and counted, and replaced by the next write; a
//! read-only node writes no key; a process configured by the environment alone gets it all.
//!
//! lavapipe serializes no pipelines (its data is the 32-byte header), so what travels is a
//! header and no pipeline creation is faster for it; the counts are what can be checked.

mod vulkan_common;

use std::sync::Arc;
use std::time::Duration;

use kcache::backend::vulkan::{
    HEADER_LEN, VulkanCache, VulkanDevice, VulkanOptions, check_cache_header,
};
use kcache::disk::{Durability, OperatorKey};
use kcache::remote::{RemoteConfig, RemoteStats};
use kcache::{Persistence, PersistenceConfig};
use kcache_testkit::redis::RedisServer;
use kcache_testkit::vulkan::TestGpu;
use kcache_testkit::{cache_data, rerun_test, successful_stdout, write_key_file};
use tempfile::TempDir;
use vulkan_common::{dispatch, expected, spec, vulkan};

const KEY: [u8; 32] = [7; 32];

/// A "node": a disk directory of its own with the shared remote behind it, a device and a
/// Vulkan cache on them, as a new process on another machine would have.
struct Node {
    gpu: Arc<TestGpu>,
    disk: Arc<Persistence>,
    cache: VulkanCache,
    device: VulkanDevice,
    _dir: TempDir,
}

impl Node {
    /// `None` when there is no Vulkan device (the test skipped).
    fn new(server: &RedisServer, read_only: bool) -> Option<Node> {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(
            Persistence::open(PersistenceConfig {
                key: Some(OperatorKey::new(KEY.to_vec()).unwrap()),
                durability: Durability::Relaxed,
                remote: Some(RemoteConfig {
                    read_only: Some(read_only),
                    timeout: Some(Duration::from_secs(2)),
                    ..RemoteConfig::at(server.url())
                }),
                ..PersistenceConfig::in_dir(dir.path())
            })
            .unwrap(),
        );
        let (gpu, cache, device) = registered(&disk)?;
        Some(Node {
            gpu,
            disk,
            cache,
            device,
            _dir: dir,
        })
    }

    fn build_and_dispatch(&self, mul: u32) {
        let lease = self.cache.find_or_build(&self.device, &spec(mul)).unwrap();
        assert_eq!(dispatch(&self.gpu, &lease, 4), expected(mul, 4));
    }

    /// Writes back, then waits for the background writer (the remote write).
    fn flush(&self) -> bool {
        let wrote = self.cache.flush(&self.device).unwrap();
        self.disk.flush();
        wrote
    }

    fn remote(&self) -> RemoteStats {
        self.disk.remote_stats().expect("a remote tier")
    }

    /// The device's pipeline-cache data on this node's disk.
    fn disk_blob(&self) -> Option<Vec<u8>> {
        self.disk
            .get(&self.device.pipeline_cache_key())
            .unwrap()
            .map(|e| e.into_payload())
    }

    /// The store's key of the device's pipeline-cache data.
    fn remote_key(&self) -> String {
        let path = self.disk.entry_path(&self.device.pipeline_cache_key());
        format!("kcache:{}", path.file_name().unwrap().to_str().unwrap())
    }
}

/// A new device registered with a new cache on `disk`.
fn registered(disk: &Arc<Persistence>) -> Option<(Arc<TestGpu>, VulkanCache, VulkanDevice)> {
    let gpu = Arc::new(TestGpu::for_test()?);
    let cache = VulkanCache::new(VulkanOptions {
        persistence: Some(disk.clone()),
        vulkan: Some(vulkan()),
        ..VulkanOptions::default()
    })
    .unwrap();
    let device = cache.register_owned_device(gpu.clone()).unwrap();
    Some((gpu, cache, device))
}

#[test]
fn a_node_with_an_empty_disk_is_seeded_from_the_remote_and_keeps_a_disk_copy() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let Some(first) = Node::new(&server, false) else {
        return;
    };
    assert_eq!(first.cache.stats().cache_data_missing, 1);
    assert_eq!(first.remote().misses, 1, "nothing in the store yet");
    first.build_and_dispatch(3);
    assert!(first.flush());
    let r = first.remote();
    // The write-back read the store once more to merge, then wrote.
    assert_eq!((r.misses, r.hits, r.puts), (2, 0, 1));
    assert_eq!(server.keys(), vec![first.remote_key()]);
    // The remote holds the disk's entry, sealed the same way.
    let entry = server.get(&first.remote_key());
    let on_disk = std::fs::read(first.disk.entry_path(&first.device.pipeline_cache_key())).unwrap();
    assert_eq!(entry, on_disk);
    assert_eq!(r.bytes_written, entry.len() as u64);
    let blob = first.disk_blob().unwrap();

    let Some(second) = Node::new(&server, false) else {
        return;
    };
    assert_eq!(
        cache_data!(second.cache.stats()),
        (1, 1, 0),
        "missing on disk, loaded from the remote"
    );
    let r = second.remote();
    assert_eq!((r.hits, r.misses, r.rejects), (1, 0, 0));
    assert_eq!(r.bytes_read, entry.len() as u64);
    assert!(blob.len() >= HEADER_LEN);
    check_cache_header(&blob, second.device.identity()).unwrap();
    assert_eq!(second.disk_blob(), None, "copied at the write-back");
    second.build_and_dispatch(3);
    let s = second.cache.stats();
    assert_eq!((s.memory.builds, s.pipelines_created), (1, 1));

    assert_eq!(second.cache.unregister_device(&second.device).unwrap(), 0);
    second.disk.flush();
    let s = second.cache.stats();
    assert_eq!((s.cache_data_written, s.cache_data_merged), (1, 0));
    let copy = second
        .disk_blob()
        .expect("the remote's data copied to disk");
    let r = second.remote();
    // The write-back's read found the blob it was seeded from: nothing to merge, and a write
    // only if this node's data differs (lavapipe's does not).
    assert_eq!((r.hits, r.rejects), (2, 0));
    assert_eq!(r.puts, u64::from(copy != blob));
    assert_eq!(copy, blob);
    assert_eq!(server.keys(), vec![first.remote_key()]);
}

#[test]
fn a_write_back_merges_another_nodes_remote_data_first() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let Some(a) = Node::new(&server, false) else {
        return;
    };
    let Some(b) = Node::new(&server, false) else {
        return;
    };
    a.build_and_dispatch(2);
    b.build_and_dispatch(5);
    assert!(a.flush());
    assert_eq!(
        a.cache.stats().cache_data_merged,
        0,
        "nothing stored before"
    );
    let a_blob = a.disk_blob().unwrap();

    assert!(b.flush(), "b's disk had nothing");
    assert_eq!(
        b.cache.stats().cache_data_merged,
        1,
        "a's remote data merged into b's before b writes"
    );
    let b_blob = b.disk_blob().unwrap();
    check_cache_header(&b_blob, b.device.identity()).unwrap();
    // b writes to the store only when the merge made data a's blob lacks (lavapipe's does not).
    assert_eq!(b.remote().puts, u64::from(b_blob != a_blob));
    assert_eq!(b.remote().hits, 1);
    b.build_and_dispatch(6);
    assert!(!b.flush(), "nothing new: the driver's data is unchanged");
    assert_eq!(
        b.cache.stats().cache_data_merged,
        1,
        "the blob merged already is not merged again"
    );
}

#[test]
fn a_changed_remote_blob_is_rejected_counted_and_replaced() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let Some(first) = Node::new(&server, false) else {
        return;
    };
    first.build_and_dispatch(3);
    assert!(first.flush());
    let name = first.remote_key();
    let mut entry = server.get(&name);
    let last = entry.len() - 1;
    entry[last] ^= 1;
    server.set(&name, &entry);

    let Some(second) = Node::new(&server, false) else {
        return;
    };
    let s = second.cache.stats();
    assert_eq!(
        (s.cache_data_missing, s.cache_data_loaded),
        (1, 0),
        "the pipeline cache starts empty"
    );
    let r = second.remote();
    assert_eq!((r.hits, r.misses, r.rejects), (0, 1, 1));
    second.build_and_dispatch(3);
    assert!(second.flush());
    let r = second.remote();
    assert_eq!(
        (r.rejects, r.puts),
        (1, 1),
        "read again at the write-back, the same bytes not counted again, and written over"
    );
    assert_ne!(server.get(&name), entry);

    let Some(third) = Node::new(&server, false) else {
        return;
    };
    assert_eq!(third.cache.stats().cache_data_loaded, 1);
    assert_eq!((third.remote().hits, third.remote().rejects), (1, 0));
}

#[test]
fn a_read_only_node_writes_no_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let Some(reader) = Node::new(&server, true) else {
        return;
    };
    reader.build_and_dispatch(3);
    assert!(reader.flush(), "its own disk is written");
    assert!(reader.disk_blob().is_some());
    assert!(server.keys().is_empty(), "{:?}", server.keys());
    let r = reader.remote();
    // Read once at registration; a node that does not write does not read to merge.
    assert_eq!((r.misses, r.hits, r.puts, r.bytes_written), (1, 0, 0, 0));

    let Some(writer) = Node::new(&server, false) else {
        return;
    };
    writer.build_and_dispatch(3);
    assert!(writer.flush());
    let stored = server.get(&writer.remote_key());

    let Some(reader) = Node::new(&server, true) else {
        return;
    };
    assert_eq!(reader.cache.stats().cache_data_loaded, 1);
    assert_eq!(reader.remote().hits, 1);
    reader.build_and_dispatch(4);
    assert!(reader.flush(), "the remote's data copied to its disk");
    assert!(reader.disk_blob().is_some());
    assert_eq!(server.keys(), vec![writer.remote_key()]);
    assert_eq!(server.get(&writer.remote_key()), stored);
    assert_eq!(reader.remote().puts, 0);
}

/// Set in the child processes of the environment test.
const CHILD: &str = "KCACHE_TEST_REMOTE_VULKAN_CHILD";

#[test]
fn processes_configured_by_the_environment_share_the_data() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let Some(server) = RedisServer::start() else {
        return;
    };
    // The children need a device too; without one they would print no counters.
    let Some(_) = TestGpu::for_test() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let key_file = tmp.path().join("operator.key");
    write_key_file(&key_file, &KEY);
    let run = |node: &str| {
        let name = "processes_configured_by_the_environment_share_the_data";
        let mut cmd = rerun_test(name);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("KCACHE_") {
                cmd.env_remove(name);
            }
        }
        cmd.env(CHILD, "1")
            .env("KCACHE_DIR", tmp.path().join(node))
            .env("KCACHE_KEY_FILE", &key_file)
            .env("KCACHE_REMOTE_URL", server.url());
        let out = successful_stdout(node, &mut cmd);
        let at = out
            .find("loaded=")
            .unwrap_or_else(|| panic!("{node} printed no counters:\n{out}"));
        out[at..].lines().next().unwrap().to_owned()
    };
    assert_eq!(run("first"), "loaded=0 hits=0 puts=1");
    assert_eq!(server.keys().len(), 1);
    // Its write-back reads the blob again (a second hit) and, its data being the same
    // (lavapipe's header), writes none.
    assert_eq!(run("second"), "loaded=1 hits=2 puts=0");
}

/// One process: a disk tier from the environment alone, a device built on and dropped (which
/// writes back); prints its counters.
fn child() {
    let disk = Arc::new(Persistence::open(PersistenceConfig::from_env()).unwrap());
    let Some((gpu, cache, device)) = registered(&disk) else {
        return;
    };
    let loaded = cache.stats().cache_data_loaded;
    let lease = cache.find_or_build(&device, &spec(7)).unwrap();
    assert_eq!(dispatch(&gpu, &lease, 1), expected(7, 1));
    drop(lease);
    drop(cache);
    disk.flush();
    let r = disk
        .remote_stats()
        .expect("the remote tier from the environment");
    println!("loaded={loaded} hits={} puts={}", r.hits, r.puts);
}
