//! The control protocol between `cranectl` (or `crane-agent`) and each
//! interposed OpenCL process: one JSON request per connection on the process's
//! socket `$CRANE_RUN_DIR/apps/<pid>.sock`, one JSON response back.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod notice;

/// Default run directory; `CRANE_RUN_DIR` overrides it.
pub const DEFAULT_RUN_DIR: &str = "/run/crane";

/// The directory holding the per-process sockets.
pub fn apps_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("apps")
}

/// The run directory from the environment.
pub fn run_dir_from_env() -> PathBuf {
    std::env::var_os("CRANE_RUN_DIR").map_or_else(|| PathBuf::from(DEFAULT_RUN_DIR), PathBuf::from)
}

/// The socket of one process.
pub fn socket_path(run_dir: &Path, pid: u32) -> PathBuf {
    apps_dir(run_dir).join(format!("{pid}.sock"))
}

/// A listening socket at `path`, mode 0600, replacing a stale one. It is
/// bound under a name no one looks for (`path` + `.binding`) and renamed into
/// place once it listens and has its mode: bind() makes the file before
/// listen(), and a connect in between is refused, which a client takes for a
/// peer that is gone (the agent then removes the process's socket).
pub fn listen_at(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let mut binding = path.as_os_str().to_owned();
    binding.push(".binding");
    let binding = PathBuf::from(binding);
    let _ = std::fs::remove_file(&binding);
    let listener = UnixListener::bind(&binding)?;
    let placed = std::fs::set_permissions(&binding, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&binding, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&binding);
        return Err(e);
    }
    Ok(listener)
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Status,
    /// Park all GPU state in RAM, release every object and unload the vendor
    /// library; the application's OpenCL calls block until `Resume`.
    Suspend {
        deadline_ms: u64,
    },
    /// Pre-copy: read what the device holds that RAM does not while the
    /// application runs on, so that a suspend or move soon after reads only
    /// what changed since. Passthrough only.
    Precopy {
        deadline_ms: u64,
    },
    /// On crane-proxy: drain, read back what the proxy changed and shrink
    /// the journal a replay needs to the objects and their RAM copies (a
    /// checkpoint; see docs/reliability.md).
    Checkpoint {
        deadline_ms: u64,
    },
    /// Reload the vendor library, recreate every object, re-inject memory.
    Resume {
        /// Where the process's devices go (a [`DeviceSpec`]); none: the
        /// devices it was on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
    },
    /// Move the process's GPU state to `crane-proxy` at `proxy` and carry on
    /// over RPC; the local vendor library is unloaded when this returns.
    Remote {
        /// `tcp://HOST:PORT` or `unix:/path`.
        proxy: String,
        /// The session token the proxy expects.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
        deadline_ms: u64,
        /// Which of the proxy's devices the process's devices go to (a
        /// [`DeviceSpec`]); none: those of the same platform and position.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// Pre-copy first, in at most this many rounds (0: none): buffer
        /// contents are sent to the proxy while the process runs on, and
        /// the move stops it only for what it changed since (wire 1.5).
        #[serde(default, skip_serializing_if = "is_zero")]
        precopy: u32,
    },
    /// While the process's crane-proxy has died and it waits for one to
    /// take its session back (docs/reliability.md): replay it on the proxy
    /// at `proxy` (with `token`; none: the token it has), and wait as long
    /// again as a wait starts with (`CRANE_REMOTE_RECOVER_S`). To a process
    /// on a live connection: kept for a recovery that starts within that
    /// wait, and the connection left at once if TCP sees its peer gone (a
    /// proxy domain destroyed sends no FIN). Answered at once, never queued
    /// behind other requests (which may be waiting for this very recovery);
    /// refused when the process is not on crane-proxy.
    Redirect {
        /// `tcp://HOST:PORT` or `unix:/path`.
        proxy: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token: Option<String>,
    },
    /// Bring the process's GPU state back from the proxy to the local vendor
    /// library (reload, recreate, re-inject what the proxy changed).
    /// From passthrough with `device`: move onto another local device.
    Local {
        deadline_ms: u64,
        /// Where the process's devices go (a [`DeviceSpec`]); none: the
        /// devices it was on before it went remote.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
        /// From crane-proxy, pre-copy first, in at most this many rounds (0:
        /// none): the local vendor is opened and the contexts made, and
        /// what the proxy changed is read, while the process runs on there;
        /// the move then stops it only for what it changed since.
        #[serde(default, skip_serializing_if = "is_zero")]
        precopy: u32,
    },
}

impl Request {
    /// `Resume` onto the devices the process was on.
    pub const RESUME: Request = Request::Resume { device: None };
}

