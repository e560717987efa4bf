//! Settings read once from the environment. A library loaded into someone
//! else's process installs no logger: `CRANE_DEBUG=1` writes crane's messages to
//! stderr, and nothing is written otherwise.

use std::path::PathBuf;
use std::sync::OnceLock;

pub struct Config {
    pub debug: bool,
    /// `CRANE_VENDOR`: colon-separated vendor libraries, overriding discovery.
    pub vendor_override: Option<String>,
    /// `CRANE_VENDORS_DIR` (default /etc/crane/vendors.d): the ICD files of the
    /// vendors crane wraps, moved there by `cranectl install-icd` so that the
    /// ICD loader does not load them a second time.
    pub vendors_dir: PathBuf,
    /// `CRANE_RUN_DIR` (default /run/crane): control sockets live in `apps/`.
    pub run_dir: PathBuf,
    /// `CRANE_WRITE_CACHE=0` turns off keeping host writes in RAM (saves memory,
    /// costs read-back at suspend).
    pub write_cache: bool,
    /// `CRANE_CONTROL=0` starts no control socket (for benchmarks of the bare
    /// forwarding path).
    pub control_socket: bool,
}

pub fn get() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let flag = |k: &str, default: bool| match std::env::var(k) {
            Ok(v) => !matches!(v.as_str(), "0" | "false" | "off" | "no"),
            Err(_) => default,
        };
        Config {
            debug: flag("CRANE_DEBUG", false),
            vendor_override: std::env::var("CRANE_VENDOR").ok().filter(|s| !s.is_empty()),
            vendors_dir: std::env::var_os("CRANE_VENDORS_DIR")
                .filter(|s| !s.is_empty())
                .map_or_else(|| PathBuf::from("/etc/crane/vendors.d"), PathBuf::from),
            run_dir: std::env::var_os("CRANE_RUN_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/run/crane")),
            write_cache: flag("CRANE_WRITE_CACHE", true),
            control_socket: flag("CRANE_CONTROL", true),
        }
    })
}

macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::config::get().debug {
            eprintln!("crane[{}]: {}", std::process::id(), format_args!($($t)*));
        }
    };
}
pub(crate) use debug;

/// Messages worth printing whatever the debug setting (a failed suspend).
macro_rules! warn_ {
    ($($t:tt)*) => {
        eprintln!("crane[{}]: {}", std::process::id(), format_args!($($t)*))
    };
}
pub(crate) use warn_ as warn;
