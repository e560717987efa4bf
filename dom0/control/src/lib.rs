//! The local control protocol of crane's dom0 service: craned listens on a
//! unix socket (default [`DEFAULT_SOCKET`], mode 0600, root only); the xl
//! wrapper and `crane status` connect. One connection carries one request:
//! a JSON object on one line, then craned writes zero or more
//! [`Reply::Progress`] lines while it works and exactly one [`Reply::Done`]
//! line, and closes. docs/operations.md ("Running craned") lists the
//! commands.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where craned listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/crane/craned.sock";
/// Longest line either side accepts.
pub const MAX_LINE: usize = 64 * 1024;

/// How the guest's processes leave the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Live migration: processes carry on through crane-proxy.
    Remote,
    /// Save/restore or a live migration with processes parked in RAM.
    StopAndCopy,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Remote => "remote",
            Mode::StopAndCopy => "stop-and-copy",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "remote" => Ok(Mode::Remote),
            "stop-and-copy" => Ok(Mode::StopAndCopy),
            _ => Err(format!("unknown mode {s:?}: want remote or stop-and-copy")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Source host, before `xl migrate`/`xl save`: move the guest's processes
    /// off the GPU and detach it. `guest` is a name or a domid.
    PreMigrate {
        guest: String,
        dest: String,
        mode: Mode,
    },
    /// Source host, after a successful `xl migrate`/`xl save`: the domain
    /// left; the migration is over here.
    Migrated {
        guest: String,
    },
    /// Source host, after a failed `xl migrate`/`xl save` (or `xl save -c`,
    /// which leaves the domain running): give the GPU back and resume.
    PostMigrateFailed {
        guest: String,
    },
    /// Destination host, before `xl migrate-receive`/`xl restore`: may a
    /// guest arrive now? Refused when no GPU is free and the policy says so.
    CheckReceive,
    /// Every domain on this host, for the wrapper to see which one arrived.
    Domains,
    /// Destination host, after the domain arrived: attach a free GPU and
    /// resume the guest's processes on it.
    Receive {
        guest: String,
    },
    Status,
}

impl Request {
    pub fn name(&self) -> &'static str {
        match self {
            Request::PreMigrate { .. } => "pre-migrate",
            Request::Migrated { .. } => "migrated",
            Request::PostMigrateFailed { .. } => "post-migrate-failed",
            Request::CheckReceive => "check-receive",
            Request::Domains => "domains",
            Request::Receive { .. } => "receive",
            Request::Status => "status",
        }
    }
}

/// One step under way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// `prepare-migrate`, `detach`, `attach`, `prepare-resume`, ...
    pub phase: String,
    /// Since the request arrived.
    pub elapsed_ms: u64,
    /// Bytes moved so far, where a phase knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domain {
    pub domid: u32,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStatus {
    pub name: String,
    #[serde(default)]
    pub domid: Option<u32>,
    /// The pool GPUs passed through to it.
    #[serde(default)]
    pub gpus: Vec<String>,
    /// The journal's phase while a migration is under way.
    #[serde(default)]
    pub migration: Option<String>,
    /// The last operation's outcome.
    #[serde(default)]
    pub last: Option<String>,
    /// The latest outcomes (at most 5), oldest first, `last` included.
    #[serde(default)]
    pub recent: Vec<String>,
    /// The guest's OpenCL processes and their modes as its agent last
    /// reported them (at the latest migration step).
    #[serde(default)]
    pub apps: Vec<AppMode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppMode {
    pub pid: u32,
    /// `passthrough`, `remote`, `suspended`, `gone`, `failed`, `timed-out`.
    pub mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub bdf: String,
    /// `pool` (for guests) or `proxy`.
    pub role: String,
    /// The domain holding it; none when free.
    #[serde(default)]
    pub holder: Option<String>,
    pub assignable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyStatus {
    pub address: String,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(default)]
    pub domid: Option<u32>,
    pub healthy: bool,
    #[serde(default)]
    pub last_error: Option<String>,
    pub restarts: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub guests: Vec<GuestStatus>,
    pub gpus: Vec<GpuStatus>,
    pub proxy: Option<ProxyStatus>,
}

/// The final answer. Fields other than `ok` and `error` are filled by the
/// commands they belong to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// pre-migrate: false when crane does not manage the guest (the wrapper
    /// then runs xl alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<bool>,
    /// The GPU detached (pre-migrate) or attached (receive, rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// receive: the guest stays on the proxy until a GPU frees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<bool>,
    /// receive: while it waits, its processes run on its own CPU
    /// (`no_free_gpu = "cpu"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cpu: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<Vec<Domain>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// pre-migrate, receive, rollback: the longest time one of the guest's
    /// OpenCL processes was stopped by the switch (microseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_us: Option<u64>,
    /// Wall time of the whole request.
    #[serde(default)]
    pub ms: u64,
}

impl Done {
    pub fn ok() -> Done {
        Done {
            ok: true,
            ..Done::default()
        }
    }