/// Which device a process's OpenCL devices go to at a resume or a move.
///
/// Written as `home` (the devices it started on), `cpu`, `gpu`, `accelerator`
/// (the first devices of that type, platforms in order), or any other text:
/// the first devices whose platform name, vendor or device name contains it,
/// ignoring case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    Home,
    Type(DeviceType),
    Named(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceType {
    Cpu,
    Gpu,
    Accelerator,
}

impl DeviceType {
    /// The `CL_DEVICE_TYPE_*` bit.
    pub fn cl_bit(self) -> u64 {
        match self {
            DeviceType::Cpu => 1 << 1,
            DeviceType::Gpu => 1 << 2,
            DeviceType::Accelerator => 1 << 3,
        }
    }
}

/// What a [`DeviceSpec`] is matched against.
pub struct DeviceFacts<'a> {
    pub platform: &'a str,
    pub vendor: &'a str,
    pub name: &'a str,
    /// `CL_DEVICE_TYPE` bits.
    pub cl_type: u64,
}

impl DeviceSpec {
    /// Parses a spec; an empty or over-long one is an error.
    pub fn parse(s: &str) -> Result<DeviceSpec, String> {
        let t = s.trim();
        if t.is_empty() {
            return Err("an empty device spec".into());
        }
        if t.len() > 256 || t.chars().any(char::is_control) {
            return Err("a device spec is at most 256 printable characters".into());
        }
        Ok(match t.to_ascii_lowercase().as_str() {
            "home" => DeviceSpec::Home,
            "cpu" => DeviceSpec::Type(DeviceType::Cpu),
            "gpu" => DeviceSpec::Type(DeviceType::Gpu),
            "accelerator" => DeviceSpec::Type(DeviceType::Accelerator),
            _ => DeviceSpec::Named(t.to_owned()),
        })
    }

