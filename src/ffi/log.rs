//! `kc_set_log_callback`: kcache's messages (see `docs/logging.md`) into the runtime's own log.

// The C names are the contract.
#![allow(non_camel_case_types)]

use std::ffi::{CString, c_char, c_int, c_void};

use super::status::guard_value;
use crate::log::{self, Level};

/// An error: kcache cannot do what it was asked.
pub const KC_LOG_ERROR: c_int = 0;
/// A configuration problem (a setting ignored, a tier off), once per process and kind.
pub const KC_LOG_WARN: c_int = 1;
/// A build or a background write failed.
pub const KC_LOG_INFO: c_int = 2;
/// Why a lookup missed a tier, and the waits for other processes.
pub const KC_LOG_DEBUG: c_int = 3;

// The constants above are literals so that cbindgen can emit them; these keep them equal to
// the levels they stand for.
const _: () = assert!(KC_LOG_ERROR == Level::Error as c_int);
const _: () = assert!(KC_LOG_WARN == Level::Warn as c_int);
const _: () = assert!(KC_LOG_INFO == Level::Info as c_int);
const _: () = assert!(KC_LOG_DEBUG == Level::Debug as c_int);

/// Receives one message: `level` is one of `KC_LOG_ERROR` … `KC_LOG_DEBUG`, `message` a
/// NUL-terminated line without the `kcache: ` prefix that stderr gets, valid only during the call.
/// Called on any thread (including the disk tier's background writer), possibly on several at once,
/// never while a cache's lock is held. It may call kcache, but what those calls log goes to stderr,
/// and `kc_set_log_callback` called from inside it does nothing.
pub type kc_log_fn =
    Option<unsafe extern "C" fn(ctx: *mut c_void, level: c_int, message: *const c_char)>;

/// The callback and its context, as the caller gave them.
struct Callback {
    call: unsafe extern "C" fn(*mut c_void, c_int, *const c_char),
    ctx: *mut c_void,
}

// SAFETY: `kc_set_log_callback`'s caller promises that the callback may be called with `ctx`
// from any thread, concurrently; kcache only passes `ctx` back to it.
unsafe impl Send for Callback {}
// SAFETY: as for `Send`: shared use is only calling the callback, which the caller allows.
unsafe impl Sync for Callback {}

impl Callback {
    fn deliver(&self, level: Level, message: &str) {
        // kcache's messages hold no NUL (paths and C strings cannot); one that did is shown
        // with its NULs escaped rather than cut short.
        let text = CString::new(message)
            .unwrap_or_else(|_| CString::new(message.replace('\0', "\\0")).unwrap_or_default());
        // SAFETY: callable with `ctx` from any thread by the caller's promise; the message
        // lives until the call returns.
        unsafe { (self.call)(self.ctx, level as c_int, text.as_ptr()) }
    }
}

/// Sends kcache's messages to `callback` with `ctx` instead of stderr; NULL sends them to
/// stderr again. Which levels are sent is decided by `KCACHE_LOG` (`error`, `warn`, `info`,
/// `debug`; default `warn`), read once per process. When this returns, the previous callback
/// is not running and is never called again, so its `ctx` may be freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kc_set_log_callback(callback: kc_log_fn, ctx: *mut c_void) {
    guard_value((), || match callback {
        Some(call) => {
            let callback = Callback { call, ctx };
            log::set_hook(move |level, message| callback.deliver(level, message));
        }
        None => log::reset_hook(),
    })
}
