//! The per-process control socket (`$CRANE_RUN_DIR/apps/<pid>.sock`, mode
//! 0600), accepted by one thread started at the application's first OpenCL
//! call. Each connection is read on a short-lived thread of its own, so a peer
//! that connects and never sends (or trickles) delays nobody: it is dropped
//! after `REQUEST_DEADLINE`. Requests are at most `MAX_REQUEST` bytes and are
//! carried out one at a time.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

use crane_control::{DeviceSpec, MAX_REQUEST, Mode, Request, Response};

use crate::config::{self, debug, warn};
use crate::{gate, lifecycle};

static START: Once = Once::new();

/// How long a peer has to send its whole request line.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a peer has to take the response.
const RESPONSE_DEADLINE: Duration = Duration::from_secs(5);
/// A pre-copy to crane-proxy ends after a round that sent at most this
/// much: the move then sends it (at the proxy's intake, a few ms).
const PRECOPY_SMALL: u64 = 8 << 20;
/// Connections being read at once; more are refused at once, so that a flood
/// of idle connections costs bounded threads and memory.
const MAX_CONNECTIONS: usize = 16;
static CONNECTIONS: AtomicUsize = AtomicUsize::new(0);
/// Requests are carried out one at a time (suspend, resume and status all
/// move the gate).
static HANDLING: Mutex<()> = Mutex::new(());

/// Starts the control thread once per process.
pub fn start() {
    if !config::get().control_socket {
        return;
    }
    START.call_once(|| {
        let dir = crane_control::apps_dir(&config::get().run_dir);
        let path = crane_control::socket_path(&config::get().run_dir, std::process::id());
        if let Err(e) = std::fs::create_dir_all(&dir) {
            warn!(
                "cannot create {}: {e}; this process cannot be suspended",
                dir.display()
            );
            return;
        }
        let listener = match crane_control::listen_at(&path) {
            Ok(l) => l,
            Err(e) => {
                warn!(
                    "cannot listen on {}: {e}; this process cannot be suspended",
                    path.display()
                );
                return;
            }
        };
        debug!("control socket {}", path.display());
        let spawned = std::thread::Builder::new()
            .name("crane-control".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(s) => accept(s),
                        Err(e) => debug!("control accept: {e}"),
                    }
                }
            });
        if let Err(e) = spawned {
            warn!("cannot start the control thread: {e}");
        }
        // SAFETY: atexit takes a plain function; removing our socket at exit.
        unsafe { libc::atexit(remove_socket) };
    });
}

extern "C" fn remove_socket() {
    let _ = std::fs::remove_file(crane_control::socket_path(
        &config::get().run_dir,
        std::process::id(),
    ));
}

/// Hands a connection to a thread of its own, or refuses it when too many are
/// open.
fn accept(s: UnixStream) {
    if CONNECTIONS.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
        CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        respond(
            &s,
            &Response::error("too many control connections open; try again"),
        );
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("crane-control-conn".into())
        .spawn(move || {
            serve(&s);
            CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
        debug!("cannot start a control connection thread: {e}");
    }
}

fn serve(s: &UnixStream) {
    let resp = match read_request(s, REQUEST_DEADLINE) {
        Ok(line) => match serde_json::from_slice::<Request>(&line) {
            Ok(req) => match redirect(&req) {
                Some(resp) => resp,
                None => {
                    let _one_at_a_time = exclusive();
                    handle(req)
                }
            },
            Err(e) => Response::error(format!("malformed request: {e}")),
        },
        Err(RequestError::Closed) => return,
        Err(e) => Response::error(e.to_string()),
    };
    respond(s, &resp);
}

/// Holds off control requests (for work that moves the gate on a thread of
/// its own, such as a checkpoint the journal asked for).
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    HANDLING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A `Redirect` request, or a `Remote` one while the process's crane-proxy
/// has died and it waits for one: it names where to replay the session. Not
/// queued behind other requests, which may be waiting for that very
/// recovery. A `Redirect` to a process on a live crane-proxy is kept for a
/// recovery that starts soon (`remote::Session::redirect`); one to a process
/// that is not on crane-proxy is refused.
fn redirect(req: &Request) -> Option<Response> {
    let (proxy, token, explicit) = match req {
        Request::Remote { proxy, token, .. } => (proxy, token, false),
        Request::Redirect { proxy, token } => (proxy, token, true),
        _ => return None,
    };
    let done = crate::vendor::remote_session()
        .filter(|s| explicit || s.is_recovering())
        .map(|s| s.redirect(proxy.clone(), token.clone()))
        .is_some();
    match (done, explicit) {
        (true, _) => Some(Response {
            ok: true,
            error: None,
            status: None,
            phases: Vec::new(),
            residue: None,
        }),
        (false, true) => Some(Response::error(format!(
            "not on crane-proxy (the process is {}): nothing to redirect",
            match lifecycle::mode() {
                crane_control::Mode::Passthrough => "in passthrough",
                crane_control::Mode::Remote => "on its way to crane-proxy",
                crane_control::Mode::Suspended => "suspended",
            }
        ))),
        (false, false) => None,
    }
}

fn respond(s: &UnixStream, resp: &Response) {
    let mut out = serde_json::to_vec(resp).unwrap_or_default();
    out.push(b'\n');
    let _ = s.set_write_timeout(Some(RESPONSE_DEADLINE));
    // Never SIGPIPE: a cranectl that left before its answer must not end
    // the application.
    let _ = crate::nosignal::send_all(s, &out);
}

/// Why no request line came.
#[derive(Debug, PartialEq, Eq)]
enum RequestError {
    /// The peer closed the connection without sending anything.
    Closed,
    TooLong,
    TimedOut,
    Read(std::io::ErrorKind),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Closed => write!(f, "the connection closed before a request"),
            RequestError::TooLong => write!(f, "request longer than {MAX_REQUEST} bytes"),
            RequestError::TimedOut => write!(
                f,
                "no complete request line within {} s",
                REQUEST_DEADLINE.as_secs()
            ),
            RequestError::Read(k) => write!(f, "cannot read the request: {k}"),
        }
    }
}

