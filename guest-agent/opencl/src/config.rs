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
    /// `CRANE_WRITE_CACHE_MAX` (bytes, default 4 KiB): host writes (and
    /// COPY_HOST_PTR contents) larger than this are not kept; their buffer is
    /// read back at suspend. Keeping a copy costs a memcpy on the
    /// application's thread: from 4 KiB on that is more than 3% of the
    /// transfer itself (a 1 MiB write from pinned memory ran at 32% of
    /// native on an H200 with a 1 MiB limit).
    pub write_cache_max: usize,
    /// `CRANE_PIN_CPU=1` pins map memory and RAM copies on CPU devices too
    /// (`staging`), where pinning buys nothing: so that PoCL runs the paths
    /// GPUs take (tests).
    pub pin_on_cpu: bool,
    /// `CRANE_PIN_MIN` (bytes): pin map memory and RAM copies from this size
    /// on (default: 64 KiB for maps, 1 MiB for RAM copies; see `staging`).
    pub pin_min: Option<usize>,
    /// `CRANE_CONTROL=0` starts no control socket (for benchmarks of the bare
    /// forwarding path).
    pub control_socket: bool,
    /// `CRANE_REMOTE_BATCH=0` makes every forwarded call a round trip (for
    /// measuring what batching buys).
    pub remote_batch: bool,
    /// `CRANE_REMOTE_SPIN_US` (default 200): how long a thread blocked in a
    /// forwarded call watches for its answer before it sleeps (a sleeping
    /// thread costs the answer a wake-up, several microseconds), and how long
    /// the reader thread watches its socket after each answer.
    pub remote_spin_us: u64,
    /// `CRANE_REMOTE_KICK=0`: the first kernel launch after the proxy went
    /// idle waits in the batch like any other call, instead of being sent at
    /// once (for measuring what sending it early buys).
    pub remote_kick: bool,
    /// `CRANE_HOST_MEMORY=emulate` gives the vendor no host memory
    /// (CL_MEM_USE_HOST_PTR / CL_MEM_ALLOC_HOST_PTR): crane serves those
    /// buffers' maps itself, so the vendor pins nothing (see
    /// docs/architecture.md on NVIDIA).
    pub emulate_host_memory: bool,
    /// `CRANE_PARALLEL_RELEASE=0`: a move to crane-proxy releases the local
    /// objects and unloads the vendor library before the proxy rebuilds them,
    /// not beside it (for measuring what the overlap buys).
    pub parallel_release: bool,
    /// `CRANE_REMOTE_JOURNAL_MIB` (default 1024; 0: none): how much a remote
    /// session may keep to replay itself on another crane-proxy if its own
    /// dies; past it a checkpoint is taken (docs/reliability.md).
    pub remote_journal_mib: u64,
    /// `CRANE_REMOTE_JOURNAL_CALLS` (default 100000): calls since the last
    /// checkpoint at which a checkpoint is taken, bounding how long a replay
    /// runs (it runs them all again).
    pub remote_journal_calls: usize,
    /// `CRANE_REMOTE_RECOVER_S` (default 60): how long a process whose
    /// crane-proxy died waits for one to take its session back.
    pub remote_recover_s: u64,
    /// `CRANE_REMOTE_LOCAL_AFTER_S` (default 10; 0: never): after this long
    /// without a crane-proxy taking the session back, it is replayed onto
    /// the local vendor, if one offers a platform (`remote::fallback`), and
    /// the process goes local.
    pub remote_local_after_s: u64,
    /// `CRANE_REMOTE_DEAD_AFTER_S` (default 60, at least 1): how long data
    /// sent to crane-proxy, or keepalive probes, may go unacknowledged
    /// before the connection counts as broken and the session is replayed
    /// (`TCP_USER_TIMEOUT`). Longer than the network's darkness at the end
    /// of a live migration.
    pub remote_dead_after_s: u64,
    /// `CRANE_REMOTE_LANES` (default 4, at most 8; 0: none): the extra
    /// connections a move to crane-proxy sends the buffers' contents over,
    /// side by side with its own (one carries ~3 GB/s; `remote::lanes`).
    pub remote_lanes: u32,
    /// `CRANE_REMOTE_LANES_MIN` (bytes, default 32 MiB): below this much to
    /// re-inject, a move uses its own connection alone (lanes cost a round
    /// trip and a connection each).
    pub remote_lanes_min: u64,
    /// `CRANE_REMOTE_LANE_PIECE` (bytes, default 4 MiB, 64 KiB to 16 MiB):
    /// the pieces a buffer is cut into over the lanes.
    pub remote_lane_piece: usize,
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
            write_cache_max: std::env::var("CRANE_WRITE_CACHE_MAX")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(4 << 10),
            pin_on_cpu: flag("CRANE_PIN_CPU", false),
            pin_min: std::env::var("CRANE_PIN_MIN")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            control_socket: flag("CRANE_CONTROL", true),
            remote_batch: flag("CRANE_REMOTE_BATCH", true),
            remote_spin_us: std::env::var("CRANE_REMOTE_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(200),
            remote_kick: flag("CRANE_REMOTE_KICK", true),
            emulate_host_memory: std::env::var("CRANE_HOST_MEMORY").is_ok_and(|v| v == "emulate"),
            parallel_release: flag("CRANE_PARALLEL_RELEASE", true),
            remote_journal_mib: std::env::var("CRANE_REMOTE_JOURNAL_MIB")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(1024),
            remote_journal_calls: std::env::var("CRANE_REMOTE_JOURNAL_CALLS")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(100_000),
            remote_recover_s: std::env::var("CRANE_REMOTE_RECOVER_S")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(60),
            remote_local_after_s: std::env::var("CRANE_REMOTE_LOCAL_AFTER_S")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(10),
            remote_dead_after_s: std::env::var("CRANE_REMOTE_DEAD_AFTER_S")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(60)
                .max(1),
            remote_lanes: std::env::var("CRANE_REMOTE_LANES")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(4)
                .min(crane_wire::MAX_LANES),
            remote_lanes_min: std::env::var("CRANE_REMOTE_LANES_MIN")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(32 << 20),
            remote_lane_piece: std::env::var("CRANE_REMOTE_LANE_PIECE")
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(crane_wire::LANE_PIECE as usize)
                .clamp(64 << 10, crane_wire::LANE_PIECE_MAX as usize),
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

/// Where a process starts: `CRANE_MODE=remote` with `CRANE_PROXY=ADDR` (and
/// the token in `CRANE_PROXY_TOKEN` or the file `CRANE_PROXY_TOKEN_FILE`)
/// starts it on crane-proxy, for processes started while their guest is
/// migrating; anything else starts it on the local vendor libraries.
///
/// Without `CRANE_MODE`, the guest agent's migration notice decides (see
/// `crane_control::notice`): a process starting while its guest is remoting
/// starts on the proxy, one starting during a stop-and-copy migration waits
/// until the notice is gone.
pub fn initial_target() -> crate::vendor::Target {
    use crane_control::notice::{MigrationNotice, read_notice};
    if std::env::var_os("CRANE_MODE").is_none() {
        let mut told = false;
        loop {
            match read_notice(&get().run_dir) {
                Some(MigrationNotice::Remote { proxy, token }) => {
                    debug!("migration under way: starting on crane-proxy at {proxy}");
                    return crate::vendor::Target::Remote {
                        addr: proxy,
                        token: token.unwrap_or_default(),
                    };
                }
                Some(MigrationNotice::Suspended) => {
                    if !told {
                        warn_!("the guest is migrating; OpenCL waits until it has arrived");
                        told = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                None => return crate::vendor::Target::Local,
            }
        }
    }
    let remote = std::env::var("CRANE_MODE").is_ok_and(|m| m == "remote");
    let addr = std::env::var("CRANE_PROXY").unwrap_or_default();
    if !remote {
        return crate::vendor::Target::Local;
    }
    if addr.is_empty() {
        warn_!("CRANE_MODE=remote needs CRANE_PROXY=ADDR; using the local vendor libraries");
        return crate::vendor::Target::Local;
    }
    let token = match std::env::var("CRANE_PROXY_TOKEN_FILE") {
        Ok(f) => std::fs::read_to_string(&f)
            .map(|t| t.trim().to_string())
            .unwrap_or_else(|e| {
                warn_!("cannot read CRANE_PROXY_TOKEN_FILE {f}: {e}");
                String::new()
            }),
        Err(_) => std::env::var("CRANE_PROXY_TOKEN").unwrap_or_default(),
    };
    crate::vendor::Target::Remote { addr, token }
}
