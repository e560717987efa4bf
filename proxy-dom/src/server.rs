//! The listeners and the sessions they start: one accept thread per listen
//! address, one thread per session, a cap on sessions at once, and the
//! counts [`Proxy::stats`] reports.

use std::collections::HashMap;
use std::fmt;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crane_wire::{Answer, Limits};
use log::Level;

use crate::config::{Config, FALLBACK_SESSION_MEM, ListenAddr};
use crate::conn::{Stream, Writer};
use crate::ratelimit::limited;
use crate::session::{self, objects::Counters};
use crate::vendor::{Vendor, VendorError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Vendor(#[from] VendorError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: ListenAddr,
        source: std::io::Error,
    },
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}

/// An address the proxy listens on, as bound (a TCP port 0 resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for BoundAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BoundAddr::Tcp(a) => write!(f, "tcp://{a}"),
            BoundAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// One session, as [`Proxy::stats`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStats {
    pub id: u64,
    pub tenant: String,
    pub client: String,
    /// Objects the session's table holds (failed ones included).
    pub objects: u64,
    /// Device memory charged to the session.
    pub mem_bytes: u64,
}

/// What the proxy is doing, for tests and operators.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections being served, before or after their Hello.
    pub connections: usize,
    /// Sessions past their Hello.
    pub sessions: Vec<SessionStats>,
    /// Sessions opened since start.
    pub sessions_opened: u64,
    /// Connections refused (bad Hello, token, version, or too many).
    pub refused: u64,
    /// Panics caught (each ended one session).
    pub panics: u64,
    /// Host memory held for reads and writes in flight, all sessions
    /// together (sessions that ended included, while the vendor still
    /// runs their commands).
    pub staging_bytes: u64,
}

impl Stats {
    pub fn objects(&self) -> u64 {
        self.sessions.iter().map(|s| s.objects).sum()
    }

    pub fn mem_bytes(&self) -> u64 {
        self.sessions.iter().map(|s| s.mem_bytes).sum()
    }
}

struct Entry {
    stream: Arc<Stream>,
    info: Option<(String, String, Arc<Counters>)>,
}

/// What every session shares.
pub(crate) struct Shared {
    pub config: Config,
    pub vendor: Vendor,
    pub limits: Limits,
    entries: Mutex<HashMap<u64, Entry>>,
    connections: AtomicUsize,
    next_id: AtomicU64,
    opened: AtomicU64,
    refused: AtomicU64,
    panics: AtomicU64,
    stopping: AtomicBool,
    /// Host bytes held for transfers in flight, over all sessions.
    pub staging: Arc<AtomicU64>,
    /// Sessions that asked for lanes, by session id (`crate::lanes`).
    pub lanes: Mutex<HashMap<u64, Arc<crate::lanes::Lanes>>>,
}

impl Shared {
    pub fn opened(&self, id: u64, tenant: &str, client: &str, counters: Arc<Counters>) {
        self.opened.fetch_add(1, Ordering::Relaxed);
        // Rate-limited: a guest opening sessions in a loop must not flood the log.
        limited!(
            Level::Info,
            "session {id} opened: tenant {tenant}, client {client}"
        );
        if let Some(e) = self.lock().get_mut(&id) {
            e.info = Some((tenant.to_string(), client.to_string(), counters));
        }
    }