    /// Whether a device is one this spec names (`Home` names none: it is
    /// resolved by identity, not by facts).
    pub fn matches(&self, d: &DeviceFacts<'_>) -> bool {
        match self {
            DeviceSpec::Home => false,
            DeviceSpec::Type(t) => d.cl_type & t.cl_bit() != 0,
            DeviceSpec::Named(n) => {
                let n = n.to_lowercase();
                [d.platform, d.vendor, d.name]
                    .iter()
                    .any(|s| s.to_lowercase().contains(&n))
            }
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Home => f.write_str("home"),
            DeviceSpec::Type(DeviceType::Cpu) => f.write_str("cpu"),
            DeviceSpec::Type(DeviceType::Gpu) => f.write_str("gpu"),
            DeviceSpec::Type(DeviceType::Accelerator) => f.write_str("accelerator"),
            DeviceSpec::Named(n) => f.write_str(n),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Calls go to the local vendor library, tracked.
    Passthrough,
    /// GPU state is in RAM and the vendor library is unloaded.
    Suspended,
    /// Calls are forwarded to crane-proxy; no local vendor library is loaded.
    Remote,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectCounts {
    pub contexts: usize,
    pub queues: usize,
    pub buffers: usize,
    pub images: usize,
    pub samplers: usize,
    pub programs: usize,
    pub kernels: usize,
    pub events: usize,
    pub svm_allocations: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AppStatus {
    pub pid: u32,
    pub exe: String,
    pub mode: Mode,
    pub objects: ObjectCounts,
    /// Bytes of device memory crane tracks.
    pub tracked_bytes: u64,
    /// Bytes a suspend would have to read back now.
    pub dirty_bytes: u64,
    pub vendors: Vec<String>,
    /// The devices its contexts use now, as `"NAME" of "PLATFORM"` (empty
    /// while busy).
    #[serde(default)]
    pub devices: Vec<String>,
    /// The process stayed inside an OpenCL call (a program build, a long
    /// wait) while its objects were to be counted: the counts and byte
    /// figures are left at zero; pid, exe, mode and vendors hold.
    #[serde(default)]
    pub busy: bool,
}

/// One timed step of a transition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub ms: f64,
    pub bytes: u64,
    /// The step ran beside the others (a move to crane-proxy releases the
    /// local objects and unloads the vendor library while the proxy rebuilds
    /// them): it adds nothing to the transition's total.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parallel: bool,
}

impl Phase {
    /// The wall time of a transition made of `phases`.
    pub fn total_ms(phases: &[Phase]) -> f64 {
        phases.iter().filter(|p| !p.parallel).map(|p| p.ms).sum()
    }
}

/// What a device left behind after unloading (must be empty).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Residue {
    pub device_fds: Vec<String>,
    pub device_mappings: Vec<String>,
    pub vendor_threads: Vec<i32>,
    pub libraries_still_mapped: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AppStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<Phase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residue: Option<Residue>,
}

impl Response {
    pub fn error(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            status: None,
            phases: Vec::new(),
            residue: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the process did not answer on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the process sent a response that is not valid: {0}")]
    Decode(#[from] serde_json::Error),
}

/// Sends one request and waits for the response.
pub fn call(path: &Path, req: &Request, timeout: Duration) -> Result<Response, CallError> {
    let io = |source| CallError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(|source| CallError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    s.write_all(&line).map_err(io)?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out).map_err(io)?;
    Ok(serde_json::from_str(&out)?)
}

/// The pids with a socket in the run directory.
pub fn list_pids(run_dir: &Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(apps_dir(run_dir)) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".sock")?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Largest request line a process accepts (guards against a hostile peer).
pub const MAX_REQUEST: usize = 64 * 1024;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_phases_are_left_out_of_the_total_and_off_the_wire_when_false() {
        let phase = |name: &str, ms, parallel| Phase {
            name: name.into(),
            ms,
            bytes: 0,
            parallel,
        };
        let phases = [
            phase("drain", 1.0, false),
            phase("release", 60.0, true),
            phase("recreate", 100.0, false),
            phase("wait-release", 0.5, false),
        ];
        assert_eq!(Phase::total_ms(&phases), 101.5);
        let wire = serde_json::to_string(&phases[..2]).unwrap();
        assert_eq!(
            wire,
            r#"[{"name":"drain","ms":1.0,"bytes":0},{"name":"release","ms":60.0,"bytes":0,"parallel":true}]"#
        );
        // An older peer's phases (no field) read as not parallel.
        let old: Phase = serde_json::from_str(r#"{"name":"x","ms":2.0,"bytes":3}"#).unwrap();
        assert!(!old.parallel);
    }

    #[test]
    fn request_wire_form_is_stable() {
        let s = serde_json::to_string(&Request::Suspend { deadline_ms: 500 }).unwrap();
        assert_eq!(s, r#"{"cmd":"suspend","deadline_ms":500}"#);
        let r: Request = serde_json::from_str(r#"{"cmd":"resume"}"#).unwrap();
        assert_eq!(r, Request::RESUME);
        assert_eq!(
            serde_json::to_string(&Request::RESUME).unwrap(),
            r#"{"cmd":"resume"}"#
        );
        let r: Request =
            serde_json::from_str(r#"{"cmd":"local","deadline_ms":9,"device":"cpu"}"#).unwrap();
        assert_eq!(
            r,
            Request::Local {
                deadline_ms: 9,
                device: Some("cpu".into()),
                precopy: 0,
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"explode"}"#).is_err());
    }

    #[test]
    fn device_specs_parse_and_match_as_documented() {
        let gpu = DeviceFacts {
            platform: "NVIDIA CUDA",
            vendor: "NVIDIA Corporation",
            name: "NVIDIA H100 80GB HBM3",
            cl_type: 1 << 2,
        };
        let cpu = DeviceFacts {
            platform: "Portable Computing Language",
            vendor: "AuthenticAMD",
            name: "pthread-haswell-AMD EPYC",
            cl_type: 1 << 1,
        };
        let spec = |s| DeviceSpec::parse(s).unwrap();
        assert_eq!(spec(" CPU "), DeviceSpec::Type(DeviceType::Cpu));
        assert_eq!(spec("home"), DeviceSpec::Home);
        assert!(spec("cpu").matches(&cpu) && !spec("cpu").matches(&gpu));
        assert!(spec("gpu").matches(&gpu) && !spec("gpu").matches(&cpu));
        assert!(spec("nvidia").matches(&gpu) && !spec("nvidia").matches(&cpu));
        assert!(spec("Pthread").matches(&cpu));
        assert!(spec("portable computing").matches(&cpu));
        assert!(!spec("home").matches(&cpu));
        assert!(!spec("accelerator").matches(&gpu));
        for bad in ["", "  ", "a\nb"] {
            assert!(DeviceSpec::parse(bad).is_err(), "{bad:?}");
        }
        assert!(DeviceSpec::parse(&"x".repeat(257)).is_err());
        assert_eq!(spec("H100").to_string(), "H100");
        assert_eq!(spec("GPU").to_string(), "gpu");
    }

    #[test]
    fn listen_at_replaces_a_stale_socket_and_leaves_no_binding_name() {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("crane-listen-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("7.sock");
        std::fs::write(&path, b"stale").unwrap();
        let l = listen_at(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["7.sock"]);
        let _c = UnixStream::connect(&path).unwrap();
        l.accept().unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn list_pids_reads_socket_names() {
        let d = std::env::temp_dir().join(format!("crane-ctl-test-{}", std::process::id()));
        std::fs::create_dir_all(apps_dir(&d)).unwrap();
        for n in ["12.sock", "7.sock", "junk", "x.sock"] {
            std::fs::write(apps_dir(&d).join(n), b"").unwrap();
        }
        assert_eq!(list_pids(&d), vec![7, 12]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
