//! craned's control socket (craned_control describes the protocol): one
//! thread per connection (at most [`MAX_CONNECTIONS`] at once), a request
//! line that must arrive within [`REQUEST_DEADLINE`], requests carried out
//! one at a time, progress lines written as phases start. The supervision
//! loop runs beside it on the same service; the proxy supervisor, given a
//! XenStore connection and toolstack of its own, on a thread of its own, so
//! that a request that takes minutes does not leave the proxy domain
//! unattended. `status` does not wait behind a
//! long migration: it answers from the last snapshot when the service is
//! busy.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crane_libxl::Xl;
use crane_xs::layout::DOM0_REQUESTS;
use crane_xs::{XenStore, XsWatch};
use craned_control::{Done, Progress, Reply, Request, Status, read_line, write_message};

use crate::ratelimit::limited;
use crate::service::{Service, process_alive};

pub const MAX_CONNECTIONS: usize = 16;
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long `status` waits for a busy service before using the snapshot.
const STATUS_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
}

struct Shared<S, X> {
    service: Mutex<Service<S, X>>,
    snapshot: Mutex<Option<Status>>,
    /// The proxy supervisor's status as of its last tick: fresher than the
    /// snapshot's while a request runs.
    proxy: Arc<Mutex<craned_control::ProxyStatus>>,
    connections: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Binds the socket (mode 0600, a stale one replaced).
pub fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let err = |source| ServerError::Listen {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let l = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(l)
}

/// Serves `listener` and runs the supervision loop every `tick` until the
/// process ends; with `wake` (a XenStore connection of its own), also as
/// soon as a request appears under dom0's request tree (the XenStore
/// trigger). With `apart` (a XenStore connection and a toolstack of its
/// own), the proxy supervisor ticks on its own thread.
pub fn serve<S, X>(
    mut service: Service<S, X>,
    listener: UnixListener,
    tick: Duration,
    wake: Option<Box<dyn XsWatch + Send>>,
    apart: Option<(S, X)>,
) where
    S: XenStore + Send + 'static,
    X: Xl + Send + 'static,
{
    if let Some((store, xl)) = apart
        && let Some((mut sup, cfg, secret)) = service.take_proxy()
    {
        let spawned = std::thread::Builder::new()
            .name("proxy-supervisor".into())
            .spawn(move || {
                loop {
                    let ticked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        sup.tick(&store, &xl, &cfg, secret.as_deref());
                    }));
                    if ticked.is_err() {
                        limited!(log::Level::Error, "proxy supervisor: a tick panicked");
                    }
                    std::thread::sleep(tick);
                }
            });
        if let Err(e) = spawned {
            log::error!(
                "cannot start the proxy supervisor's thread: {e}; the proxy is not supervised"
            );
        }
    }
    let shared = Arc::new(Shared {
        proxy: service.proxy_status(),
        service: Mutex::new(service),
        snapshot: Mutex::new(None),
        connections: AtomicUsize::new(0),
    });
    let ticker = shared.clone();
    let wake = wake.and_then(|w| match w.watch(DOM0_REQUESTS, "requests") {
        Ok(()) => Some(w),
        Err(e) => {
            log::warn!("cannot watch {DOM0_REQUESTS} ({e}); requests are seen every tick");
            None
        }
    });
    std::thread::spawn(move || {
        loop {
            {
                let mut svc = lock(&ticker.service);
                svc.tick(&process_alive);
                *lock(&ticker.snapshot) = Some(svc.status());
            }
            match &wake {
                Some(w) => {
                    if let Err(e) = w.wait_event(tick) {
                        limited!(log::Level::Warn, "request watch: {e}");
                        std::thread::sleep(tick);
                    }
                }
                None => std::thread::sleep(tick),
            }
        }
    });
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                limited!(log::Level::Warn, "control socket: accept failed: {e}");
                continue;
            }
        };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            let mut s = stream;
            let _ = write_message(
                &mut s,
                &Reply::Done(Done::failed("craned is serving too many connections")),
            );
            continue;
        }
        let shared = shared.clone();
        std::thread::spawn(move || {
            handle(&shared, stream);
            shared.connections.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

fn peer_pid(stream: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .and_then(|c| u32::try_from(c.pid()).ok())
}

fn handle<S: XenStore, X: Xl>(shared: &Shared<S, X>, stream: UnixStream) {
    let started = Instant::now();
    let _ = stream.set_read_timeout(Some(REQUEST_DEADLINE));
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    let mut w = stream;
    let req = match read_line(&mut BufReader::new(reader)) {
        Ok(Some(line)) => {
            serde_json::from_str::<Request>(&line).map_err(|e| format!("not a valid request: {e}"))
        }
        Ok(None) => return,
        Err(e) => Err(e.to_string()),
    };
    let req = match req {
        Ok(r) => r,
        Err(e) => {
            limited!(log::Level::Warn, "control socket: {e}");
            let _ = write_message(&mut w, &Reply::Done(Done::failed(e)));
            return;
        }
    };
    let owner = peer_pid(&w);
    let mut done = if req == Request::Status {
        status(shared)
    } else {
        log::info!("control: {} from pid {owner:?}", req.name());
        let mut svc = lock(&shared.service);
        let mut out = w.try_clone().ok();
        let mut progress = |phase: &str, detail: Option<String>| {
            if let Some(o) = out.as_mut() {
                let p = Progress {
                    phase: phase.to_string(),
                    elapsed_ms: started.elapsed().as_millis() as u64,
                    bytes: None,
                    detail,
                };
                // A client that went away does not stop the operation.
                if write_message(o, &Reply::Progress(p)).is_err() {
                    out = None;
                }
            }
        };
        let done = svc.handle(&req, owner, &mut progress);
        *lock(&shared.snapshot) = Some(svc.status());
        done
    };
    done.ms = started.elapsed().as_millis() as u64;
    let _ = write_message(&mut w, &Reply::Done(done));
}

fn status<S: XenStore, X: Xl>(shared: &Shared<S, X>) -> Done {
    let until = Instant::now() + STATUS_WAIT;
    loop {
        match shared.service.try_lock() {
            Ok(svc) => {
                return Done {
                    status: Some(svc.status()),
                    ..Done::ok()
                };
            }
            Err(TryLockError::Poisoned(p)) => {
                return Done {
                    status: Some(p.into_inner().status()),
                    ..Done::ok()
                };
            }
            Err(TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(TryLockError::WouldBlock) => {
                return match lock(&shared.snapshot).clone() {
                    Some(mut s) => Done {
                        status: Some({
                            if s.proxy.is_some() {
                                s.proxy = Some(lock(&shared.proxy).clone());
                            }
                            s
                        }),
                        error: Some("craned is busy; this status is from before".into()),
                        ..Done::ok()
                    },
                    None => Done::failed("craned is busy and has no status yet"),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::testing::{FakeAgent, FakeXl, OnMigrate, gpu};
    use crane_xs::mem::MemStore;
    use crane_xs::message::GuestState;
    use craned_control::{Mode, call};
    use std::io::Write;
    use std::path::PathBuf;

    /// A service over `store` and `xl` with `cfg` (no secret, a proxy that
    /// always answers), served every 50 ms on a socket in a fresh folder
    /// named after `name`; with `apart`, its proxy supervisor on a thread of
    /// its own. Returns the folder and the socket's path.
    fn serving(
        name: &str,
        cfg: Config,
        store: &MemStore,
        xl: &FakeXl,
        apart: bool,
    ) -> (PathBuf, PathBuf) {
        let svc = Service::new(
            cfg,
            store.connect(0),
            xl.clone(),
            None,
            Box::new(|_: &str, _| Ok(())),
        );
        let dir = std::env::temp_dir().join(format!("craned-{name}-{}", std::process::id()));
        let path = dir.join("craned.sock");
        let listener = bind(&path).unwrap();
        let apart = apart.then(|| (store.connect(0), xl.clone()));
        std::thread::spawn(move || serve(svc, listener, Duration::from_millis(50), None, apart));
        (dir, path)
    }

    #[test]
    fn the_socket_serves_requests_with_progress_and_refuses_garbage() {
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.add_domain("g1", 3, &[gpu("0000:00:05.0")]);
        store.introduce(3);
        let agent = FakeAgent::start(&store, 3, GuestState::Passthrough, OnMigrate::Detach);
        let mut cfg = Config {
            guests: vec!["g1".into()],
            ..Config::default()
        };
        cfg.gpus.pool = vec![gpu("0000:00:05.0")];
        let (dir, path) = serving("server", cfg, &store, &xl, false);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let mut phases = Vec::new();
        let req = Request::PreMigrate {
            guest: "g1".into(),
            dest: "host1".into(),
            mode: Mode::StopAndCopy,
        };
        let done = call(&path, &req, Duration::from_secs(10), |p| {
            phases.push(p.phase.clone())
        })
        .unwrap();
        assert!(done.ok, "{done:?}");
        assert!(
            phases.ends_with(&[
                "prepare-migrate".into(),
                "prepare-migrate answered".into(),
                "detach".into()
            ]),
            "{phases:?}"
        );
        assert!(xl.gpus_of(3).is_empty());
        let st = call(&path, &Request::Status, Duration::from_secs(5), |_| {})
            .unwrap()
            .status
            .unwrap();
        assert_eq!(st.guests[0].migration.as_deref(), Some("detached"));
        // This test process asked, and lives: the ticks leave it detached.
        std::thread::sleep(Duration::from_millis(200));
        assert!(xl.gpus_of(3).is_empty());
        let done = call(
            &path,
            &Request::PostMigrateFailed { guest: "g1".into() },
            Duration::from_secs(10),
            |_| {},
        )
        .unwrap();
        assert!(done.ok, "{done:?}");
        assert_eq!(xl.gpus_of(3), [gpu("0000:00:05.0")]);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);

        let mut raw = UnixStream::connect(&path).unwrap();
        raw.write_all(b"{\"cmd\":\"explode\"}\n").unwrap();
        let line = read_line(&mut BufReader::new(raw)).unwrap().unwrap();
        assert!(line.contains("not a valid request"), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// While a request waits minutes for an agent (here a paused one), the
    /// proxy supervisor ticks on its own thread: the proxy domain destroyed
    /// meanwhile is created again before the request ends. Supervised only
    /// between requests, it stayed gone (and the recreated domain paused
    /// without its GPU) for as long as the request took (e2e, the proxy
    /// domain destroyed during a migration).
    #[test]
    fn the_proxy_is_supervised_while_a_request_waits_for_an_agent() {
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.add_domain("g1", 3, &[gpu("0000:00:05.0")]);
        xl.create_makes("proxy");
        store.introduce(3);
        let agent = FakeAgent::start(&store, 3, GuestState::Passthrough, OnMigrate::Detach);
        agent.pause(true);
        let mut cfg = Config {
            guests: vec!["g1".into()],
            agent_timeout_ms: 4_000,
            ..Config::default()
        };
        cfg.gpus.pool = vec![gpu("0000:00:05.0")];
        cfg.proxy.address = "tcp://10.77.0.2:7000".into();
        cfg.proxy.domain = "proxy".into();
        cfg.proxy.gpu = Some(gpu("0000:00:07.0"));
        cfg.proxy.boot_grace_ms = 0;
        let (dir, path) = serving("apart", cfg, &store, &xl, true);
        let deadline = Instant::now() + Duration::from_secs(5);
        let proxy = loop {
            if let Ok(Some(d)) = xl.domid("proxy") {
                break d;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy domain was never created"
            );
            std::thread::sleep(Duration::from_millis(20));
        };

        let p = path.clone();
        let request = std::thread::spawn(move || {
            let req = Request::PreMigrate {
                guest: "g1".into(),
                dest: "host1".into(),
                mode: Mode::StopAndCopy,
            };
            call(&p, &req, Duration::from_secs(30), |_| {}).unwrap()
        });
        // The request waits for the paused agent; the proxy domain goes.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!request.is_finished());
        xl.remove_domain(proxy);
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            if xl.domid("proxy").unwrap().is_some_and(|d| d != proxy) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the proxy domain was not created again while the request ran"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!request.is_finished(), "the request ended before the check");
        assert_eq!(xl.created().len(), 2);
        // `status` answers from the service's snapshot meanwhile, the proxy's
        // part from the supervisor's last tick.
        let st = call(&path, &Request::Status, Duration::from_secs(5), |_| {})
            .unwrap()
            .status
            .unwrap();
        assert_eq!(st.proxy.unwrap().restarts, 1);
        let done = request.join().unwrap();
        assert!(!done.ok, "the paused agent cannot have answered: {done:?}");
        agent.pause(false);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
