//! kcache's own test support, kept out of the library: the libraries that stand in for the CUDA
//! driver and NVRTC, and what tests, examples and benchmarks need to run a cached kernel or
//! drive the C ABI as C does. Not published; a dev-dependency of `kcache`.

pub mod bench;
pub mod cuda;
pub mod fake_s3;
pub mod ffi;
pub mod header_proxy;
pub mod load;
pub mod memory;
pub mod needs;
pub mod nvrtc;
pub mod opencl;
pub mod opencl_layer;
pub mod prometheus;
pub mod redis;
pub mod seaweed;
pub mod strings;
pub mod vulkan;
pub mod workers;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// This test executable again, set to run only the test `name`, on one thread, with its output
/// shown: a second process, for what must carry over (or must not) between processes.
pub fn rerun_test(name: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args([name, "--exact", "--nocapture", "--test-threads=1"]);
    command
}

/// Runs `command` and returns its standard output; panics, naming it `what` and showing both its
/// outputs, unless it succeeds.
pub fn successful_stdout(what: &str, command: &mut Command) -> String {
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Creates `path` as an operator key file holding `key`, private to its owner (mode 0600) as
/// `KCACHE_KEY_FILE` must be.
pub fn write_key_file(path: &Path, key: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap()
        .write_all(key)
        .unwrap();
}

/// Writes `bytes` at `dir/name` with the permission bits `mode`: a key or certificate file as
/// an operator leaves one, or as kcache must refuse it.
pub fn file_with_mode(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(bytes).unwrap();
    // After creating it: the process's umask may have taken bits away.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .unwrap();
    path
}

/// Makes a FIFO at `dir/name` (mode 0600) that no process opens for writing: a blocking open of
/// it waits forever, so it shows whether kcache opens operator files without blocking.
pub fn fifo(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let (kind, mode) = (
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    );
    rustix::fs::mknodat(rustix::fs::CWD, &path, kind, mode, 0).unwrap();
    path
}

/// Starts every command at once (their outputs captured) and waits for them all; panics,
/// showing a failed one's standard output, unless every one succeeds.
pub fn run_together(commands: impl IntoIterator<Item = Command>) {
    let children: Vec<_> = commands
        .into_iter()
        .map(|mut command| {
            command
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
    }
}

/// Asserts that `$result` is an `Err` whose error matches `$pattern`, and names the pattern
/// when it is not (the `Ok` side need not be `Debug`).
#[macro_export]
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(,)?) => {
        assert!(
            matches!($result, Err($pattern)),
            "expected Err({})",
            stringify!($pattern)
        )
    };
}