    pub fn count_refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_panic(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running proxy. Dropping it stops it.
pub struct Proxy {
    shared: Arc<Shared>,
    bound: Vec<BoundAddr>,
    acceptors: Vec<JoinHandle<()>>,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Proxy {
    /// Loads the vendor libraries, binds every listen address and starts
    /// accepting.
    pub fn start(config: Config) -> Result<Proxy, ServerError> {
        let vendor = if config.preloaded.is_empty() {
            Vendor::load(&config.vendors)?
        } else {
            Vendor::preloaded(&config.preloaded)?
        };
        vendor.warm_contexts();
        let max_mem = config.max_session_mem.unwrap_or_else(|| {
            vendor
                .smallest_global_mem()
                .map_or(FALLBACK_SESSION_MEM, |m| m / 4 * 3)
        });
        let limits = Limits {
            max_mem_bytes: max_mem,
            max_objects: config.max_session_objects,
            max_payload: config.max_payload,
        };
        log::info!(
            "per-session limits: {} bytes of device memory, {} objects, {} bytes per payload; at most {} sessions",
            limits.max_mem_bytes,
            limits.max_objects,
            limits.max_payload,
            config.max_sessions
        );
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for addr in &config.listen {
            let err = |source| ServerError::Listen {
                addr: addr.clone(),
                source,
            };
            match addr {
                ListenAddr::Tcp(a) => {
                    let l = TcpListener::bind(a.as_str()).map_err(err)?;
                    bound.push(BoundAddr::Tcp(l.local_addr().map_err(err)?));
                    listeners.push(Listener::Tcp(l));
                }
                ListenAddr::Unix(p) => {
                    if let Ok(m) = std::fs::symlink_metadata(p) {
                        if !m.file_type().is_socket() {
                            return Err(ServerError::NotASocket(p.clone()));
                        }
                        // A socket left by an earlier run.
                        let _ = std::fs::remove_file(p);
                    }
                    let l = UnixListener::bind(p).map_err(err)?;
                    bound.push(BoundAddr::Unix(p.clone()));
                    listeners.push(Listener::Unix(l, p.clone()));
                }
            }
        }
        let shared = Arc::new(Shared {
            config,
            vendor,
            limits,
            entries: Mutex::new(HashMap::new()),
            connections: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            opened: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            staging: Arc::default(),
            lanes: Mutex::new(HashMap::new()),
        });
        // Pinned staging for lanes, made now rather than in a move's stop.
        {
            let shared = shared.clone();
            let _ = std::thread::Builder::new()
                .name("crane-lane-warm".into())
                .spawn(move || crate::lanes::warm_up(&shared));
        }
        let mut acceptors = Vec::new();
        for (l, b) in listeners.into_iter().zip(&bound) {
            let shared = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("crane-accept {b}"))
                .spawn(move || accept_loop(l, &shared))
                .map_err(ServerError::Thread)?;
            acceptors.push(t);
        }
        Ok(Proxy {
            shared,
            bound,
            acceptors,
        })
    }

    /// The addresses listened on.
    pub fn addrs(&self) -> &[BoundAddr] {
        &self.bound
    }

    /// The limits every session gets.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    pub fn stats(&self) -> Stats {
        let entries = self.shared.lock();
        let mut sessions: Vec<SessionStats> = entries
            .iter()
            .filter_map(|(&id, e)| {
                let (tenant, client, c) = e.info.as_ref()?;
                Some(SessionStats {
                    id,
                    tenant: tenant.clone(),
                    client: client.clone(),
                    objects: c.objects.load(Ordering::Relaxed),
                    mem_bytes: c.mem.load(Ordering::Relaxed),
                })
            })
            .collect();
        sessions.sort_by_key(|s| s.id);
        Stats {
            connections: self.shared.connections.load(Ordering::Acquire),
            sessions,
            sessions_opened: self.shared.opened.load(Ordering::Relaxed),
            refused: self.shared.refused.load(Ordering::Relaxed),
            panics: self.shared.panics.load(Ordering::Relaxed),
            staging_bytes: self.shared.staging.load(Ordering::Acquire),
        }
    }

    /// Stops accepting, ends every session (each is torn down as if its
    /// client had gone) and waits up to `timeout` for them.
    pub fn shutdown(&mut self, timeout: Duration) {
        if self.shared.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept threads with a connection they will drop.
        for b in &self.bound {
            match b {
                BoundAddr::Tcp(a) => drop(TcpStream::connect_timeout(a, Duration::from_secs(1))),
                BoundAddr::Unix(p) => drop(UnixStream::connect(p)),
            }
        }
        for t in self.acceptors.drain(..) {
            let _ = t.join();
        }
        for e in self.shared.lock().values() {
            e.stream.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + timeout;
        while self.shared.connections.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        for t in self.acceptors.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(15));
    }
}

fn accept_loop(l: Listener, shared: &Arc<Shared>) {
    loop {
        let accepted = match &l {
            Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
        };
        if shared.stopping.load(Ordering::Acquire) {
            break;
        }
        match accepted {
            Ok(s) => admit(s, shared),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                // Out of descriptors or memory: wait rather than spin.
                limited!(Level::Warn, "accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    if let Listener::Unix(_, p) = &l {
        let _ = std::fs::remove_file(p);
    }
}

/// Starts a session for a new connection, or turns it away when the proxy
/// is full.
fn admit(stream: Stream, shared: &Arc<Shared>) {
    let stream = Arc::new(stream);
    let n = shared.connections.fetch_add(1, Ordering::AcqRel);
    if n >= shared.config.max_sessions {
        shared.connections.fetch_sub(1, Ordering::AcqRel);
        shared.count_refused();
        limited!(
            Level::Warn,
            "connection from {} refused: {n} sessions already",
            stream.peer()
        );
        let _ = stream.configure();
        Writer::new(stream.clone()).send(
            0,
            &Answer::Goodbye {
                reason: "the proxy has too many sessions; try later".into(),
            },
            &[],
        );
        // FIN after the Goodbye; not drained, so that a flood of
        // connections cannot hold the accept thread.
        stream.shutdown(Shutdown::Write);
        return;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    shared.lock().insert(
        id,
        Entry {
            stream: stream.clone(),
            info: None,
        },
    );
    let slot = Slot {
        shared: shared.clone(),
        id,
    };
    let shared = shared.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("crane-session-{id}"))
        .spawn(move || {
            let _slot = slot;
            if catch_unwind(AssertUnwindSafe(|| {
                session::serve(stream, shared.clone(), id)
            }))
            .is_err()
            {
                shared.count_panic();
                limited!(
                    Level::Error,
                    "session {id}: the proxy panicked outside the session loop"
                );
            }
        });
    // On failure the closure, and with it the slot, is dropped.
    if let Err(e) = spawned {
        limited!(Level::Error, "cannot start a session thread: {e}");
    }
}

/// A connection's place in the proxy, given back however its thread ends.
struct Slot {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(e) = self.shared.lock().remove(&self.id) {
            e.stream.shutdown(Shutdown::Both);
            if let Some((tenant, _, _)) = &e.info {
                limited!(Level::Info, "session {} closed: tenant {tenant}", self.id);
            }
        }
        self.shared.connections.fetch_sub(1, Ordering::AcqRel);
    }
}