    pub fn failed(error: impl Into<String>) -> Done {
        Done {
            ok: false,
            error: Some(error.into()),
            ..Done::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Reply {
    Progress(Progress),
    Done(Done),
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot reach craned at {path}: {source} (is craned running?)")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the craned connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("a line longer than {MAX_LINE} bytes")]
    TooLong,
    #[error("craned closed the connection without a final answer")]
    NoAnswer,
    #[error("not a valid message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at end of stream.
pub fn read_line(r: &mut impl BufRead) -> Result<Option<String>, ControlError> {
    let mut buf = Vec::new();
    let n = r.take(MAX_LINE as u64 + 1).read_until(b'\n', &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') && buf.len() > MAX_LINE {
        return Err(ControlError::TooLong);
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// Writes one message as a line.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), ControlError> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Sends one request to craned at `socket` and waits for the final answer,
/// handing each progress line to `on_progress`. `timeout` bounds the wait
/// for each line.
pub fn call(
    socket: &Path,
    req: &Request,
    timeout: Duration,
    mut on_progress: impl FnMut(&Progress),
) -> Result<Done, ControlError> {
    let stream = UnixStream::connect(socket).map_err(|source| ControlError::Connect {
        path: socket.display().to_string(),
        source,
    })?;
    stream.set_read_timeout(Some(timeout))?;
    let mut w = stream.try_clone()?;
    write_message(&mut w, req)?;
    let mut r = BufReader::new(stream);
    loop {
        let Some(line) = read_line(&mut r)? else {
            return Err(ControlError::NoAnswer);
        };
        match serde_json::from_str::<Reply>(&line)? {
            Reply::Progress(p) => on_progress(&p),
            Reply::Done(d) => return Ok(d),
        }
    }
}

/// The name (`comm`, cut to 15 bytes) of libxl's save helper, the process
/// that writes the migration stream for `xl migrate` and `xl save`.
const SAVE_HELPER_COMM: &str = "libxl-save-help";

/// Bytes of the migration stream that `xl migrate` (process `pid`) has sent
/// so far: what libxl's save helper, a descendant of xl, has written (`wchar`
/// of /proc/PID/io). Only the helper counts: a transport that carries the
/// stream (socat, ssh) writes the same bytes again, and xl's own count takes
/// in its children's once it has reaped them. `None` while no helper runs
/// (not started yet, or done: callers keep the last figure) or when /proc
/// cannot tell.
pub fn migration_stream_bytes(pid: u32) -> Option<u64> {
    fn written(pid: u32) -> Option<u64> {
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("wchar:"))?
            .trim()
            .parse()
            .ok()
    }
    fn is_helper(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end() == SAVE_HELPER_COMM)
    }
    fn children(pid: u32) -> Vec<u32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    }
    let mut todo = children(pid);
    let mut seen = 0;
    let mut total = None;
    while let Some(p) = todo.pop() {
        seen += 1;
        if seen > 256 {
            break;
        }
        if is_helper(p)
            && let Some(n) = written(p)
        {
            total = Some(total.unwrap_or(0) + n);
        }
        todo.extend(children(p));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_a_stable_json_form() {
        let r = Request::PreMigrate {
            guest: "gpu1".into(),
            dest: "host1".into(),
            mode: Mode::StopAndCopy,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(
            s,
            r#"{"cmd":"pre-migrate","guest":"gpu1","dest":"host1","mode":"stop-and-copy"}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"status"}"#).unwrap(),
            Request::Status
        );
        for bad in [
            r#"{"cmd":"explode"}"#,
            r#"{"cmd":"receive"}"#,
            r#"{"cmd":"receive","guest":"g","extra":1}"#,
            r#"{"cmd":"pre-migrate","guest":"g","dest":"h","mode":"teleport"}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_call_reads_progress_then_the_answer_over_a_real_socket() {
        let dir = std::env::temp_dir().join(format!("craned-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let req: Request = serde_json::from_str(&read_line(&mut r).unwrap().unwrap()).unwrap();
            let mut w = s;
            for phase in ["prepare-migrate", "detach"] {
                write_message(
                    &mut w,
                    &Reply::Progress(Progress {
                        phase: phase.into(),
                        elapsed_ms: 5,
                        bytes: None,
                        detail: None,
                    }),
                )
                .unwrap();
            }
            let mut d = Done::ok();
            d.gpu = Some("0000:00:05.0".into());
            write_message(&mut w, &Reply::Done(d)).unwrap();
            req
        });
        let mut phases = Vec::new();
        let req = Request::Receive { guest: "g".into() };
        let done = call(&path, &req, Duration::from_secs(5), |p| {
            phases.push(p.phase.clone())
        })
        .unwrap();
        assert!(done.ok);
        assert_eq!(done.gpu.as_deref(), Some("0000:00:05.0"));
        assert_eq!(phases, ["prepare-migrate", "detach"]);
        assert_eq!(server.join().unwrap(), req);
        let e = call(&dir.join("none.sock"), &req, Duration::from_secs(1), |_| {}).unwrap_err();
        assert!(e.to_string().contains("is craned running"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn overlong_lines_are_refused() {
        let long = vec![b'x'; MAX_LINE + 10];
        let mut r = BufReader::new(&long[..]);
        assert!(matches!(read_line(&mut r), Err(ControlError::TooLong)));
        let mut r = BufReader::new(&b"abc\r\n"[..]);
        assert_eq!(read_line(&mut r).unwrap().as_deref(), Some("abc"));
        assert_eq!(read_line(&mut r).unwrap(), None);
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn counts_the_stream_the_save_helper_writes_once() {
        // A stand-in helper (a shell under the helper's name) writes 3 MB into
        // a pipe whose reader relays it: only the helper's bytes count.
        let dir = std::env::temp_dir().join(format!("crane-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let helper = dir.join("libxl-save-helper");
        let _ = std::fs::remove_file(&helper);
        std::os::unix::fs::symlink("/bin/sh", &helper).unwrap();
        let script = format!(
            "{} -c 'i=0; while [ $i -lt 1000 ]; do printf \"%3000s\" x; i=$((i+1)); done; sleep 5' \
             | cat > /dev/null; sleep 5",
            helper.display()
        );
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(4);
        let mut seen = None;
        while Instant::now() < until {
            seen = migration_stream_bytes(child.id());
            if seen.is_some_and(|n| n >= 3_000_000) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(seen, Some(3_000_000), "the helper's writes, once");
        assert_eq!(migration_stream_bytes(u32::MAX), None);
    }
}
