//! Prometheus metrics of every live cache in the process, in the text exposition format
//! (version 0.0.4): [`render`](crate::metrics::render) here, `kc_metrics_render` in C. `docs/metrics.md` lists the
//! families.
//!
//! Each memory tier and each disk tier registers itself when it is created (a weak reference
//! in a process-wide list, `registry`) and drops out when it is freed. Rendering reads the
//! counters every tier keeps anyway, so a hit pays nothing for metrics; the build-duration
//! histogram is recorded where builds are counted, never on a hit. Caches of one backend are
//! summed, and so are the memory tiers and the disk tiers of all backends: labels name a
//! backend, a tier, a result or a reason, never a key or a path.
//!
//! - `text`: the exposition format, shared with the `kcache metrics` command.
//! - `directory`: a directory's counters, every process's added up, under the same names:
//!   what `kcache metrics` writes of them.
//! - `histogram`: build durations in fixed buckets.

mod directory;
mod histogram;
mod registry;
pub mod text;

use crate::disk::DiskStats;
use crate::memory::stats as memory;
use crate::store::{RemoteStats, StoreKind};

pub use directory::write_directory_counters;
pub use histogram::BUILD_BUCKETS;
pub(crate) use histogram::Histogram;
pub(crate) use registry::{Source, register};
use text::{Exposition, Kind};

/// What a memory tier belongs to: the `backend` label of its builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// A cache made through the Rust API (`MemoryCache`, `TieredCache`).
    Rust,
    /// A cache made through the C API (`kc_cache_new`, with `kc_tiered_find_or_build`).
    C,
    OpenCl,
    Vulkan,
    Cuda,
}

impl Backend {
    pub const ALL: [Backend; 5] = [
        Backend::Rust,
        Backend::C,
        Backend::OpenCl,
        Backend::Vulkan,
        Backend::Cuda,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Rust => "rust",
            Backend::C => "c",
            Backend::OpenCl => "opencl",
            Backend::Vulkan => "vulkan",
            Backend::Cuda => "cuda",
        }
    }
}

/// One backend's memory tiers, added up.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct BackendTotals {
    pub caches: u64,
    pub builds: u64,
    pub loads: u64,
    pub build_failures: u64,
    pub durations: histogram::Tally,
}

/// Every live cache's figures, added up.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    /// Indexed as [`Backend::ALL`].
    pub backends: [BackendTotals; Backend::ALL.len()],
    /// Every memory tier's counters (`leases` is not taken: it walks the tables).
    pub memory: memory::Stats,
    pub disk_tiers: u64,
    pub disk: DiskStats,
    /// Every disk tier's remote tier, added up (`breaker_open` unused: see
    /// `remote_breakers_open`).
    pub remote: RemoteStats,
    /// Each kind of store's counters apart, indexed as [`StoreKind::ALL`].
    pub stores: [RemoteStats; StoreKind::ALL.len()],
    pub remote_tiers: u64,
    pub remote_breakers_open: u64,
}

impl Totals {
    pub(crate) fn backend(&mut self, backend: Backend) -> &mut BackendTotals {
        &mut self.backends[backend as usize]
    }
}

/// `$into.f += $from.f` for every listed field.
macro_rules! add_fields {
    ($into:expr, $from:expr; $($field:ident),+ $(,)?) => {
        $($into.$field += $from.$field;)+
    };
}

impl std::ops::AddAssign for memory::Stats {
    /// Another cache's counters added to these (metrics sum the caches of a process).
    fn add_assign(&mut self, other: Self) {
        add_fields!(self, other; hits, misses, builds, loads, build_failures, waits, discarded,
            capacity_evictions, device_evictions, clears, destroys, destroy_errors, entries,
            weight, leases);
    }
}

