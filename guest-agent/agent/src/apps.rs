//! Talking to the interposed processes through their control sockets
//! (docs/control-protocol.md): one request to many processes in parallel,
//! each bounded by the deadline, with processes that exit meanwhile counted as
//! gone rather than failed.

use std::path::Path;
use std::time::{Duration, Instant};

use crane_control::{CallError, Mode, Request, Response, call, socket_path};
use crane_xs::message::AppOutcome;

/// What one process answered.
#[derive(Debug, Clone, PartialEq)]
pub struct AppReport {
    pub pid: u32,
    pub outcome: AppOutcome,
    pub ms: f64,
    pub error: Option<String>,
}

/// Whether `pid` runs: a zombie (killed, not yet reaped by its parent) does
/// not, whatever /proc still shows of it.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which may itself hold ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| !matches!(state, 'Z' | 'X' | 'x')),
        Err(_) => false,
    }
}

/// The outcome a successful request leaves the process in.
fn success_outcome(req: &Request) -> AppOutcome {
    match req {
        Request::Remote { .. } | Request::Checkpoint { .. } | Request::Redirect { .. } => {
            AppOutcome::Remote
        }
        Request::Suspend { .. } => AppOutcome::Suspended,
        Request::Status
        | Request::Precopy { .. }
        | Request::Resume { .. }
        | Request::Local { .. } => AppOutcome::Passthrough,
    }
}

/// Classifies a failed call: a process that is gone, or whose socket nobody
/// listens on any more (a stale socket, its pid maybe reused), is gone.
fn classify(pid: u32, run_dir: &Path, e: &CallError) -> (AppOutcome, String) {
    let gone = !alive(pid);
    match e {
        CallError::Connect { source, .. }
            if gone
                || matches!(
                    source.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
        {
            let _ = std::fs::remove_file(socket_path(run_dir, pid));
            (AppOutcome::Gone, e.to_string())
        }
        _ if gone => (AppOutcome::Gone, e.to_string()),
        CallError::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            (AppOutcome::TimedOut, "no answer before the deadline".into())
        }
        _ => (AppOutcome::Failed, e.to_string()),
    }
}

/// Sends one request to one process and waits at most `wait`.
pub fn send(run_dir: &Path, pid: u32, req: &Request, wait: Duration) -> AppReport {
    let t = Instant::now();
    let r = call(
        &socket_path(run_dir, pid),
        req,
        wait.max(Duration::from_millis(1)),
    );
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let (outcome, error) = match r {
        Ok(Response { ok: true, .. }) => (success_outcome(req), None),
        Ok(Response { error, .. }) if !alive(pid) => (AppOutcome::Gone, error),
        Ok(Response { error, .. }) => (
            AppOutcome::Failed,
            Some(error.unwrap_or_else(|| "failed without saying why".into())),
        ),
        Err(e) => {
            let (o, msg) = classify(pid, run_dir, &e);
            (o, Some(msg))
        }
    };
    AppReport {
        pid,
        outcome,
        ms,
        error,
    }
}

