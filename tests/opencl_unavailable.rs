//! Without an OpenCL library every OpenCL entry point reports `Unavailable`, never a panic.
//! The library is chosen once per process, so the check runs in a child process whose
//! `KCACHE_OPENCL_LIBRARY` names a file that does not exist.

use std::process::Command;

use kcache::Error;
use kcache::backend::opencl::{OpenClCache, OpenClOptions};
use kcache::ffi::kc_status;
use kcache::ffi::opencl::kc_opencl_available;
use kcache_testkit::opencl::Context;

const MISSING: &str = "/nonexistent/libOpenCL.so.1";
const CHILD: &str = "KCACHE_TEST_OPENCL_UNAVAILABLE_CHILD";

#[test]
fn every_entry_point_is_unavailable_when_the_library_is_missing() {
    if std::env::var_os(CHILD).is_some() {
        // A missing library is `Unavailable`, and the message names it.
        let Err(Error::Unavailable(message)) = OpenClCache::new(OpenClOptions::default()) else {
            panic!("loading a missing library must be Unavailable")
        };
        assert!(message.contains(MISSING), "{message}");
        let unavailable = |r: Result<(), Error>| matches!(r, Err(Error::Unavailable(_)));
        assert!(unavailable(
            OpenClCache::new(OpenClOptions::default()).map(drop)
        ));
        assert!(unavailable(Context::first_device().map(drop)));
        assert_eq!(kc_opencl_available(), kc_status::KC_ERR_UNAVAILABLE);
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "every_entry_point_is_unavailable_when_the_library_is_missing",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("KCACHE_OPENCL_LIBRARY", MISSING)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