impl std::ops::AddAssign for DiskStats {
    /// Another disk tier's counters added to these (`scan_complete` stays as it was).
    fn add_assign(&mut self, other: Self) {
        add_fields!(self, other; hits, misses, puts, bytes_read, bytes_written,
            integrity_rejects, io_errors, evictions, removes, load_failures, lock_waits,
            lock_timeouts, lock_takeovers, pending_writes, failed_writes, entries, bytes);
    }
}

impl std::ops::AddAssign for RemoteStats {
    /// Another remote tier's counters added to these (`breaker_open` stays as it was).
    fn add_assign(&mut self, other: Self) {
        add_fields!(self, other; hits, misses, rejects, errors, timeouts, skipped,
            breaker_trips, leases, lease_waits, lease_timeouts, puts, bytes_read, bytes_written,
            lease_failures, leases_lost, conditional_writes_ignored);
    }
}

/// Writes `kcache_build_info{version}`, which every exposition of kcache starts with.
pub fn write_build_info(out: &mut Exposition) {
    out.family(
        "kcache_build_info",
        Kind::Gauge,
        "The kcache version; always 1.",
    )
    .sample(
        "kcache_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
}

/// The metrics of every cache alive in this process, in the Prometheus text format.
pub fn render() -> String {
    let totals = registry::collect();
    let mut out = Exposition::new();
    write_build_info(&mut out);
    write_backends(&mut out, &totals);
    write_tiers(&mut out, &totals);
    out.finish()
}

fn write_backends(out: &mut Exposition, totals: &Totals) {
    let backends = || Backend::ALL.iter().map(|b| b.name()).zip(&totals.backends);
    out.family(
        "kcache_caches",
        Kind::Gauge,
        "Memory tiers alive, by what made them.",
    )
    .series(
        "kcache_caches",
        &[],
        "backend",
        backends().map(|(b, t)| (b, t.caches)),
    );
    out.family(
        "kcache_builds_total",
        Kind::Counter,
        "Values compiled on a miss (loads from disk are not builds), by outcome.",
    );
    for (backend, t) in backends() {
        let outcomes = [("ok", t.builds), ("failed", t.build_failures)];
        out.series(
            "kcache_builds_total",
            &[("backend", backend)],
            "result",
            outcomes,
        );
    }
    out.family(
        "kcache_loads_total",
        Kind::Counter,
        "Values a miss loaded from the disk or a remote tier instead of building them.",
    )
    .series(
        "kcache_loads_total",
        &[],
        "backend",
        backends().map(|(b, t)| (b, t.loads)),
    );
    out.family(
        "kcache_build_duration_seconds",
        Kind::Histogram,
        "How long builds took, failed ones included.",
    );
    for (backend, t) in backends() {
        let buckets = t.durations.buckets();
        out.histogram(
            "kcache_build_duration_seconds",
            &[("backend", backend)],
            &buckets,
        );
    }
}

fn write_tiers(out: &mut Exposition, totals: &Totals) {
    let (m, d, r) = (&totals.memory, &totals.disk, &totals.remote);
    write_lookups(
        out,
        "Lookups by tier and result; a memory lookup that joined a build in flight is a wait.",
        &[("hit", m.hits), ("miss", m.misses), ("wait", m.waits)],
        [d.hits, d.misses],
        [r.hits, r.misses],
    );
    out.family(
        "kcache_entries",
        Kind::Gauge,
        "Entries by tier: values in memory, entry files in the directories of the disk tiers.",
    )
    .series(
        "kcache_entries",
        &[],
        "tier",
        [("memory", m.entries), ("disk", d.entries)],
    );
    out.family(
        "kcache_memory_weight",
        Kind::Gauge,
        "Total weight of the values in memory, in the units their builds reported.",
    )
    .sample("kcache_memory_weight", &[], m.weight);
    let evictions = "kcache_evictions_total";
    let family = out.family(
        evictions,
        Kind::Counter,
        "Entries removed other than by clear: by a cap, for a destroyed device, by remove, \
         or refused by the runtime.",
    );
    let memory = [
        ("capacity", m.capacity_evictions),
        ("device", m.device_evictions),
    ];
    let disk = [
        ("capacity", d.evictions),
        ("removed", d.removes),
        ("unloadable", d.load_failures),
    ];
    for (tier, reasons) in [("memory", &memory[..]), ("disk", &disk[..])] {
        family.series(
            evictions,
            &[("tier", tier)],
            "reason",
            reasons.iter().copied(),
        );
    }
    let [waits, timeouts, takeovers] =
        lock_counters(d.lock_waits, d.lock_timeouts, d.lock_takeovers);
    let counters: [(&str, &str, u64); 7] = [
        (
            "kcache_integrity_rejects_total",
            "Disk entries refused by a read (bad tag, another key, truncated, ...) and removed.",
            d.integrity_rejects,
        ),
        (
            "kcache_disk_read_bytes_total",
            "Bytes of entries read.",
            d.bytes_read,
        ),
        (
            "kcache_disk_written_bytes_total",
            "Bytes of entries written.",
            d.bytes_written,
        ),
        (
            "kcache_disk_io_errors_total",
            "Disk reads and writes that failed.",
            d.io_errors,
        ),
        waits,
        timeouts,
        takeovers,
    ];
    write_disk_writes(
        out,
        "Entries written by the disk tiers, by outcome.",
        d.puts,
        d.failed_writes,
    );
    unlabelled(out, Kind::Counter, &counters);
    let gauges: [(&str, &str, u64); 3] = [
        (
            "kcache_disk_bytes",
            "Bytes of entry files in the directories of the disk tiers.",
            d.bytes,
        ),
        (
            "kcache_disk_pending_writes",
            "Background writes queued or running.",
            d.pending_writes,
        ),
        (
            "kcache_disk_tiers",
            "Disk tiers open; several may share a directory.",
            totals.disk_tiers,
        ),
    ];
    unlabelled(out, Kind::Gauge, &gauges);
    write_remote(out, totals);
}

/// One family of one sample, without labels, for each `(name, help, value)`.
fn unlabelled(out: &mut Exposition, kind: Kind, families: &[(&str, &str, u64)]) {
    for &(name, help, value) in families {
        out.family(name, kind, help).sample(name, &[], value);
    }
}

/// `kcache_lookups_total`: the memory tier's results (a process's count its waits too), the
/// disk tier's and the remote tier's hits and misses.
fn write_lookups(
    out: &mut Exposition,
    help: &str,
    memory: &[(&str, u64)],
    [disk_hits, disk_misses]: [u64; 2],
    [remote_hits, remote_misses]: [u64; 2],
) {
    let lookups = "kcache_lookups_total";
    out.family(lookups, Kind::Counter, help)
        .series(
            lookups,
            &[("tier", "memory")],
            "result",
            memory.iter().copied(),
        )
        .series(
            lookups,
            &[("tier", "disk")],
            "result",
            [("hit", disk_hits), ("miss", disk_misses)],
        )
        .series(
            lookups,
            &[("tier", "remote")],
            "result",
            [("hit", remote_hits), ("miss", remote_misses)],
        );
}

/// `kcache_disk_writes_total`, by outcome.
fn write_disk_writes(out: &mut Exposition, help: &str, ok: u64, failed: u64) {
    let writes = "kcache_disk_writes_total";
    out.family(writes, Kind::Counter, help).series(
        writes,
        &[],
        "result",
        [("ok", ok), ("failed", failed)],
    );
}

/// The disk lock's families, as [`unlabelled`] takes them.
fn lock_counters(
    waits: u64,
    timeouts: u64,
    takeovers: u64,
) -> [(&'static str, &'static str, u64); 3] {
    [
        (
            "kcache_disk_lock_waits_total",
            "Misses that waited for another process building the same entry.",
            waits,
        ),
        (
            "kcache_disk_lock_timeouts_total",
            "Waits for another process that reached the lock timeout.",
            timeouts,
        ),
        (
            "kcache_disk_lock_takeovers_total",
            "Misses that took over the build of a process that died building.",
            takeovers,
        ),
    ]
}

/// The remote tiers' families (zeros without one, so that no series appears out of nowhere).
fn write_remote(out: &mut Exposition, totals: &Totals) {
    write_remote_counters(out, &totals.remote);
    write_stores(out, &totals.stores);
    let gauges: [(&str, &str, u64); 2] = [
        (
            "kcache_remote_tiers",
            "Remote tiers configured behind the open disk tiers.",
            totals.remote_tiers,
        ),
        (
            "kcache_remote_breakers_open",
            "Remote tiers whose breaker is open now (the store is being skipped).",
            totals.remote_breakers_open,
        ),
    ];
    unlabelled(out, Kind::Gauge, &gauges);
}

/// Each kind of store's lookups and writes apart (`store` = `redis`, `s3`); the `kcache_remote_*`
/// families add every store up. `stores` is indexed as [`StoreKind::ALL`].
fn write_stores(out: &mut Exposition, stores: &[RemoteStats; StoreKind::ALL.len()]) {
    let lookups = "kcache_store_lookups_total";
    let family = out.family(
        lookups,
        Kind::Counter,
        "Lookups of each kind of store behind the disk tiers, by result.",
    );
    for (kind, s) in StoreKind::ALL.iter().zip(stores) {
        let results = [("hit", s.hits), ("miss", s.misses), ("reject", s.rejects)];
        family.series(lookups, &[("store", kind.name())], "result", results);
    }
    let writes = "kcache_store_written_bytes_total";
    let family = out.family(
        writes,
        Kind::Counter,
        "Bytes written to each kind of store behind the disk tiers.",
    );
    for (kind, s) in StoreKind::ALL.iter().zip(stores) {
        family.sample(writes, &[("store", kind.name())], s.bytes_written);
    }
}

/// The remote tier's counter families but its lookups: a process's remote tiers, or what a
/// directory's processes did with theirs.
fn write_remote_counters(out: &mut Exposition, r: &RemoteStats) {
    let operations = "kcache_remote_failures_total";
    out.family(
        operations,
        Kind::Counter,
        "Remote operations that failed, ran past their timeout, or were skipped by an open breaker.",
    )
    .series(
        operations,
        &[],
        "reason",
        [("error", r.errors), ("timeout", r.timeouts), ("skipped", r.skipped)],
    );
    let leases = "kcache_remote_leases_total";
    out.family(
        leases,
        Kind::Counter,
        "Cross-node leases: taken (builds led), waited for, waits that timed out, builds begun \
         without one because a lease operation failed, leases that lapsed during their build.",
    )
    .series(
        leases,
        &[],
        "result",
        [
            ("taken", r.leases),
            ("waited", r.lease_waits),
            ("timed_out", r.lease_timeouts),
            ("failed_open", r.lease_failures),
            ("lost", r.leases_lost),
        ],
    );
    let counters: [(&str, &str, u64); 6] = [
        (
            "kcache_remote_conditional_writes_ignored_total",
            "Times a store was found to ignore conditional writes: its leases go unused.",
            r.conditional_writes_ignored,
        ),
        (
            "kcache_remote_rejects_total",
            "Remote entries refused by verification (changed, another key, too large).",
            r.rejects,
        ),
        (
            "kcache_remote_breaker_trips_total",
            "Times a remote tier's breaker opened after consecutive failures.",
            r.breaker_trips,
        ),
        (
            "kcache_remote_writes_total",
            "Entries written to the remote tiers.",
            r.puts,
        ),
        (
            "kcache_remote_read_bytes_total",
            "Bytes read from the remote tiers.",
            r.bytes_read,
        ),
        (
            "kcache_remote_written_bytes_total",
            "Bytes written to the remote tiers.",
            r.bytes_written,
        ),
    ];
    unlabelled(out, Kind::Counter, &counters);
}