/// Sends each process its request (if any) in parallel; every call is bounded
/// by `wait`.
pub fn send_all(
    run_dir: &Path,
    pids: &[u32],
    request_for: impl Fn(u32) -> Option<Request> + Sync,
    wait: Duration,
) -> Vec<AppReport> {
    std::thread::scope(|s| {
        let handles: Vec<_> = pids
            .iter()
            .filter_map(|&pid| {
                let req = request_for(pid)?;
                Some(s.spawn(move || send(run_dir, pid, &req, wait)))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    })
}

/// A process's current mode; `None` when it did not say (gone, or failing).
pub fn mode_of(run_dir: &Path, pid: u32, wait: Duration) -> Option<Mode> {
    match call(&socket_path(run_dir, pid), &Request::Status, wait) {
        Ok(Response {
            ok: true,
            status: Some(s),
            ..
        }) => Some(s.mode),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A small fake interposed process: a real control socket answering with a
    //! scripted behaviour, for the agent's unit tests.

    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crane_control::{AppStatus, Mode, ObjectCounts, Request, Response, socket_path};

    #[derive(Clone, Copy, Debug, PartialEq)]
    pub enum Behaviour {
        /// Answers like the interposer would (modes tracked).
        Obedient,
        /// Answers suspend/remote only after this long (then obeys).
        Slow(Duration),
        /// Refuses remote/suspend with an error.
        Refusing,
        /// Goes away but will not come back: refuses resume and local (its
        /// rebuild failing on the new device, say) and stays where it is.
        StaysAway,
        /// Stalled on its way back: at resume or local, away from
        /// passthrough, answers only after this long (then is back).
        StallsComingBack(Duration),
        /// Killed (SIGKILL to its pid) on its way back: at resume or local,
        /// away from passthrough, the process dies and the request is never
        /// answered (its socket closes with it).
        DiesComingBack,
    }

    pub struct FakeApp {
        pub pid: u32,
        pub mode: Arc<Mutex<Mode>>,
        /// The device specs of the requests that carried one, in order.
        pub devices: Arc<Mutex<Vec<String>>>,
        /// The proxies of the redirects it took, in order (a process in
        /// remote mode counts as waiting for its proxy).
        pub redirects: Arc<Mutex<Vec<String>>>,
    }

    /// Serves `<run_dir>/apps/<pid>.sock` on a thread until the test ends.
    pub fn spawn(run_dir: &Path, pid: u32, behaviour: Behaviour) -> FakeApp {
        let path = socket_path(run_dir, pid);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let mode = Arc::new(Mutex::new(Mode::Passthrough));
        let m = mode.clone();
        let devices = Arc::new(Mutex::new(Vec::new()));
        let devs = devices.clone();
        let redirects = Arc::new(Mutex::new(Vec::new()));
        let redirected = redirects.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let mut line = String::new();
                if BufReader::new(&s).read_line(&mut line).is_err() {
                    continue;
                }
                let Ok(req) = serde_json::from_str::<Request>(&line) else {
                    continue;
                };
                if let Request::Resume { device: Some(d) }
                | Request::Local {
                    device: Some(d), ..
                } = &req
                {
                    devs.lock().unwrap().push(d.clone());
                }
                let mut mode = m.lock().unwrap();
                let resp = match (&req, behaviour) {
                    (Request::Status, _) => Response {
                        ok: true,
                        error: None,
                        status: Some(AppStatus {
                            pid,
                            exe: "fake".into(),
                            mode: *mode,
                            objects: ObjectCounts::default(),
                            tracked_bytes: 0,
                            dirty_bytes: 0,
                            vendors: Vec::new(),
                            devices: Vec::new(),
                            busy: false,
                        }),
                        phases: Vec::new(),
                        residue: None,
                    },
                    (Request::Suspend { .. } | Request::Remote { .. }, Behaviour::Slow(d))
                        if *mode == Mode::Passthrough =>
                    {
                        std::thread::sleep(d);
                        *mode = if matches!(req, Request::Suspend { .. }) {
                            Mode::Suspended
                        } else {
                            Mode::Remote
                        };
                        ok()
                    }
                    (Request::Suspend { .. } | Request::Remote { .. }, Behaviour::Refusing) => {
                        Response::error("the process refuses")
                    }
                    (Request::Resume { .. } | Request::Local { .. }, Behaviour::StaysAway)
                        if *mode != Mode::Passthrough =>
                    {
                        Response::error("recreating the objects failed; it stays where it is")
                    }
                    (
                        Request::Resume { .. } | Request::Local { .. },
                        Behaviour::StallsComingBack(d),
                    ) if *mode != Mode::Passthrough => {
                        std::thread::sleep(d);
                        *mode = Mode::Passthrough;
                        ok()
                    }
                    (Request::Resume { .. } | Request::Local { .. }, Behaviour::DiesComingBack)
                        if *mode != Mode::Passthrough =>
                    {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                        // Dead (a zombie: its parent reaps it later) before
                        // the socket closes, as when the kernel ends it.
                        let t = std::time::Instant::now();
                        while super::alive(pid) && t.elapsed() < Duration::from_secs(5) {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        drop(mode);
                        drop(s);
                        continue;
                    }
                    (Request::Suspend { .. }, _) if *mode == Mode::Passthrough => {
                        *mode = Mode::Suspended;
                        ok()
                    }
                    (Request::Remote { .. }, _) if *mode == Mode::Passthrough => {
                        *mode = Mode::Remote;
                        ok()
                    }
                    (Request::Resume { .. }, _) if *mode == Mode::Suspended => {
                        *mode = Mode::Passthrough;
                        ok()
                    }
                    (Request::Local { .. }, _) if *mode == Mode::Remote => {
                        *mode = Mode::Passthrough;
                        ok()
                    }
                    (Request::Redirect { proxy, .. }, _) if *mode == Mode::Remote => {
                        redirected.lock().unwrap().push(proxy.clone());
                        ok()
                    }
                    (Request::Redirect { .. }, _) => {
                        Response::error("not on crane-proxy (the process is in passthrough)")
                    }
                    (Request::Precopy { .. }, _) if *mode == Mode::Passthrough => ok(),
                    (Request::Checkpoint { .. }, _) if *mode == Mode::Remote => ok(),
                    // A move onto other devices from passthrough.
                    (
                        Request::Local {
                            device: Some(_), ..
                        },
                        _,
                    ) if *mode == Mode::Passthrough => ok(),
                    _ => Response::error(format!("not allowed in mode {:?}", *mode)),
                };
                let mut out = serde_json::to_vec(&resp).unwrap();
                out.push(b'\n');
                let _ = (&s).write_all(&out);
            }
        });
        FakeApp {
            pid,
            mode,
            devices,
            redirects,
        }
    }

    fn ok() -> Response {
        Response {
            ok: true,
            error: None,
            status: None,
            phases: Vec::new(),
            residue: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Behaviour, spawn};
    use super::*;

    #[test]
    fn parallel_requests_with_timeouts_and_gone_processes() {
        let run = std::env::temp_dir().join(format!("crane-apps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        // Real pids that exist (ours, our parent, init) stand for live
        // processes; two of them take far longer than the wait.
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        let a = spawn(&run, me, Behaviour::Obedient);
        let b = spawn(&run, parent, Behaviour::Slow(Duration::from_secs(10)));
        let c = spawn(&run, 1, Behaviour::Slow(Duration::from_secs(10)));
        // A socket file with no listener whose process is gone.
        let gone_pid = 999_999_999;
        std::fs::write(socket_path(&run, gone_pid), b"").unwrap();
        let t = Instant::now();
        let mut r = send_all(
            &run,
            &[me, parent, 1, gone_pid],
            |_| Some(Request::Suspend { deadline_ms: 100 }),
            Duration::from_secs(1),
        );
        r.sort_by_key(|x| x.pid);
        let get = |pid| r.iter().find(|x| x.pid == pid).unwrap();
        assert_eq!(get(me).outcome, AppOutcome::Suspended);
        assert_eq!(get(parent).outcome, AppOutcome::TimedOut);
        assert_eq!(get(1).outcome, AppOutcome::TimedOut);
        assert_eq!(get(gone_pid).outcome, AppOutcome::Gone);
        assert!(!socket_path(&run, gone_pid).exists(), "stale socket left");
        // In parallel: the two 1 s waits overlap (in a row they take 2 s), and
        // neither slow process is waited for (10 s).
        assert!(
            t.elapsed() < Duration::from_millis(1900),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(*a.mode.lock().unwrap(), Mode::Suspended);
        assert_eq!(
            mode_of(&run, me, Duration::from_secs(1)),
            Some(Mode::Suspended)
        );
        drop((b, c));
        let _ = std::fs::remove_dir_all(&run);
    }
}
