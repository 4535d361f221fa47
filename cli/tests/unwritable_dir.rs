//! A cache directory that cannot be written (a full filesystem, a read-only one) costs a
//! program under the OpenCL layer nothing: no wait for a lock nobody can publish under, no file
//! left behind, one warning, and `kcache run --stats` and `kcache stats` say that nothing was
//! cached. And in one process alone, no wait is counted as a wait for another process. Real
//! processes on PoCL, on real filesystems (tmpfs), which the test mounts: it needs root, as the
//! test command has; without it, it says so and checks nothing.

mod common;
use common::python;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds one source three times in one context, keeping every program: the second and third
/// builds miss the memory tier (the layer leaves a served context's programs to the
/// application) and look for the first's entry while the first still holds it back.
const THREE_BUILDS: &str = r#"
import pyopencl as cl
ctx = cl.create_some_context(interactive=False)
source = "__kernel void k(__global int *o) { o[0] = 7; }"
programs = [cl.Program(ctx, source).build() for _ in range(3)]
print("built", len(programs))
"#;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Mount {
    _temp: tempfile::TempDir,
    at: PathBuf,
}

impl Mount {
    /// A 256 KiB tmpfs holding the cache directory `kc`; `None` where this process may not mount,
    /// or cannot run the builds (the test skipped).
    fn new() -> Option<Mount> {
        common::layer_can_run(python())?;
        if !rustix::process::geteuid().is_root() {
            eprintln!("not root: no filesystem of the test's own to fill; nothing checked");
            return None;
        }
        let temp = tempfile::tempdir().unwrap();
        let at = temp.path().join("fs");
        std::fs::create_dir(&at).unwrap();
        let mount = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(mount.success(), "cannot mount a tmpfs at {}", at.display());
        let mount = Mount { _temp: temp, at };
        std::fs::create_dir(mount.dir()).unwrap();
        std::fs::set_permissions(
            mount.dir(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        Some(mount)
    }

    fn dir(&self) -> PathBuf {
        self.at.join("kc")
    }

    /// Fills the filesystem: not a byte left.
    fn fill(&self) {
        let filler = vec![0u8; 4096];
        let mut file = std::fs::File::create(self.at.join("filler")).unwrap();
        while std::io::Write::write_all(&mut file, &filler).is_ok() {}
    }

    fn remount_read_only(&self) {
        let status = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.at)
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The cache directory's files.
    fn files(&self) -> Vec<String> {
        std::fs::read_dir(self.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}

/// Runs the three builds under `kcache run --stats` on `dir`: standard output and error.
fn three_builds(dir: &Path) -> (String, String) {
    let output = common::pocl_clean(&mut Command::new(env!("CARGO_BIN_EXE_kcache")))
        .args(["run", "--stats", "--", python(), "-c", THREE_BUILDS])
        .env("KCACHE_DIR", dir)
        // A wait for a lock nobody releases would last this long: far past the test's runs.
        .env("KCACHE_LOCK_TIMEOUT", "600")
        .env("POCL_KERNEL_CACHE", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (String::from_utf8_lossy(&output.stdout).into_owned(), stderr)
}

/// What every unwritable directory gets: the program's own output, one warning, no wait, no
/// file, and both commands saying that nothing is cached, for `why`.
fn costs_nothing_and_says_so(mount: &Mount, why: &str) {
    let (out, err) = three_builds(&mount.dir());
    assert_eq!(out, "built 3\n");
    assert!(!err.contains("waited"), "a wait: {err}");
    assert_eq!(err.matches("cannot be written").count(), 2, "{err}");
    assert_eq!(
        err.matches("nothing is cached there").count(),
        1,
        "not one warning: {err}"
    );
    assert!(
        err.contains(&format!(
            "kcache run: nothing was cached, and builds were not counted: {} cannot be \
             written ({why})",
            mount.dir().display()
        )),
        "{err}"
    );
    assert_eq!(mount.files(), Vec::<String>::new(), "files left behind");
    let stats = Command::new(env!("CARGO_BIN_EXE_kcache"))
        .arg("--dir")
        .arg(mount.dir())
        .arg("stats")
        .env_clear()
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(
        stats.contains(&format!("writable:   no, {why}")),
        "kcache stats: {stats}"
    );
}

#[test]
fn a_full_directory_costs_no_wait_leaves_no_file_and_says_so() {
    let Some(mount) = Mount::new() else { return };
    mount.fill();
    costs_nothing_and_says_so(&mount, "no space left on its filesystem");
}

#[test]
fn a_read_only_directory_costs_no_wait_leaves_no_file_and_says_so() {
    let Some(mount) = Mount::new() else { return };
    mount.remount_read_only();
    costs_nothing_and_says_so(&mount, "a read-only filesystem");
}

/// The counts of a run, from `kcache run --stats`'s line: served, compiled, waited.
fn counts(stats: &str) -> [u64; 3] {
    let line = stats
        .lines()
        .find(|l| l.starts_with("kcache run:"))
        .unwrap_or_else(|| panic!("no statistics in {stats}"));
    let before = |what: &str| -> u64 {
        line[..line.find(what).unwrap()]
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    [
        before("program builds served"),
        before("compiled"),
        before("waited"),
    ]
}

#[test]
fn one_process_alone_waits_for_no_other_and_each_build_is_counted_once() {
    let Some(_) = common::layer_can_run(python()) else {
        return;
    };
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("kc");
    let (out, err) = three_builds(&dir);
    assert_eq!(out, "built 3\n");
    // The first build compiles and holds its entry back; the second finds it held by its own
    // process, which then builds the entry's binary for it (PoCL's second compile, a sibling:
    // docs/node.md); the second and third read it. No other process ran.
    assert_eq!(counts(&err), [2, 2, 0], "{err}");
    let (_, err) = three_builds(&dir);
    assert_eq!(counts(&err), [3, 0, 0], "warm: {err}");
}