/// Reads one request line (without its newline, or up to end of input), at
/// most `MAX_REQUEST` bytes, within `deadline` in total however slowly the
/// peer sends.
fn read_request(s: &UnixStream, deadline: Duration) -> Result<Vec<u8>, RequestError> {
    let end = Instant::now() + deadline;
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RequestError::TimedOut);
        }
        s.set_read_timeout(Some(left))
            .map_err(|e| RequestError::Read(e.kind()))?;
        let n = match (&*s).read(&mut chunk) {
            Ok(0) if line.is_empty() => return Err(RequestError::Closed),
            Ok(0) => return Ok(line),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(RequestError::TimedOut);
            }
            Err(e) => return Err(RequestError::Read(e.kind())),
        };
        let got = &chunk[..n];
        let (part, done) = match got.iter().position(|&b| b == b'\n') {
            Some(i) => (&got[..i], true),
            None => (got, false),
        };
        if line.len() + part.len() > MAX_REQUEST {
            return Err(RequestError::TooLong);
        }
        line.extend_from_slice(part);
        if done {
            return Ok(line);
        }
    }
}

fn with_status(st: crane_control::AppStatus) -> Response {
    Response {
        ok: true,
        error: None,
        status: Some(st),
        phases: Vec::new(),
        residue: None,
    }
}

/// How long a status request may hold the application's calls while it waits
/// for one that is under way: an observer (`cranectl list`, a monitor polling
/// it) must not stall a busy application noticeably.
const STATUS_PAUSE: Duration = Duration::from_millis(250);

