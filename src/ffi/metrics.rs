//! `kc_metrics_render`: the process's metrics (`crate::metrics`) in a caller's buffer.

use std::ffi::c_char;
use std::ptr;

use super::args::invalid;
use super::status::{buffer_too_small, guard, kc_status, non_null};
use crate::metrics;

/// Writes the metrics of every kcache cache alive in this process (memory tiers, disk tiers,
/// backends) into `buf`, in the Prometheus text exposition format (version 0.0.4),
/// NUL-terminated. `docs/metrics.md` lists the metric families.
///
/// `*out_needed` is always set on `KC_OK` and `KC_ERR_BUFFER_TOO_SMALL`: the bytes the text
/// takes, its NUL included. `buf` NULL with `buf_len` 0 asks for that size only (`KC_OK`,
/// nothing written). A `buf_len` smaller than needed writes nothing to `buf` and returns
/// `KC_ERR_BUFFER_TOO_SMALL`. The figures move between two calls, so a size asked first may
/// fall short by the time of the second: call again with the newly reported size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_metrics_render(
    buf: *mut c_char,
    buf_len: usize,
    out_needed: *mut usize,
) -> kc_status {
    let mut short = None;
    let status = guard(|| {
        non_null(out_needed, "out_needed")?;
        if buf.is_null() && buf_len != 0 {
            return Err(invalid(format!("buf is NULL but buf_len is {buf_len}")));
        }
        let text = metrics::render();
        let needed = text.len() + 1;
        // SAFETY: non-NULL and writable by contract.
        unsafe { out_needed.write(needed) };
        if buf.is_null() {
            return Ok(());
        }
        if buf_len < needed {
            short = Some(needed);
            return Ok(());
        }
        // SAFETY: `buf` has `buf_len >= needed` writable bytes by contract; the text is ASCII
        // without NUL bytes, and a fresh `String` does not overlap the caller's buffer.
        unsafe {
            ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
            buf.add(text.len()).write(0);
        }
        Ok(())
    });
    match short {
        Some(needed) if status == kc_status::KC_OK => buffer_too_small(buf_len, needed),
        _ => status,
    }
}
