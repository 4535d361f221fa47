//! The remote tier's fields, which `kc_disk_options` and the backends' options
//! (`kc_opencl_options`, `kc_cuda_options`, `kc_vulkan_options`) all end with, under the same
//! names: read once, here, into a [`RemoteConfig`].

use std::ffi::c_char;
use std::time::Duration;

use super::args::{c_str, optional_path};
use crate::Result;
use crate::remote::RemoteConfig;

/// The `remote_*` fields of a C options struct, as the caller set them.
#[derive(Debug, Clone, Copy)]
pub struct RemoteArgs {
    pub url: *const c_char,
    pub read_only: bool,
    pub allow_unkeyed: bool,
    pub timeout_ms: u64,
    pub ttl_s: u64,
    pub prefix: *const c_char,
    pub max_entry_size: u64,
    pub lease_wait_ms: u64,
    pub ca_file: *const c_char,
    pub cert_file: *const c_char,
    pub key_file: *const c_char,
}

/// The [`RemoteArgs`] of an options struct with the `remote_*` fields.
macro_rules! remote_args {
    ($opts:expr) => {
        $crate::ffi::remote_args::RemoteArgs {
            url: $opts.remote_url,
            read_only: $opts.remote_read_only,
            allow_unkeyed: $opts.remote_allow_unkeyed,
            timeout_ms: $opts.remote_timeout_ms,
            ttl_s: $opts.remote_ttl_s,
            prefix: $opts.remote_prefix,
            max_entry_size: $opts.remote_max_entry_size,
            lease_wait_ms: $opts.remote_lease_wait_ms,
            ca_file: $opts.remote_ca_file,
            cert_file: $opts.remote_cert_file,
            key_file: $opts.remote_key_file,
        }
    };
}
pub(super) use remote_args;

impl RemoteArgs {
    /// The remote configuration these fields describe: NULL or 0 leaves a setting to the
    /// environment when `read_env`, else to the default. `name` names the options in messages.
    ///
    /// # Safety
    /// `url`, `prefix`, `ca_file`, `cert_file` and `key_file` must be NULL or C strings.
    pub unsafe fn config(self, read_env: bool, name: &str) -> Result<RemoteConfig> {
        let text = |p: *const c_char, field: &str| -> Result<Option<String>> {
            if p.is_null() {
                return Ok(None);
            }
            // SAFETY: non-NULL, hence a C string by the caller's contract.
            unsafe { c_str(p, &format!("{name}->{field}")) }.map(|s| Some(s.to_owned()))
        };
        // SAFETY: NULL or C strings by the caller's contract.
        let path = |p: *const c_char, field: &str| unsafe {
            optional_path(p, &format!("{name}->{field}"))
        };
        let nonzero = |n: u64| (n != 0).then_some(n);
        Ok(RemoteConfig {
            url: text(self.url, "remote_url")?,
            read_only: self.read_only.then_some(true),
            timeout: nonzero(self.timeout_ms).map(Duration::from_millis),
            ttl: nonzero(self.ttl_s).map(Duration::from_secs),
            prefix: text(self.prefix, "remote_prefix")?,
            max_entry_size: nonzero(self.max_entry_size),
            lease_wait: nonzero(self.lease_wait_ms).map(Duration::from_millis),
            ca_file: path(self.ca_file, "remote_ca_file")?,
            cert_file: path(self.cert_file, "remote_cert_file")?,
            key_file: path(self.key_file, "remote_key_file")?,
            allow_unkeyed: self.allow_unkeyed,
            read_env,
            ..RemoteConfig::default()
        })
    }
}
