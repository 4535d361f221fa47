//! Prints the path of a stand-in library built by this crate, for the scripts that test against
//! it (`c-tests/cuda/run.sh`, `scripts/gpu-check --test-driver`), so that they load the very
//! file the Rust tests load.
//!
//! Usage: stand-ins cuda|nvrtc

use std::process::ExitCode;

use kcache_testkit::cuda::{stand_in_driver_path, stand_in_nvrtc_path};

fn main() -> ExitCode {
    let path = match std::env::args().nth(1).as_deref() {
        Some("cuda") => stand_in_driver_path(),
        Some("nvrtc") => stand_in_nvrtc_path(),
        _ => {
            eprintln!("usage: stand-ins cuda|nvrtc");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", path.display());
    ExitCode::SUCCESS
}
