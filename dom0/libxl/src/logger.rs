//! A xentoollog logger that hands libxl's messages to the `log` crate, so
//! libxl's diagnostics land in craned's log with everything else.

use std::ffi::{CStr, c_char, c_int, c_ulong};

use libxl_sys::{__va_list_tag, xentoollog_level as lvl, xentoollog_logger};

/// Longest message kept; libxl's are one line, longer ones are cut.
const MESSAGE_MAX: usize = 2048;

/// The logger libxl calls. `vtable` must stay the first field: libxl holds a
/// `*mut xentoollog_logger` that is really a pointer to this structure.
#[repr(C)]
pub(crate) struct LogLogger {
    vtable: xentoollog_logger,
}

impl LogLogger {
    pub(crate) fn new() -> Box<LogLogger> {
        Box::new(LogLogger {
            vtable: xentoollog_logger {
                vmessage: Some(vmessage),
                progress: Some(progress),
                destroy: None,
            },
        })
    }

    pub(crate) fn as_xtl(logger: &mut LogLogger) -> *mut xentoollog_logger {
        &mut logger.vtable
    }
}

pub(crate) fn level(l: lvl::Type) -> log::Level {
    match l {
        lvl::XTL_DEBUG | lvl::XTL_VERBOSE => log::Level::Trace,
        lvl::XTL_DETAIL | lvl::XTL_PROGRESS => log::Level::Debug,
        lvl::XTL_INFO | lvl::XTL_NOTICE => log::Level::Info,
        lvl::XTL_WARN => log::Level::Warn,
        _ => log::Level::Error,
    }
}

/// `context` (or "libxl") as text; null or invalid UTF-8 is tolerated.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
unsafe fn text(p: *const c_char, default: &str) -> String {
    if p.is_null() {
        return default.to_string();
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

unsafe extern "C" fn vmessage(
    _logger: *mut xentoollog_logger,
    level_: lvl::Type,
    errnoval: c_int,
    context: *const c_char,
    format: *const c_char,
    al: *mut __va_list_tag,
) {
    let level = level(level_);
    if !log::log_enabled!(target: "libxl", level) || format.is_null() {
        return;
    }
    let mut buf = [0u8; MESSAGE_MAX];
    // SAFETY: libxl passes a printf format and the matching va_list, used
    // once here (no va_copy is needed); vsnprintf writes at most
    // MESSAGE_MAX bytes including the NUL into `buf`.
    let n = unsafe {
        libxl_sys::vsnprintf(buf.as_mut_ptr().cast(), MESSAGE_MAX as c_ulong, format, al)
    };
    if n < 0 {
        return;
    }
    let len = (n as usize).min(MESSAGE_MAX - 1);
    let msg = String::from_utf8_lossy(&buf[..len]);
    let cut = if n as usize >= MESSAGE_MAX { "..." } else { "" };
    // SAFETY: libxl passes a NUL-terminated context or null.
    let context = unsafe { text(context, "libxl") };
    let _ = std::panic::catch_unwind(|| {
        if errnoval >= 0 {
            let err = std::io::Error::from_raw_os_error(errnoval);
            log::log!(target: "libxl", level, "{context}: {msg}{cut}: {err}");
        } else {
            log::log!(target: "libxl", level, "{context}: {msg}{cut}");
        }
    });
}

unsafe extern "C" fn progress(
    _logger: *mut xentoollog_logger,
    context: *const c_char,
    doing_what: *const c_char,
    percent: c_int,
    _done: c_ulong,
    _total: c_ulong,
) {
    if !log::log_enabled!(target: "libxl", log::Level::Debug) {
        return;
    }
    // SAFETY: libxl passes NUL-terminated strings or null.
    let (context, what) = unsafe { (text(context, "libxl"), text(doing_what, "")) };
    let _ = std::panic::catch_unwind(|| {
        log::debug!(target: "libxl", "{context}: {what}: {percent}%");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_log_levels() {
        assert_eq!(level(lvl::XTL_DEBUG), log::Level::Trace);
        assert_eq!(level(lvl::XTL_PROGRESS), log::Level::Debug);
        assert_eq!(level(lvl::XTL_NOTICE), log::Level::Info);
        assert_eq!(level(lvl::XTL_WARN), log::Level::Warn);
        assert_eq!(level(lvl::XTL_ERROR), log::Level::Error);
        assert_eq!(level(lvl::XTL_CRITICAL), log::Level::Error);
    }

    #[test]
    fn the_vtable_is_the_first_field() {
        let mut l = LogLogger::new();
        let base: *const LogLogger = &*l;
        assert_eq!(LogLogger::as_xtl(&mut l) as *const u8, base as *const u8);
    }
}
