//! `kcache run [--stats] -- PROGRAM ARGS`: runs an unmodified OpenCL program with kcache's
//! OpenCL layer, so that its program builds come from the cache (`docs/opencl-layer.md`).

use std::ffi::{OsStr, OsString};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use kcache::disk::DirectoryCounters;
use kcache::{Persistence, PersistenceConfig};

use crate::Failure;
use crate::commands::Target;

/// The layer's file name, as `cmake --install` and cargo leave it.
const LAYER_FILE: &str = "libkcache_opencl_layer.so";

/// Where the layer is, from the command's own file: next to it in a cargo build tree, else in
/// the library directory of its install prefix (`lib`, `lib64`, or a multiarch directory
/// under `lib` such as `lib/x86_64-linux-gnu`).
pub fn find_layer(command: &Path) -> Option<PathBuf> {
    let bin = command.parent()?;
    let prefix = bin.parent();
    let mut candidates = vec![bin.to_path_buf()];
    if let Some(prefix) = prefix {
        let lib = prefix.join("lib");
        candidates.push(lib.clone());
        candidates.push(prefix.join("lib64"));
        if let Ok(entries) = std::fs::read_dir(&lib) {
            let mut multiarch: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            multiarch.sort();
            candidates.extend(multiarch);
        }
    }
    candidates
        .into_iter()
        .map(|dir| dir.join(LAYER_FILE))
        .find(|path| path.is_file())
}

/// `OPENCL_LAYERS` with the layer first, then any the caller had set.
fn layers_value(layer: &Path, existing: Option<OsString>) -> OsString {
    let mut value = layer.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

pub fn run(target: &Target, stats: bool, command: &[OsString]) -> Result<u8, Failure> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::usage("no program to run"))?;
    let me = std::env::current_exe()
        .map_err(|e| Failure::usage(format!("cannot find the kcache command's own file: {e}")))?;
    let layer = find_layer(&me).ok_or_else(|| {
        Failure::usage(format!(
            "{LAYER_FILE} is not installed next to {} (nor in its prefix's library directory)",
            me.display()
        ))
    })?;
    let mut child = Command::new(program);
    child.args(args).env(
        "OPENCL_LAYERS",
        layers_value(&layer, std::env::var_os("OPENCL_LAYERS")),
    );
    let dir = match &target.dir {
        Some(dir) => Some(
            std::path::absolute(dir)
                .map_err(|e| Failure::usage(format!("--dir {}: {e}", dir.display())))?,
        ),
        None => None,
    };
    if let Some(dir) = &dir {
        child.env("KCACHE_DIR", dir);
    }
    if let Some(key_file) = &target.key_file {
        child.env("KCACHE_KEY_FILE", key_file);
    }
    if !stats {
        // The program takes this process's place: its exit status and signals are its own.
        let e = child.exec();
        return Err(cannot_run(program, e));
    }
    let cache = Persistence::open(PersistenceConfig {
        dir,
        ..PersistenceConfig::from_env()
    });
    let before = counters(&cache);
    let status = child.status().map_err(|e| cannot_run(program, e))?;
    match (&cache, before, counters(&cache)) {
        // Its processes could neither cache nor count anything there.
        (Ok(cache), _, _) if let Some(why) = cache.cannot_write() => eprintln!(
            "kcache run: nothing was cached, and builds were not counted: {} cannot be written \
             ({why})",
            cache.path().display()
        ),
        (Ok(cache), Some(before), Some(after)) => print_saved(cache.path(), before, after),
        (Err(e), _, _) => eprintln!("kcache run: no disk tier, nothing was cached: {e}"),
        _ => eprintln!("kcache run: the directory's counters cannot be read"),
    }
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => 1,
    })
}

fn cannot_run(program: &OsStr, e: std::io::Error) -> Failure {
    Failure {
        message: format!("cannot run {}: {e}", program.to_string_lossy()),
        status: 127,
    }
}

fn counters(cache: &kcache::Result<Persistence>) -> Option<DirectoryCounters> {
    let cache = cache.as_ref().ok()?;
    cache.directory_stats().ok().map(|stats| stats.counters)
}

/// What the program's run did with the cache, on stderr (stdout is the program's).
fn print_saved(dir: &Path, before: DirectoryCounters, after: DirectoryCounters) {
    let delta = |f: fn(&DirectoryCounters) -> u64| f(&after).saturating_sub(f(&before));
    let disk = delta(|c| c.disk_hits);
    let remote = delta(|c| c.remote_hits);
    let builds = delta(|c| c.builds);
    let waits = delta(|c| c.lock_waits);
    let passed = delta(|c| c.passed_through);
    eprintln!(
        "kcache run: {} program builds served from the cache ({disk} from disk, {remote} from \
         the remote tier), {builds} compiled, {waits} waited for another process building the \
         same program, {passed} passed through (inputs kcache cannot key); cache {}",
        disk + remote,
        dir.display()
    );
}
