//! `kc_metrics_render`: the process's metrics (`crate::metrics`) in a caller's buffer.

use std::ffi::c_char;
use std::ptr;

use super::args::invalid;
use super::status::{buffer_too_small, guard, kc_status, non_null};
use crate::metrics;

/// Writes the metrics of every kcache cache alive in this process into `buf`, in the Prometheus
/// text exposition format (0.0.4), NUL-terminated (families: `docs/metrics.md`).
///
/// `*out_needed` receives the bytes the text takes, its NUL included, on `KC_OK` and on
/// `KC_ERR_BUFFER_TOO_SMALL` (a `buf_len` too small; nothing written). `buf` NULL with `buf_len` 0
/// asks for the size only. The size may grow between two calls: call again with the new one.
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