fn handle(req: Request) -> Response {
    let ok = |phases, residue| Response {
        ok: true,
        error: None,
        status: None,
        phases,
        residue,
    };
    match req {
        Request::Status => {
            // Counting objects needs them to hold still: pause the application's
            // calls briefly (they already are while suspended).
            let paused = lifecycle::mode() != Mode::Suspended;
            // A process inside a long call (a program build) is still listed,
            // marked busy, without counts.
            if paused && gate::shut(gate::CLOSED, Instant::now() + STATUS_PAUSE).is_err() {
                gate::open();
                return match std::panic::catch_unwind(lifecycle::status_busy) {
                    Ok(st) => with_status(st),
                    Err(_) => Response::error("internal error while reporting status"),
                };
            }
            let st = std::panic::catch_unwind(lifecycle::status);
            if paused {
                gate::open();
            }
            match st {
                Ok(st) => with_status(st),
                Err(_) => Response::error("internal error while counting objects"),
            }
        }
        Request::Suspend { deadline_ms } => match std::panic::catch_unwind(|| {
            lifecycle::suspend(Duration::from_millis(deadline_ms))
        }) {
            Ok(Ok((phases, residue))) => ok(phases, Some(residue)),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error during suspend"),
        },
        Request::Precopy { deadline_ms } => match std::panic::catch_unwind(|| {
            lifecycle::precopy(Duration::from_millis(deadline_ms), lifecycle::Pins::Hot)
        }) {
            Ok(Ok(phases)) => ok(phases, None),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error during pre-copy"),
        },
        Request::Checkpoint { deadline_ms } => match std::panic::catch_unwind(|| {
            lifecycle::checkpoint(Duration::from_millis(deadline_ms))
        }) {
            Ok(Ok(phases)) => ok(phases, None),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error during a checkpoint"),
        },
        Request::Resume { device } => {
            match std::panic::catch_unwind(|| lifecycle::resume_on(parse_spec(device)?)) {
                Ok(Ok(phases)) => ok(phases, None),
                Ok(Err(e)) => Response::error(format!("{e}; the process stays suspended")),
                Err(_) => Response::error("internal error during resume"),
            }
        }
        Request::Remote {
            proxy,
            token,
            deadline_ms,
            device,
            precopy,
        } => match std::panic::catch_unwind(|| {
            let token = token.unwrap_or_default();
            let deadline = Duration::from_millis(deadline_ms);
            let spec = parse_spec(device)?;
            // Sent ahead while the application runs on; a pre-copy that
            // cannot be made leaves the move to send everything.
            let mut phases = Vec::new();
            if precopy > 0 {
                match crate::remote::ahead::send(&proxy, &token, deadline, precopy, PRECOPY_SMALL) {
                    Ok((p, _)) => phases = p,
                    Err(e) => crate::config::warn!("moving to crane-proxy without a pre-copy: {e}"),
                }
            }
            let moved = lifecycle::go_remote(proxy, token, deadline, spec);
            if moved.is_err() {
                crate::remote::ahead::discard();
            }
            moved.map(|(p, residue)| {
                phases.extend(p);
                (phases, residue)
            })
        }) {
            Ok(Ok((phases, residue))) => ok(phases, Some(residue)),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error while going remote"),
        },
        // Answered before the queue (`redirect`).
        Request::Redirect { .. } => Response::error("internal error: a redirect was queued"),
        Request::Local {
            deadline_ms,
            device,
            precopy,
        } => match std::panic::catch_unwind(|| {
            lifecycle::go_local(
                Duration::from_millis(deadline_ms),
                parse_spec(device)?,
                precopy,
            )
        }) {
            Ok(Ok(phases)) => ok(phases, None),
            Ok(Err(e)) => Response::error(e),
            Err(_) => Response::error("internal error while going local"),
        },
    }
}

/// A request's device spec, or why it is not one.
fn parse_spec(device: Option<String>) -> Result<Option<DeviceSpec>, String> {
    device
        .map(|d| DeviceSpec::parse(&d).map_err(|e| format!("bad device spec: {e}")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn a_line_is_read_without_its_newline() {
        let (a, b) = pair();
        (&a).write_all(b"{\"cmd\":\"status\"}\nrest").unwrap();
        assert_eq!(
            read_request(&b, Duration::from_secs(1)).unwrap(),
            b"{\"cmd\":\"status\"}"
        );
    }

    #[test]
    fn end_of_input_ends_the_line() {
        let (a, b) = pair();
        (&a).write_all(b"{\"cmd\":\"resume\"}").unwrap();
        a.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(
            read_request(&b, Duration::from_secs(1)).unwrap(),
            b"{\"cmd\":\"resume\"}"
        );
        let (a, b) = pair();
        drop(a);
        assert_eq!(
            read_request(&b, Duration::from_secs(1)),
            Err(RequestError::Closed)
        );
    }

    #[test]
    fn a_long_line_is_refused_after_the_cap() {
        let (a, b) = pair();
        let writer = std::thread::spawn(move || {
            let junk = vec![b'x'; 4096];
            // The reader stops early; the write then fails.
            for _ in 0..(4 * MAX_REQUEST / junk.len()) {
                if (&a).write_all(&junk).is_err() {
                    break;
                }
            }
        });
        assert_eq!(
            read_request(&b, Duration::from_secs(5)),
            Err(RequestError::TooLong)
        );
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn a_silent_or_trickling_peer_times_out() {
        let (_a, b) = pair();
        let t = Instant::now();
        assert_eq!(
            read_request(&b, Duration::from_millis(200)),
            Err(RequestError::TimedOut)
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        let (a, b) = pair();
        // A byte every 50 ms for 10 s: a deadline renewed by each byte would
        // wait all of it.
        let trickle = std::thread::spawn(move || {
            for _ in 0..200 {
                if (&a).write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t = Instant::now();
        assert_eq!(
            read_request(&b, Duration::from_millis(300)),
            Err(RequestError::TimedOut)
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        drop(b);
        trickle.join().unwrap();
    }
}
