//! One connection to crane-proxy: batching posted calls, sending bulk data
//! without copies, and a reader thread that hands answers to the threads
//! waiting for them (or lands the data of non-blocking reads in application
//! memory itself).

use std::collections::{HashMap, HashSet};
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crane_wire::{Answer, Call, Header, Limits, VERSION_MAJOR, VERSION_MINOR, WireError};
use opencl_sys::*;

use super::RObj;
use super::journal::{After, Content, Journal, makes_objects};
use crate::config::{debug, warn};

/// What every call returns once the proxy is gone. CL_OUT_OF_RESOURCES is the
/// code OpenCL gives for "the implementation could not allocate resources on
/// the device", the closest to "the device went away".
pub const GONE: cl_int = CL_OUT_OF_RESOURCES;

/// Posted calls whose payload is at most this big are copied into the batch;
/// bigger payloads are written straight from application memory.
const COPY_LIMIT: usize = 64 << 10;

/// The batch is sent when it grows past this, even without a synchronising
/// call.
const BATCH_LIMIT: usize = 256 << 10;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(super) fn connect(addr: &str, timeout: Duration) -> std::io::Result<Stream> {
        if let Some(path) = addr.strip_prefix("unix:") {
            return Ok(Stream::Unix(UnixStream::connect(path)?));
        }
        let hostport = addr.strip_prefix("tcp://").unwrap_or(addr);
        let mut last = None;
        for sa in hostport.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    keepalive(&s);
                    return Ok(Stream::Tcp(s));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("the address resolves to nothing")))
    }

    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(super) fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    /// Ends the sending side: the peer reads the end of the stream.
    pub(super) fn shutdown_write(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// A dead peer (a proxy domain destroyed without closing its sockets) is
/// noticed after [`user_timeout`] without an acknowledgement: of data sent
/// when the connection is busy (without it, Linux retransmits for a quarter
/// of an hour), of keepalive probes when it is idle (from 5 s idle, 3 s
/// apart; with a user timeout set, the kernel closes on that, not on a
/// count of probes). Not sooner: a process is remote because its guest is
/// migrating, and the guest's network goes dark for a while at the end of a
/// live migration (the guest paused for the last pages, its network front
/// end reconnecting on the destination). A proxy process that dies closes
/// the connection, which is noticed at once; a proxy domain that dom0 says
/// it created again is looked at sooner ([`Session::redirect`]).
fn keepalive(s: &TcpStream) {
    tune(&socket2::SockRef::from(s), false);
}

/// The connection's dead-peer detection: the normal one (see [`keepalive`])
/// or, while dom0 has just said where crane-proxy is now, a quick one
/// (probes from 1 s idle, 1 s apart, [`QUICK_TIMEOUT`]).
fn tune(sock: &socket2::SockRef<'_>, quick: bool) {
    let (idle, every, timeout) = if quick {
        (1, 1, QUICK_TIMEOUT)
    } else {
        (5, 3, user_timeout())
    };
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(idle))
        .with_interval(Duration::from_secs(every))
        .with_retries(6);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        debug!("cannot set TCP keepalive: {e}");
    }
    if let Err(e) = sock.set_tcp_user_timeout(Some(timeout)) {
        debug!("cannot set TCP_USER_TIMEOUT: {e}");
    }
}

/// How long data sent to crane-proxy (or keepalive probes) may stay
/// unacknowledged before the connection counts as broken
/// (`TCP_USER_TIMEOUT`, `CRANE_REMOTE_DEAD_AFTER_S`): by default 60 s,
/// crane-proxy's own bound (proxy-dom/src/conn.rs), past the 18 s of
/// darkness seen at the end of a live migration under emulation.
fn user_timeout() -> Duration {
    Duration::from_secs(crate::config::get().remote_dead_after_s)
}

/// The same while dom0 has just said where crane-proxy is now.
const QUICK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a connection may go without an acknowledgement of data it sent
/// after dom0 said where crane-proxy is now, before the process leaves it
/// for a replay ([`watch_connection`]).
const SILENT_AFTER_REDIRECT: Duration = Duration::from_secs(5);

/// The same for a connection a recovery opened to the proxy dom0 names
/// again: dom0 says where crane-proxy is both when it creates the proxy
/// domain and when the proxy answers, so a process that replayed on the new
/// proxy in between most likely hears about the proxy it is on. It is
/// still watched (a second death would be found), with patience for a slow
/// host: under emulation a live connection of the new proxy had a segment
/// unacknowledged for 5.4 s, and the quick watch replayed it again for
/// nothing.
const SILENT_AFTER_REPEAT: Duration = Duration::from_secs(15);

/// What TCP knows of the peer: the segments sent and not acknowledged, and
/// the time since the last acknowledgement; `None` for a Unix socket (whose
/// peer cannot vanish without the kernel knowing) or when unknown.
fn tcp_silence(s: &Stream) -> Option<(u32, Duration)> {
    let Stream::Tcp(t) = s else {
        return None;
    };
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is a writable buffer of `len` bytes that outlives the
    // call, and the descriptor belongs to `t`, alive for the call. The
    // kernel writes at most `len` bytes and sets `len` to what it wrote.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(t),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    // Older kernels fill less of the struct than the libc crate declares
    // (Linux 6.1: no `tcpi_total_rto` and after): what is read here must
    // have been written.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_last_ack_recv) + 4;
    if r != 0 || (len as usize) < needed {
        return None;
    }
    // SAFETY: the struct was zeroed, so the fields the kernel did not fill
    // are 0, and every bit pattern is a valid `tcp_info` (integers only).
    let info = unsafe { info.assume_init() };
    Some((
        info.tcpi_unacked,
        Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
    ))
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Stream {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

/// Writes never raise SIGPIPE in the application ([`crate::nosignal`]).
impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        crate::nosignal::send(&self.fd(), buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        crate::nosignal::send_vectored(&self.fd(), bufs)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `a` then `b` with as few system calls as the kernel allows.
pub(super) fn write_two(w: &mut Stream, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        let n = w.write_vectored(&[IoSlice::new(a), IoSlice::new(b)])?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_a = n.min(a.len());
        a = &a[from_a..];
        b = &b[n - from_a..];
    }
    Ok(())
}

/// Lays out received data (for rectangular reads).
pub type Scatterer = Box<dyn FnOnce(&[u8]) + Send>;
/// Work for the callback thread.
type Job = Box<dyn FnOnce() + Send>;
/// An event callback waiting for the proxy's report, given the status.
type StatusCallback = Box<dyn FnOnce(cl_int) + Send>;

/// Application memory the reader thread writes a read's data into.
pub enum Dest {
    /// Keep the data in the answer.
    Keep,
    /// Exactly this many bytes at this address.
    Memory(*mut u8, usize),
    /// Data laid out by a function (rectangular reads).
    Scatter(Scatterer),
}

// SAFETY: the memory belongs to the application, which OpenCL obliges to keep
// it valid until the read completes; only the reader thread writes it.
unsafe impl Send for Dest {}

struct Slot {
    dest: Dest,
    /// The thread waiting for the answer (none for a non-blocking read).
    waiter: Option<Thread>,
    answer: Option<(Answer, Vec<u8>)>,
    /// When the answer's header and its data arrived (tracing only).
    arrived: Option<(std::time::Instant, std::time::Instant)>,
    /// Events counting this read as pending until it lands.
    landing: Vec<Arc<RObj>>,
    /// The queue and ticket of this read.
    ticket: Option<(Arc<RObj>, u64)>,
}

struct State {
    slots: HashMap<u64, Slot>,
    dead: Option<String>,
    /// Posted calls the proxy reported as failed, not yet returned.
    failed: Vec<(u64, cl_int)>,
    /// Every posted call the proxy reported as failed (by seq), so that a
    /// replay expects them to fail again.
    reported: HashSet<u64>,
    /// While a replay runs: what to make of the failures it brings.
    replay: Option<ReplayCheck>,
    /// Calls a replay sent again under a new seq (old -> new), for the
    /// threads waiting for their answers.
    renumbered: HashMap<u64, u64>,
}

/// Failures reported during a replay (see [`recover`]), by the seqs the
/// replayed calls have now (the proxy wants them increasing, so a replay
/// numbers its calls afresh).
#[derive(Default)]
struct ReplayCheck {
    /// The calls that make the state kept at the last checkpoint.
    state: HashSet<u64>,
    /// Replayed calls that had failed before (reported then).
    before: HashSet<u64>,
    /// Calls of the replay's own (filling memory).
    internal: HashSet<u64>,
    /// Calls that had succeeded and failed on the new proxy.
    diverged: Vec<(u64, cl_int)>,
}

struct Shared {
    state: Mutex<State>,
    /// Bumped after each answer is handed to a waiting thread, which
    /// watches it before it sleeps.
    answers: AtomicU64,
    /// Signalled whenever a read lands or the session dies.
    landed: Condvar,
    callbacks: Mutex<HashMap<u64, StatusCallback>>,
    cb_tx: Mutex<Option<Sender<Job>>>,
    failures_logged: AtomicU32,
    /// Posted calls the proxy reported as failed, ever.
    failures: AtomicU64,
    /// Threads waiting for an answer (see [`ReaderStream`]).
    waiting: AtomicU32,
    /// Whether a recovery runs, and whether its new connection broke too.
    recov: Mutex<Recov>,
}

#[derive(Default)]
struct Recov {
    active: bool,
    broke: bool,
}

struct Out {
    w: Stream,
    batch: Vec<u8>,
    seq: u64,
    /// The proxy has carried out everything sent so far (a blocking call was
    /// answered since the last send): its device idles until the next batch
    /// arrives, so the next kernel launch is sent at once, not with the rest
    /// of the batch (`CRANE_REMOTE_KICK`).
    idle: bool,
    /// What a replay on another proxy needs (see `journal`).
    journal: Journal,
}

pub struct Session {
    addr: Mutex<String>,
    token: Mutex<String>,
    /// Where to reconnect after the proxy died, if not where it was
    /// (`cranectl remote PID --proxy ADDR` during a recovery).
    redirect: Mutex<Option<(String, Option<String>)>>,
    /// When the recovery was last redirected: its wait counts from then.
    redirected_at: Mutex<Option<Instant>>,
    /// Whether the connection now is one a recovery opened (a replay).
    recovered: AtomicBool,
    /// Whether [`watch_connection`] waits [`SILENT_AFTER_REPEAT`] rather
    /// than [`SILENT_AFTER_REDIRECT`] (and leaves TCP's own timeouts as
    /// they are).
    watch_patient: AtomicBool,
    /// When the local fallback was last tried (`local_fallback`).
    local_tried: Mutex<Option<Instant>>,
    /// The connection to crane-proxy now (a second handle on it), for
    /// [`watch_connection`].
    probe: Mutex<Option<Stream>>,
    /// Until when [`watch_connection`] looks at it; `None`: not running.
    watch_until: Mutex<Option<Instant>>,
    /// Recoveries since the last checkpoint (a replay that kills its proxy
    /// again is not tried for ever).
    recoveries: AtomicU32,
    pub limits: Limits,
    /// The proxy's protocol minor version (what it understands).
    pub proxy_minor: u16,
    /// The proxy's number for this session (its `Welcome`), which lanes
    /// name when they join (`remote::lanes`); a replay elsewhere changes it.
    proxy_session: AtomicU64,
    out: Mutex<Out>,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
    cb_thread: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
    next_cookie: AtomicU64,
    /// Addresses of the session's live objects, to tell an object argument
    /// of clSetKernelArg from plain bytes.
    pub live: Mutex<HashSet<usize>>,
    closed: AtomicBool,
    /// Bytes of bulk data sent and received, for transition reports.
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Timing of blocking calls (`CRANE_REMOTE_TRACE=1`).
    trace: Option<Mutex<Trace>>,
}

/// Sums over blocking calls, in nanoseconds: the application's time between
/// them, sending, until the answer's header was read, reading its data,
/// waking the caller.
#[derive(Default)]
struct Trace {
    n: u64,
    last_return: Option<std::time::Instant>,
    gap: u64,
    send: u64,
    net: u64,
    data: u64,
    wake: u64,
}

impl Trace {
    fn add(&mut self, t: [std::time::Instant; 5]) {
        let d = |a: std::time::Instant, b: std::time::Instant| (b - a).as_nanos() as u64;
        if let Some(l) = self.last_return {
            self.gap += d(l, t[0]);
        }
        self.send += d(t[0], t[1]);
        self.net += d(t[1], t[2]);
        self.data += d(t[2], t[3]);
        self.wake += d(t[3], t[4]);
        self.n += 1;
        self.last_return = Some(std::time::Instant::now());
        if self.n == 4096 {
            let us = |v: u64| v as f64 / self.n as f64 / 1e3;
            eprintln!(
                "TRACE client: {} blocking calls, per call (us): between {:.1}, send {:.1}, to answer {:.1}, data {:.1}, wake {:.1}",
                self.n,
                us(self.gap),
                us(self.send),
                us(self.net),
                us(self.data),
                us(self.wake)
            );
            *self = Trace::default();
        }
    }
}

/// How long connecting and the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Session {
    /// Connects and authenticates.
    pub fn open(addr: &str, token: &str) -> Result<Arc<Session>, String> {
        let (w, limits, proxy_minor, proxy_session) = handshake(addr, token)?;
        let r = w.try_clone().map_err(|e| e.to_string())?;
        let probe = w.try_clone().ok();
        let (cb_tx, cb_rx) = channel::<Job>();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: HashMap::new(),
                dead: None,
                failed: Vec::new(),
                reported: HashSet::new(),
                replay: None,
                renumbered: HashMap::new(),
            }),
            answers: AtomicU64::new(0),
            landed: Condvar::new(),
            callbacks: Mutex::new(HashMap::new()),
            cb_tx: Mutex::new(Some(cb_tx)),
            failures_logged: AtomicU32::new(0),
            failures: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            recov: Mutex::new(Recov::default()),
        });
        let cb_thread = std::thread::Builder::new()
            .name("crane-remote-cb".into())
            .spawn(move || {
                for f in cb_rx {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                        warn!("an OpenCL callback panicked");
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        let s = Arc::new(Session {
            addr: Mutex::new(addr.to_string()),
            token: Mutex::new(token.to_string()),
            redirect: Mutex::new(None),
            redirected_at: Mutex::new(None),
            recovered: AtomicBool::new(false),
            watch_patient: AtomicBool::new(false),
            local_tried: Mutex::new(None),
            probe: Mutex::new(probe),
            watch_until: Mutex::new(None),
            recoveries: AtomicU32::new(0),
            limits,
            proxy_minor,
            proxy_session: AtomicU64::new(proxy_session),
            out: Mutex::new(Out {
                w,
                batch: Vec::with_capacity(BATCH_LIMIT),
                seq: 1,
                idle: false,
                journal: Journal::new(
                    crate::config::get().remote_journal_mib << 20,
                    crate::config::get().remote_journal_calls,
                ),
            }),
            shared: shared.clone(),
            reader: Mutex::new(None),
            cb_thread: Mutex::new(Some(cb_thread)),
            next_id: AtomicU64::new(1),
            next_cookie: AtomicU64::new(1),
            live: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            trace: std::env::var_os("CRANE_REMOTE_TRACE")
                .is_some_and(|v| v != "0")
                .then(|| Mutex::new(Trace::default())),
        });
        s.start_reader(r)?;
        debug!("connected to crane-proxy at {addr}: {limits:?}");
        Ok(s)
    }

    fn start_reader(self: &Arc<Self>, r: Stream) -> Result<(), String> {
        let weak = Arc::downgrade(self);
        let shared = self.shared.clone();
        let max_payload = self.limits.max_payload;
        let reader = std::thread::Builder::new()
            .name("crane-remote".into())
            .spawn(move || reader_loop(r, shared, weak, max_payload))
            .map_err(|e| e.to_string())?;
        *lock(&self.reader) = Some(reader);
        Ok(())
    }

    /// Where the session is connected now.
    pub fn addr(&self) -> String {
        lock(&self.addr).clone()
    }

    /// Makes the journal usable for replays from the start: the session is
    /// the application's own (`CRANE_MODE=remote`), every call it sends is
    /// the application's.
    pub fn arm_journal(&self) {
        let mut o = lock(&self.out);
        if o.journal.off.is_none() {
            o.journal.armed = true;
        }
    }

    /// Stops replays until the next checkpoint, once `install` has changed
    /// the RAM copies the last one holds (the end of a read-back when the
    /// process leaves crane-proxy), atomically with respect to a recovery
    /// (see [`Session::checkpoint_with`]).
    pub fn disarm_journal_with(&self, install: impl FnOnce()) {
        let mut o = lock(&self.out);
        install();
        o.journal.armed = false;
        super::journal::FROZEN.store(false, Ordering::Relaxed);
    }

    /// A checkpoint: the proxy is drained and what `install` returns (by id)
    /// holds what every memory object holds there. The journal keeps what
    /// makes the objects and marks them to be filled from RAM at a replay.
    ///
    /// `install` may first put RAM copies in place (what a read-back got
    /// from the proxy) before it describes them. Replays start from
    /// the RAM copies, so they change only with the journal: `install` runs
    /// while the journal is locked, and a recovery (which holds it for its
    /// replay) sees either the last checkpoint and its RAM copies or this
    /// one and its own, never a mix.
    pub fn checkpoint_with(&self, install: impl FnOnce() -> HashMap<crane_wire::Id, Content>) {
        let failed = lock(&self.shared.state).reported.clone();
        let cookies: HashSet<u64> = lock(&self.shared.callbacks).keys().copied().collect();
        let mut o = lock(&self.out);
        let contents = install();
        o.journal.compact(&contents, &failed, &cookies);
        self.recoveries.store(0, Ordering::Relaxed);
        debug!(
            "checkpoint: the journal holds {} call(s), {} KiB",
            o.journal.entries.len(),
            o.journal.bytes >> 10
        );
    }

    /// The journal's state, for status reports: calls, bytes, checkpoints,
    /// whether a replay could run now (or why not).
    pub fn journal_state(&self) -> (usize, u64, u64, Result<(), String>) {
        let o = lock(&self.out);
        let j = &o.journal;
        let usable = match (&j.off, j.armed) {
            (Some(why), _) => Err(why.clone()),
            (None, false) => Err("no checkpoint yet".into()),
            (None, true) => Ok(()),
        };
        (j.entries.len(), j.bytes, j.checkpoints, usable)
    }

    /// Names the proxy (and token) a recovery replays the session on, and
    /// starts its wait again. During a recovery it applies at once. On a
    /// live connection it is kept for a recovery that starts within the
    /// wait (`CRANE_REMOTE_RECOVER_S`): dom0 tells every process where
    /// crane-proxy is as soon as it has created the proxy domain again,
    /// before a process whose proxy domain was destroyed under it can
    /// notice (no FIN or RST comes from a destroyed domain). Meanwhile the
    /// connection is watched ([`watch_connection`]): one whose peer's host
    /// acknowledges nothing for [`SILENT_AFTER_REDIRECT`] (data sent, or
    /// keepalive probes when idle) is left for a replay, instead of after
    /// [`user_timeout`]. Returns whether a recovery was under way.
    pub fn redirect(self: &Arc<Self>, addr: String, token: Option<String>) -> bool {
        // A connection a recovery opened to the very proxy named: most
        // likely dom0's second word about it (see SILENT_AFTER_REPEAT).
        let repeat = self.recovered.load(Ordering::Acquire) && addr == self.addr();
        *lock(&self.redirect) = Some((addr, token));
        *lock(&self.redirected_at) = Some(Instant::now());
        if self.is_recovering() {
            return true;
        }
        self.watch_patient.store(repeat, Ordering::Release);
        let wait = Duration::from_secs(crate::config::get().remote_recover_s);
        let start = {
            let mut until = lock(&self.watch_until);
            let start = until.is_none();
            *until = Some(Instant::now() + wait);
            start
        };
        if start {
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("crane-remote-watch".into())
                .spawn(move || watch_connection(weak));
            if let Err(e) = spawned {
                *lock(&self.watch_until) = None;
                warn!("cannot watch the connection to crane-proxy: {e}");
            }
        }
        false
    }

    /// A redirect kept from before the recovery that began at `start` and
    /// older than its wait is forgotten: it was not about this death.
    fn forget_stale_redirect(&self, start: Instant, wait: Duration) {
        let stale = lock(&self.redirected_at).is_some_and(|t| start.duration_since(t) >= wait);
        if stale {
            lock(&self.redirect).take();
            lock(&self.redirected_at).take();
        }
    }

    /// Since when a recovery that began at `start` has been waiting: the
    /// last redirect starts the wait again.
    fn waiting_since(&self, start: Instant) -> Instant {
        lock(&self.redirected_at).map_or(start, |t| t.max(start))
    }

    pub fn is_recovering(&self) -> bool {
        lock(&self.shared.recov).active
    }
}

/// Connects to the proxy at `addr` and opens a session with `token`:
/// the connection, the proxy's limits, its protocol minor version and its
/// number for the session.
fn handshake(addr: &str, token: &str) -> Result<(Stream, Limits, u16, u64), String> {
    let mut w = Stream::connect(addr, CONNECT_TIMEOUT)
        .map_err(|e| format!("cannot connect to crane-proxy at {addr}: {e}"))?;
    let client = format!(
        "{}[{}]",
        std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
            .unwrap_or_default(),
        std::process::id()
    );
    let mut buf = Vec::new();
    let hello = Call::Hello {
        major: VERSION_MAJOR,
        minor: VERSION_MINOR,
        token: token.to_string(),
        client,
    };
    crane_wire::encode(&mut buf, 1, &hello, 0).map_err(|e| e.to_string())?;
    w.write_all(&buf)
        .map_err(|e| format!("crane-proxy at {addr}: {e}"))?;
    w.set_read_timeout(Some(CONNECT_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    let h = crane_wire::read_frame(&mut w, 0, &mut body)
        .map_err(|e| format!("crane-proxy at {addr} did not greet: {e}"))?
        .ok_or_else(|| format!("crane-proxy at {addr} closed the connection"))?;
    let (limits, proxy_minor, session) = match crane_wire::decode::<Answer>(&body) {
        Ok(Answer::Welcome {
            major,
            minor,
            limits,
            session,
        }) if major == VERSION_MAJOR && h.seq == 1 => (limits, minor, session),
        Ok(Answer::Welcome { major, minor, .. }) => {
            return Err(format!(
                "crane-proxy at {addr} speaks protocol {major}.{minor}, this library {VERSION_MAJOR}.{VERSION_MINOR}"
            ));
        }
        Ok(Answer::Goodbye { reason }) => {
            return Err(format!(
                "crane-proxy at {addr} refused the session: {reason}"
            ));
        }
        Ok(a) => return Err(format!("crane-proxy at {addr} answered {a:?} to Hello")),
        Err(e) => return Err(format!("crane-proxy at {addr}: {e}")),
    };
    w.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok((w, limits, proxy_minor, session))
}

impl Session {
    /// The proxy's number for this session now.
    pub fn proxy_session(&self) -> u64 {
        self.proxy_session.load(Ordering::Acquire)
    }

    pub fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn dead(&self) -> Option<String> {
        lock(&self.shared.state).dead.clone()
    }

    /// Once the connection is gone, the reason to give for a failure that
    /// follows from it, in place of the error code every call then gets (or
    /// what a failed query leaves: no name, no devices).
    pub fn broken(&self) -> Option<String> {
        self.dead().map(|why| {
            format!(
                "the connection to crane-proxy at {} broke: {why}",
                self.addr()
            )
        })
    }

    fn check_alive(&self) -> Result<(), cl_int> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(GONE);
        }
        match &lock(&self.shared.state).dead {
            Some(_) => Err(GONE),
            None => Ok(()),
        }
    }

    /// Appends a call to the batch (payload copied, or sent at once straight
    /// from `payload` when large). Returns the call's sequence number.
    fn enqueue(
        &self,
        o: &mut Out,
        call: &Call,
        payload: &[u8],
        flush: bool,
    ) -> Result<u64, cl_int> {
        o.seq += 1;
        let seq = o.seq;
        if let Err(e) = crane_wire::encode(&mut o.batch, seq, call, payload.len() as u64) {
            warn!("cannot encode {}: {e}", call.name());
            return Err(CL_INVALID_VALUE);
        }
        // Crane's own rebuild (the gate shut) ends in a checkpoint, which
        // needs no copy of what it wrote.
        if o.journal.record(seq, call, payload, crate::gate::is_open()) == After::Checkpoint {
            ask_checkpoint();
        }
        self.sent.fetch_add(payload.len() as u64, Ordering::Relaxed);
        // The first launch after the proxy went idle goes out at once: the
        // proxy starts it while the application builds the rest of the
        // batch (a frame's further launches, its read), where it would
        // otherwise wait for the whole batch.
        let kick = o.idle && matches!(call, Call::EnqueueNdRange { .. });
        if let Err(e) = put(o, payload, flush || kick) {
            return self.send_failed(o, e).map(|()| seq);
        }
        Ok(seq)
    }

    /// A send failed: the connection is gone. With a usable journal the call
    /// is in it and a recovery will send it again (the reader thread notices
    /// the broken connection too); without, the session is dead.
    fn send_failed(&self, o: &mut Out, e: std::io::Error) -> Result<(), cl_int> {
        o.batch.clear();
        if o.journal.usable() && !self.closed.load(Ordering::Acquire) {
            debug!("sending to crane-proxy failed ({e}); the call waits for the recovery");
            o.w.shutdown();
            return Ok(());
        }
        self.die(format!("sending to crane-proxy failed: {e}"));
        Err(GONE)
    }

    /// Sends a posted call; `flush` sends the batch now (for calls that may
    /// release a waiter, such as setting a user event).
    pub fn post(&self, call: &Call, payload: &[u8], flush: bool) -> Result<(), cl_int> {
        self.check_alive()?;
        let mut o = lock(&self.out);
        if crate::config::get().remote_batch {
            return self.enqueue(&mut o, call, payload, flush).map(|_| ());
        }
        // Unbatched (for comparison): wait for each call to be carried out.
        self.enqueue(&mut o, call, payload, false)?;
        drop(o);
        self.call(&Call::Sync, &[], Dest::Keep).map(|_| ())
    }

    /// Sends a posted call and, when the application made it (the gate is
    /// open; not while crane recreates objects at a transition, which checks
    /// all of them with one round trip at the end), waits until the proxy has
    /// carried it out and returns its failure, as the vendor would: creating
    /// an object reports its error at once. One round trip per call.
    pub fn post_checked(&self, call: &Call, payload: &[u8]) -> Result<(), cl_int> {
        if !crate::gate::is_open() {
            return self.post(call, payload, false);
        }
        match self.post_then_call(call, payload, &Call::Sync)? {
            Answer::Status(CL_SUCCESS) => Ok(()),
            Answer::Status(e) => Err(e),
            _ => Err(CL_INVALID_OPERATION),
        }
    }

    /// Sends a posted call followed by a replying one and waits for the
    /// latter's answer: the posted call's failure, if any, is returned
    /// instead (and not reported again).
    pub fn post_then_call(
        &self,
        call: &Call,
        payload: &[u8],
        then: &Call,
    ) -> Result<Answer, cl_int> {
        self.check_alive()?;
        let seq = {
            let mut o = lock(&self.out);
            self.enqueue(&mut o, call, payload, false)?
        };
        let (a, _) = self.call(then, &[], Dest::Keep)?;
        // The proxy reports a failed posted call before it answers a later
        // call, so its failure is in the list by now.
        let mut st = lock(&self.shared.state);
        if let Some(i) = st.failed.iter().position(|f| f.0 == seq) {
            return Err(st.failed.remove(i).1);
        }
        Ok(a)
    }

    /// Sends whatever is batched.
    pub fn flush(&self) -> Result<(), cl_int> {
        self.check_alive()?;
        let mut guard = lock(&self.out);
        let o = &mut *guard;
        if o.batch.is_empty() {
            return Ok(());
        }
        o.idle = false;
        let r = o.w.write_all(&o.batch);
        o.batch.clear();
        if let Err(e) = r {
            return self.send_failed(o, e);
        }
        Ok(())
    }

    fn send_with_slot(&self, call: &Call, payload: &[u8], slot: Slot) -> Result<u64, cl_int> {
        self.check_alive()?;
        let mut o = lock(&self.out);
        let seq = o.seq + 1;
        lock(&self.shared.state).slots.insert(seq, slot);
        match self.enqueue(&mut o, call, payload, true) {
            Ok(s) => {
                debug_assert_eq!(s, seq);
                Ok(seq)
            }
            Err(e) => {
                lock(&self.shared.state).slots.remove(&seq);
                Err(e)
            }
        }
    }

    /// Sends a call the proxy answers and waits for the answer.
    pub fn call(
        &self,
        call: &Call,
        payload: &[u8],
        dest: Dest,
    ) -> Result<(Answer, Vec<u8>), cl_int> {
        let slot = Slot {
            dest,
            waiter: Some(std::thread::current()),
            answer: None,
            arrived: None,
            landing: Vec::new(),
            ticket: None,
        };
        let t0 = self.trace.is_some().then(std::time::Instant::now);
        let _waiting = Waiting::new(&self.shared.waiting);
        let mut seq = self.send_with_slot(call, payload, slot)?;
        let t1 = self.trace.is_some().then(std::time::Instant::now);
        let spin = Duration::from_micros(crate::config::get().remote_spin_us);
        let mut spin_until = (!spin.is_zero()).then(|| std::time::Instant::now() + spin);
        let mut seen = self.shared.answers.load(Ordering::Acquire);
        loop {
            {
                let mut st = lock(&self.shared.state);
                if let Some(slot) = st.slots.get_mut(&seq) {
                    if let Some(a) = slot.answer.take() {
                        let arrived = slot.arrived;
                        st.slots.remove(&seq);
                        drop(st);
                        self.answered(seq);
                        if let (Some(tr), Some(t0), Some(t1), Some((t2, t3))) =
                            (&self.trace, t0, t1, arrived)
                        {
                            let now = std::time::Instant::now();
                            lock(tr).add([t0, t1, t2, t3, now]);
                        }
                        return Ok(a);
                    }
                    if st.dead.is_some() {
                        st.slots.remove(&seq);
                        return Err(GONE);
                    }
                } else if let Some(n) = st.renumbered.remove(&seq) {
                    // A replay on another proxy sent the call again.
                    seq = n;
                    continue;
                } else {
                    return Err(GONE);
                }
            }
            // Watch for an answer (yielding to whatever else wants the
            // core), then sleep until the reader thread wakes us.
            if let Some(until) = spin_until {
                loop {
                    std::thread::yield_now();
                    let now = self.shared.answers.load(Ordering::Acquire);
                    if now != seen {
                        seen = now;
                        break;
                    }
                    if std::time::Instant::now() >= until {
                        spin_until = None;
                        break;
                    }
                }
                continue;
            }
            std::thread::park_timeout(Duration::from_millis(200));
        }
    }

    /// Notes that the proxy has answered call `seq`: if nothing was sent after
    /// it, the proxy is idle.
    fn answered(&self, seq: u64) {
        if !crate::config::get().remote_kick {
            return;
        }
        let mut o = lock(&self.out);
        if o.seq == seq && o.batch.is_empty() {
            o.idle = true;
        }
    }

    /// Sends a read whose data the reader thread lands in `dest` when it
    /// arrives. Until then `event` (if any) counts it as pending and `queue`
    /// keeps `ticket` outstanding.
    pub fn read_async(
        &self,
        call: &Call,
        dest: Dest,
        event: Option<Arc<RObj>>,
        queue: Arc<RObj>,
        ticket: u64,
    ) -> Result<(), cl_int> {
        if let Some(e) = &event {
            e.pending.fetch_add(1, Ordering::AcqRel);
        }
        let slot = Slot {
            dest,
            waiter: None,
            answer: None,
            arrived: None,
            landing: event.clone().into_iter().collect(),
            ticket: Some((queue.clone(), ticket)),
        };
        self.send_with_slot(call, &[], slot)
            .map(|_| ())
            .inspect_err(|_| {
                if let Some(e) = &event {
                    e.pending.fetch_sub(1, Ordering::AcqRel);
                }
                land_ticket(&queue, ticket);
            })
    }

    /// Waits until `cond` no longer holds, or the session dies.
    fn wait_while(&self, mut cond: impl FnMut() -> bool) -> Result<(), cl_int> {
        let mut st = lock(&self.shared.state);
        while cond() {
            if st.dead.is_some() {
                return Err(GONE);
            }
            st = self
                .shared
                .landed
                .wait_timeout(st, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Waits until the read counted by event `o` has landed.
    pub fn wait_landed(&self, o: &RObj) -> Result<(), cl_int> {
        self.wait_while(|| o.pending.load(Ordering::Acquire) > 0)
    }

    /// Waits until every read enqueued on `queue` before `ticket` has landed.
    pub fn wait_reads_before(&self, queue: &RObj, ticket: u64) -> Result<(), cl_int> {
        self.wait_while(|| queue.reads_before(ticket))
    }

    /// Waits until event `e` is complete here too: its own read, and on an
    /// in-order queue every read enqueued before its command, have landed.
    pub fn wait_event_landed(&self, e: &RObj) -> Result<(), cl_int> {
        self.wait_landed(e)?;
        let after = e.after.lock().unwrap_or_else(|x| x.into_inner()).clone();
        match after {
            Some((q, t)) => self.wait_reads_before(&q, t),
            None => Ok(()),
        }
    }

    /// How many posted calls the proxy has reported as failed so far.
    pub fn failures(&self) -> u64 {
        self.shared.failures.load(Ordering::Acquire)
    }

    /// The first failure of a posted call since the last time, if any: what a
    /// synchronising call returns when it succeeded itself.
    pub fn take_failure(&self) -> Option<cl_int> {
        let mut st = lock(&self.shared.state);
        let first = st.failed.first().map(|f| f.1);
        st.failed.clear();
        first
    }

    /// Registers `f` to run (on the callback thread) when the proxy reports
    /// `cookie`.
    pub fn register_callback(&self, f: StatusCallback) -> u64 {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.callbacks).insert(cookie, f);
        cookie
    }

    /// Runs `f` on the callback thread.
    pub fn defer(&self, f: Job) {
        if let Some(tx) = lock(&self.shared.cb_tx).as_ref() {
            let _ = tx.send(f);
        }
    }

    fn die(&self, why: String) {
        die(&self.shared, why);
    }

    /// Ends the session: tells the proxy, which frees everything it holds for
    /// it, and stops the threads.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let mut o = lock(&self.out);
            if lock(&self.shared.state).dead.is_none() && !self.is_recovering() {
                let _ = self.enqueue(&mut o, &Call::Bye, &[], true);
            }
            o.journal.give_up_quietly();
            o.w.shutdown();
        }
        if let Some(r) = lock(&self.reader).take() {
            let _ = r.join();
        }
        lock(&self.shared.cb_tx).take();
        if let Some(t) = lock(&self.cb_thread).take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

fn die(shared: &Shared, why: String) {
    let mut st = lock(&shared.state);
    if st.dead.is_none() {
        warn!("{why}; OpenCL calls now fail with CL_OUT_OF_RESOURCES");
        st.dead = Some(why);
    }
    for (_, slot) in st.slots.drain() {
        if let Some(t) = &slot.waiter {
            t.unpark();
        }
    }
    drop(st);
    shared.landed.notify_all();
    let cbs: Vec<_> = lock(&shared.callbacks).drain().collect();
    if let Some(tx) = lock(&shared.cb_tx).as_ref() {
        for (_, f) in cbs {
            let _ = tx.send(Box::new(move || f(GONE)));
        }
    }
}

/// Counts a thread as waiting for an answer while it lives.
struct Waiting<'a>(&'a AtomicU32);

impl<'a> Waiting<'a> {
    fn new(n: &'a AtomicU32) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The reader thread's side of the socket. While an answer is due soon (a
/// thread waits for one, or the last answer came less than
/// `CRANE_REMOTE_SPIN_US` ago: a frame loop's next blocking call follows
/// within microseconds), it watches the socket with non-blocking `recv`s,
/// yielding the core between them, before it sleeps in `read`: an answer then
/// costs no wake-up of this thread (the waiting thread watches for it the
/// same way).
struct ReaderStream {
    s: Stream,
    shared: Arc<Shared>,
    spin: Duration,
    /// Until when to watch after the last answer.
    hot_until: Option<Instant>,
}

impl ReaderStream {
    fn recv_now(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = match &self.s {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        // SAFETY: `buf` is writable for its length; the socket is ours.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn watching(&self) -> bool {
        self.shared.waiting.load(Ordering::Acquire) > 0
            || self.hot_until.is_some_and(|t| Instant::now() < t)
    }
}

impl Read for ReaderStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.spin.is_zero() && self.watching() {
            let limit = Instant::now() + self.spin;
            loop {
                match self.recv_now(buf) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                        ) => {}
                    r => return r,
                }
                if Instant::now() >= limit || !self.watching() {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.s.read(buf)
    }
}

fn reader_loop(
    r: Stream,
    shared: Arc<Shared>,
    session: std::sync::Weak<Session>,
    max_payload: u64,
) {
    let spin = Duration::from_micros(crate::config::get().remote_spin_us);
    let r = ReaderStream {
        s: r,
        shared: shared.clone(),
        spin,
        hot_until: None,
    };
    // Buffered: a header and a small answer cost one system call, not
    // three; large payloads still go straight into their destination.
    let mut r = std::io::BufReader::with_capacity(64 << 10, r);
    let mut body = Vec::new();
    // Whether the connection broke (the proxy died, the network failed), as
    // opposed to the proxy ending the session or breaking the protocol.
    let (why, broke) = loop {
        let h = match crane_wire::read_frame(&mut r, max_payload, &mut body) {
            Ok(Some(h)) => h,
            Ok(None) => break ("crane-proxy closed the connection".to_string(), true),
            Err(WireError::Io(e)) => {
                break (format!("the connection to crane-proxy failed: {e}"), true);
            }
            Err(e) => {
                break (
                    format!("crane-proxy sent something that is not a frame: {e}"),
                    false,
                );
            }
        };
        let answer = match crane_wire::decode::<Answer>(&body) {
            Ok(a) => a,
            Err(e) => {
                break (
                    format!("crane-proxy sent an undecodable answer: {e}"),
                    false,
                );
            }
        };
        if let Err(e) = handle(&mut r, &shared, &session, h, answer) {
            break e;
        }
        r.get_mut().hot_until = Some(Instant::now() + spin);
    };
    // Unblocks a thread writing to the dead connection (a send to a proxy
    // domain that vanished would otherwise wait for TCP to give up).
    r.get_ref().s.shutdown();
    let closing = session
        .upgrade()
        .is_none_or(|s| s.closed.load(Ordering::Acquire));
    if !closing
        && broke
        && let Some(s) = session.upgrade()
    {
        {
            let mut r = lock(&shared.recov);
            if r.active {
                // The connection of a replay broke: the recovery tries again.
                r.broke = true;
                return;
            }
            r.active = true;
        }
        let told = why.clone();
        let spawned = std::thread::Builder::new()
            .name("crane-recover".into())
            .spawn(move || {
                let result = recover(&s, told);
                lock(&s.shared.recov).active = false;
                if let Err(why) = result {
                    die(&s.shared, why);
                }
            });
        if let Err(e) = spawned {
            lock(&shared.recov).active = false;
            die(&shared, format!("{why} (cannot start a recovery: {e})"));
        }
        return;
    }
    if closing {
        let mut st = lock(&shared.state);
        st.dead
            .get_or_insert_with(|| "the session was closed".into());
        drop(st);
        die(&shared, String::new());
    } else {
        die(&shared, why);
    }
}

/// Handles one frame from the proxy. An error says why the session cannot
/// go on, and whether it is the connection that broke (a replay may then
/// save it) rather than the proxy that misbehaved.
fn handle(
    r: &mut impl Read,
    shared: &Shared,
    session: &std::sync::Weak<Session>,
    h: Header,
    answer: Answer,
) -> Result<(), (String, bool)> {
    let protocol = |why: String| (why, false);
    if h.seq == 0 {
        match answer {
            Answer::Failed { seq, status } => {
                let mut st = lock(&shared.state);
                if !replay_failure(&mut st, seq, status) {
                    shared.failures.fetch_add(1, Ordering::AcqRel);
                    if shared.failures_logged.fetch_add(1, Ordering::Relaxed) < 20 {
                        warn!(
                            "crane-proxy: posted call #{seq} failed with OpenCL error {}",
                            crate::entry::error_text(status)
                        );
                    }
                    if st.reported.len() < 1 << 20 {
                        st.reported.insert(seq);
                    }
                    if st.failed.len() < 1024 {
                        st.failed.push((seq, status));
                    }
                }
            }
            Answer::EventFired { cookie, status } => {
                if let Some(f) = lock(&shared.callbacks).remove(&cookie)
                    && let Some(tx) = lock(&shared.cb_tx).as_ref()
                {
                    let _ = tx.send(Box::new(move || f(status)));
                }
            }
            Answer::Goodbye { reason } => {
                return Err(protocol(format!("crane-proxy ended the session: {reason}")));
            }
            Answer::Output => {
                // The kernels' printf output, before the answer of the call
                // that waited for them, as a local vendor would print it.
                let mut v = vec![0u8; h.payload_len as usize];
                r.read_exact(&mut v)
                    .map_err(|e| (format!("reading from crane-proxy: {e}"), true))?;
                write_stdout(&v);
                return Ok(());
            }
            a => return Err(protocol(format!("crane-proxy sent an unexpected {a:?}"))),
        }
        skip(r, h.payload_len)?;
        return Ok(());
    }
    // The slot stays registered while its data is read (its waiter checks it),
    // but its destination is taken out so the lock is not held meanwhile.
    let (dest, waiter, landing, ticket) = {
        let mut st = lock(&shared.state);
        let Some(slot) = st.slots.get_mut(&h.seq) else {
            return Err(protocol(format!(
                "crane-proxy answered call #{} that nobody waits for",
                h.seq
            )));
        };
        (
            std::mem::replace(&mut slot.dest, Dest::Keep),
            slot.waiter.clone(),
            std::mem::take(&mut slot.landing),
            slot.ticket.take(),
        )
    };
    let n = h.payload_len as usize;
    let mut traced = false;
    if let Some(s) = session.upgrade() {
        s.received.fetch_add(n as u64, Ordering::Relaxed);
        traced = s.trace.is_some();
    }
    let header_at = traced.then(std::time::Instant::now);
    let mut kept = Vec::new();
    let ok_data = matches!(answer, Answer::Data(CL_SUCCESS));
    // The connection broke inside the data: the slot gets back what it had,
    // so that a replay's answer lands where this one would have.
    let restore = |dest: Dest, landing: Vec<Arc<RObj>>, ticket: Option<(Arc<RObj>, u64)>| {
        if let Some(slot) = lock(&shared.state).slots.get_mut(&h.seq) {
            slot.dest = dest;
            slot.landing = landing;
            slot.ticket = ticket;
        }
    };
    match dest {
        Dest::Memory(p, len) if ok_data && len == n => {
            // SAFETY: `p` is application memory of `len` bytes that OpenCL
            // keeps valid until this read completes (see `Dest`).
            let buf = unsafe { std::slice::from_raw_parts_mut(p, len) };
            if let Err(e) = r.read_exact(buf) {
                restore(Dest::Memory(p, len), landing, ticket);
                return Err((format!("reading data from crane-proxy: {e}"), true));
            }
        }
        Dest::Scatter(f) if ok_data => {
            let mut v = vec![0u8; n];
            if let Err(e) = r.read_exact(&mut v) {
                restore(Dest::Scatter(f), landing, ticket);
                return Err((format!("reading data from crane-proxy: {e}"), true));
            }
            f(&v);
        }
        Dest::Keep => {
            kept = vec![0u8; n];
            r.read_exact(&mut kept)
                .map_err(|e| (format!("reading from crane-proxy: {e}"), true))?;
        }
        _ => {
            if ok_data {
                return Err(protocol(format!(
                    "crane-proxy sent {n} bytes for a read of a different size (call #{})",
                    h.seq
                )));
            }
            skip(r, h.payload_len)?;
        }
    }
    let mut st = lock(&shared.state);
    if let Answer::Data(status) = answer
        && status != CL_SUCCESS
        && waiter.is_none()
    {
        // A non-blocking read failed: report it at the next synchronising call.
        st.failed.push((h.seq, status));
    }
    for o in landing {
        o.pending.fetch_sub(1, Ordering::AcqRel);
    }
    if let Some((q, t)) = ticket {
        land_ticket(&q, t);
    }
    match waiter {
        Some(t) => {
            // Gone if the session died meanwhile; the waiter has been told.
            if let Some(slot) = st.slots.get_mut(&h.seq) {
                slot.answer = Some((answer, kept));
                slot.arrived = header_at.map(|t| (t, std::time::Instant::now()));
            }
            drop(st);
            shared.answers.fetch_add(1, Ordering::AcqRel);
            t.unpark();
        }
        None => {
            st.slots.remove(&h.seq);
            drop(st);
            shared.landed.notify_all();
        }
    }
    Ok(())
}

/// Writes kernel output to the application's standard output (fd 1, as it
/// is now: the application may have pointed it at a file); a closed pipe or
/// any other error drops it, as a vendor's printf would.
fn write_stdout(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length.
        let n = unsafe { libc::write(1, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n == 0
            || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
        {
            return;
        }
    }
}

fn land_ticket(queue: &RObj, ticket: u64) {
    queue
        .reads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .outstanding
        .remove(&ticket);
}

fn skip(r: &mut impl Read, n: u64) -> Result<(), (String, bool)> {
    std::io::copy(&mut r.take(n), &mut std::io::sink())
        .map_err(|e| (format!("reading from crane-proxy: {e}"), true))
        .and_then(|got| {
            if got == n {
                Ok(())
            } else {
                Err(("crane-proxy closed the connection mid-frame".into(), true))
            }
        })
}

/// During a replay, takes a posted call's failure if it belongs to the
/// replay: one that failed before too (already reported: dropped), or one
/// that had succeeded, or a call of the replay's own (the replay diverged).
/// A call sent after the last checkpoint failing for the first time is an
/// ordinary failure (it may never have been reported before the proxy died).
fn replay_failure(st: &mut State, seq: u64, status: cl_int) -> bool {
    let Some(rc) = st.replay.as_mut() else {
        return false;
    };
    let before = rc.before.contains(&seq);
    if rc.internal.contains(&seq) || (rc.state.contains(&seq) && !before) {
        rc.diverged.push((seq, status));
        return true;
    }
    before
}

/// Asks for a checkpoint (the journal has grown past its limit), taken on a
/// thread of its own as the control socket's requests are.
fn ask_checkpoint() {
    let spawned = std::thread::Builder::new()
        .name("crane-checkpoint".into())
        .spawn(|| {
            let _one_at_a_time = crate::control::exclusive();
            if let Err(e) = crate::lifecycle::checkpoint(Duration::from_secs(30)) {
                warn!("a checkpoint of the remote session failed: {e}");
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start a checkpoint: {e}");
    }
}

/// The most recoveries between two checkpoints: a replay that ends its
/// proxy again (or a proxy that keeps dying) is not tried for ever.
const MAX_RECOVERIES: u32 = 5;

/// How often a recovery tries to reach a proxy.
const RECONNECT_EVERY: Duration = Duration::from_millis(50);

/// After the connection to crane-proxy broke: waits for a proxy (the same
/// address, restarted, or the one a `Remote` request names meanwhile),
/// replays the journal there and carries on; the application's calls wait
/// meanwhile. Returns why it could not.
fn recover(s: &Arc<Session>, why: String) -> Result<(), String> {
    let start = Instant::now();
    if !lock(&s.out).journal.usable() {
        let j = s.journal_state().3.err().unwrap_or_default();
        return Err(format!("{why} (no replay: {j})"));
    }
    if s.recoveries.fetch_add(1, Ordering::AcqRel) >= MAX_RECOVERIES {
        return Err(format!(
            "{why} ({MAX_RECOVERIES} recoveries since the last checkpoint: giving up)"
        ));
    }
    let wait = Duration::from_secs(crate::config::get().remote_recover_s);
    s.forget_stale_redirect(start, wait);
    warn!(
        "{why}; waiting up to {}s for crane-proxy at {} (or the address a \
         `cranectl remote PID --proxy ADDR` gives) to take the session back",
        wait.as_secs(),
        s.addr()
    );
    loop {
        let result = reconnect_and_replay(s, start, wait);
        let mut r = lock(&s.shared.recov);
        let broke = std::mem::take(&mut r.broke);
        match result {
            // Done, unless the new connection broke meanwhile (its reader
            // left the recovery to us). On the local fallback's proxy, the
            // process then goes home to the local vendor.
            Ok(()) if !broke => {
                if super::fallback::is_local(&s.addr()) {
                    super::fallback::go_home();
                }
                return Ok(());
            }
            Ok(()) => warn!("the new connection to crane-proxy broke too; trying again"),
            Err(Replay::Broken(e)) if s.waiting_since(start).elapsed() < wait => {
                warn!(
                    "the new connection to crane-proxy broke during the replay ({e}); trying again"
                );
            }
            Err(Replay::Broken(e) | Replay::Failed(e)) => {
                return Err(format!("{why}; {e}"));
            }
        }
        drop(r);
        lock(&s.shared.state).replay = None;
        std::thread::sleep(RECONNECT_EVERY);
    }
}

/// After a redirect on a live connection ([`Session::redirect`]), until
/// its wait is over. An idle connection (a call sent and acknowledged, its
/// answer awaited) gets quick keepalive probes and [`QUICK_TIMEOUT`]: the
/// kernel ends it if the peer's host answers none (a proxy busy with a long
/// kernel, or stopped, still has its kernel answer them). A busy one is
/// looked at every 250 ms and left (shut down, so that the reader starts a
/// recovery) once TCP has had data outstanding and no acknowledgement for
/// [`SILENT_AFTER_REDIRECT`] in two looks in a row (the next retransmission
/// may be further away than the quick timeout). Then the normal detection
/// again.
fn watch_connection(s: std::sync::Weak<Session>) {
    let mut silent_looks = 0;
    let mut quick = false;
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let Some(s) = s.upgrade() else {
            return;
        };
        {
            let mut until = lock(&s.watch_until);
            let over = until.is_none_or(|t| Instant::now() >= t)
                || s.closed.load(Ordering::Acquire)
                || s.is_recovering();
            if over {
                *until = None;
                drop(until);
                // The normal detection again (on a connection a recovery
                // replaced meanwhile, it is what it has already).
                if quick && let Some(Stream::Tcp(t)) = lock(&s.probe).as_ref() {
                    tune(&socket2::SockRef::from(t), false);
                }
                return;
            }
        }
        let probe = lock(&s.probe);
        let Some(stream) = probe.as_ref() else {
            continue;
        };
        let silence = tcp_silence(stream);
        let patient = s.watch_patient.load(Ordering::Acquire);
        let silent_after = if patient {
            SILENT_AFTER_REPEAT
        } else {
            SILENT_AFTER_REDIRECT
        };
        if !quick
            && !patient
            && let Stream::Tcp(t) = stream
        {
            tune(&socket2::SockRef::from(t), true);
            quick = true;
            if let Some((unacked, quiet)) = silence {
                warn!(
                    "dom0 named where crane-proxy is now: watching the connection to {} \
                     ({unacked} segment(s) unacknowledged, the last acknowledgement {} ms ago)",
                    s.addr(),
                    quiet.as_millis()
                );
            }
        }
        match silence {
            Some((unacked, quiet)) if unacked > 0 && quiet >= silent_after => {
                silent_looks += 1;
                if silent_looks >= 2 {
                    warn!(
                        "nothing sent to crane-proxy at {} acknowledged for {} ms, after dom0 \
                         named where crane-proxy is now: leaving the connection for a replay",
                        s.addr(),
                        quiet.as_millis()
                    );
                    stream.shutdown();
                    drop(probe);
                    *lock(&s.watch_until) = None;
                    return;
                }
            }
            _ => silent_looks = 0,
        }
    }
}

/// Why a replay stopped.
enum Replay {
    /// The new connection broke: worth another try.
    Broken(String),
    /// The replay cannot work (no proxy came, it diverged).
    Failed(String),
}

impl From<std::io::Error> for Replay {
    fn from(e: std::io::Error) -> Replay {
        Replay::Broken(e.to_string())
    }
}

/// Once no proxy has taken the session back for `CRANE_REMOTE_LOCAL_AFTER_S`:
/// points the recovery at a crane-proxy inside this process on the local
/// vendor, if one offers a platform (`fallback`); tried again every as many
/// seconds while it does not. A proxy dom0 or an operator named since (a
/// redirect) is waited for until `CRANE_REMOTE_LOCAL_AFTER_S` before the
/// wait (`CRANE_REMOTE_RECOVER_S`) would end: craned names a proxy domain
/// it is creating again every 20 s until it answers, and each time the wait
/// starts again; when that stops (craned busy or gone, the proxy not
/// answering) the process goes to the local vendor rather than failing. (In
/// the end-to-end tier a proxy domain destroyed during a migration answered
/// after more than a minute, and the program, whose guest had its GPU again,
/// failed.)
fn local_fallback(s: &Session, start: Instant) {
    let cfg = crate::config::get();
    let after = Duration::from_secs(cfg.remote_local_after_s);
    let wait = Duration::from_secs(cfg.remote_recover_s);
    let grace = after.max(wait.saturating_sub(after));
    let named_lately = lock(&s.redirected_at).is_some_and(|t| t.elapsed() < grace);
    if after.is_zero() || start.elapsed() < after || named_lately {
        return;
    }
    if lock(&s.redirect)
        .as_ref()
        .is_some_and(|(a, _)| super::fallback::is_local(a))
    {
        return;
    }
    let after = after.as_secs();
    let mut last = lock(&s.local_tried);
    if last.is_some_and(|t| t.elapsed() < Duration::from_secs(after)) {
        return;
    }
    *last = Some(Instant::now());
    match super::fallback::start() {
        Ok((addr, token)) => {
            warn!("no crane-proxy came back within {after}s: replaying onto the local vendor");
            *lock(&s.redirect) = Some((addr, Some(token)));
        }
        Err(e) => debug!("no local fallback: {e}"),
    }
}

fn reconnect_and_replay(s: &Arc<Session>, start: Instant, wait: Duration) -> Result<(), Replay> {
    let (w, limits, addr, token) = loop {
        if s.closed.load(Ordering::Acquire) {
            return Err(Replay::Failed("the session was closed".into()));
        }
        local_fallback(s, start);
        let (addr, token) = lock(&s.redirect)
            .clone()
            .map(|(a, t)| (a, t.unwrap_or_else(|| lock(&s.token).clone())))
            .unwrap_or_else(|| (s.addr(), lock(&s.token).clone()));
        match handshake(&addr, &token) {
            Ok((w, limits, _, id)) => {
                s.proxy_session.store(id, Ordering::Release);
                break (w, limits, addr, token);
            }
            Err(e) if s.waiting_since(start).elapsed() >= wait => {
                return Err(Replay::Failed(format!(
                    "no crane-proxy took the session back within {}s (last try: {e})",
                    wait.as_secs()
                )));
            }
            Err(_) => std::thread::sleep(RECONNECT_EVERY),
        }
    };
    if limits.max_payload < s.limits.max_payload {
        return Err(Replay::Failed(format!(
            "crane-proxy at {addr} takes smaller frames than the one that died"
        )));
    }
    let r = w.try_clone()?;
    *lock(&s.probe) = w.try_clone().ok();
    let mut o = lock(&s.out);
    o.w = w;
    s.start_reader(r).map_err(Replay::Failed)?;
    let t = Instant::now();
    let (calls, bytes) = replay(s, &mut o).map_err(|e| {
        o.w.shutdown();
        match e {
            Replay::Failed(e) => Replay::Failed(format!(
                "replaying the session on crane-proxy at {addr} failed: {e}"
            )),
            broken => broken,
        }
    })?;
    *lock(&s.addr) = addr.clone();
    *lock(&s.token) = token;
    lock(&s.redirect).take();
    lock(&s.redirected_at).take();
    s.recovered.store(true, Ordering::Release);
    warn!(
        "crane-proxy at {addr} took the session back: {calls} call(s) and {} KiB replayed \
         in {} ms, {} ms after the connection broke",
        bytes >> 10,
        t.elapsed().as_millis(),
        start.elapsed().as_millis()
    );
    Ok(())
}

/// Sends the journal to a fresh proxy: the state at the last checkpoint
/// (objects made, memory filled from RAM), then every call since, except
/// queries and reads that were answered; calls still waiting for an answer
/// get it from the new proxy. Ends with a round trip that shows whether
/// anything that had worked failed there. Returns the calls and payload bytes
/// sent.
fn replay(s: &Session, o: &mut Out) -> Result<(u64, u64), Replay> {
    let pending: HashSet<u64> = lock(&s.shared.state).slots.keys().copied().collect();
    let since = o.journal.since;
    lock(&s.shared.state).replay = Some(ReplayCheck::default());
    // What was batched is in the journal: it goes with the replay.
    o.batch.clear();
    let mut entries = std::mem::take(&mut o.journal.entries);
    let result = replay_entries(s, o, &mut entries, since, &pending);
    o.journal.entries = entries;
    let sent = result?;
    // Everything sent: a round trip, after which every failure is known.
    let seq = internal_call(s, o, &Call::Sync, &[], true)?;
    match wait_answer(s, seq)? {
        Answer::Status(_) => {}
        a => {
            return Err(Replay::Failed(format!(
                "crane-proxy answered {a:?} to Sync"
            )));
        }
    }
    let diverged = lock(&s.shared.state)
        .replay
        .take()
        .map(|r| r.diverged)
        .unwrap_or_default();
    if let Some((seq, status)) = diverged.first() {
        let name = o
            .journal
            .entries
            .iter()
            .find(|e| e.seq == *seq)
            .map_or("a call of the replay's own", |e| e.call.name());
        return Err(Replay::Failed(format!(
            "{name} (#{seq}), which had succeeded, failed there with OpenCL error {}",
            crate::entry::error_text(*status)
        )));
    }
    o.idle = false;
    Ok(sent)
}

fn replay_entries(
    s: &Session,
    o: &mut Out,
    entries: &mut [super::journal::Entry],
    since: usize,
    pending: &HashSet<u64>,
) -> Result<(u64, u64), Replay> {
    let (mut calls, mut bytes) = (0u64, 0u64);
    // Per context, the queue of the replay's own that fills memory.
    let mut fillers: Vec<(crane_wire::Id, crane_wire::Id)> = Vec::new();
    // Events of the commands replayed, waited for before the application
    // goes on, so that none looks less complete than it was (a kernel whose
    // event had completed must not be running again when the application
    // asks for its profiling times): all but those held up by a user event
    // the application has not set, and what follows them in their queue.
    let mut done: Vec<crane_wire::Id> = Vec::new();
    let mut held: HashSet<crane_wire::Id> = entries
        .iter()
        .filter_map(|e| match e.call {
            Call::CreateUserEvent { id, .. } => Some(id),
            _ => None,
        })
        .collect();
    for e in entries.iter() {
        if let Call::SetUserEventStatus { event, .. } = e.call {
            held.remove(&event);
        }
    }
    let mut held_queues: HashSet<crane_wire::Id> = HashSet::new();
    let mut queries: Vec<usize> = Vec::new();
    for (i, e) in entries.iter_mut().enumerate() {
        if i == since {
            finish_fillers(s, o, &mut fillers)?;
        }
        let waited = pending.contains(&e.seq);
        if waited && matches!(e.call, Call::GetInfo { .. }) {
            // A query someone waits for is asked once the replayed commands
            // are done, so that it does not see them less complete than
            // they were.
            queries.push(i);
            continue;
        }
        // A query or read that was answered is not sent again, except a read
        // that made an event (later calls may name it, and its profiling
        // times are the command's): it is read again, its data dropped.
        if e.call.replies()
            && !waited
            && !makes_objects(&e.call)
            && !super::journal::read_with_event(&e.call)
        {
            continue;
        }
        if let Some((queue, sync)) = super::journal::enqueue_sync(&e.call) {
            if held_queues.contains(&queue) || sync.waits.iter().any(|w| held.contains(w)) {
                held_queues.insert(queue);
                held.insert(sync.event);
            } else if sync.event != 0 {
                done.push(sync.event);
            }
        }
        resend(s, o, e, i < since)?;
        calls += 1;
        bytes += e.payload.len() as u64;
        if let Some(c) = &e.content {
            bytes += fill(s, o, &e.call, c, &mut fillers)?;
        }
    }
    finish_fillers(s, o, &mut fillers)?;
    // (Those the application has released since are gone there too.)
    let released: HashSet<crane_wire::Id> = entries
        .iter()
        .filter_map(|e| match e.call {
            Call::Release { id } => Some(id),
            _ => None,
        })
        .collect();
    done.retain(|ev| !released.contains(ev));
    if !done.is_empty() {
        let seq = internal_call(s, o, &Call::WaitForEvents { events: done }, &[], true)?;
        wait_answer(s, seq)?;
    }
    for i in queries {
        resend(s, o, &mut entries[i], false)?;
        calls += 1;
    }
    o.w.write_all(&o.batch)?;
    o.batch.clear();
    Ok((calls, bytes))
}

/// After a frame's header has been encoded into the batch: appends its
/// payload (copied), or sends batch and payload at once straight from
/// `payload` when it is large; sends the batch when `flush` or when it is
/// full.
fn put(o: &mut Out, payload: &[u8], flush: bool) -> std::io::Result<()> {
    if payload.len() > COPY_LIMIT {
        let batch = std::mem::take(&mut o.batch);
        o.idle = false;
        let r = write_two(&mut o.w, &batch, payload);
        o.batch = batch;
        o.batch.clear();
        return r;
    }
    o.batch.extend_from_slice(payload);
    if flush || o.batch.len() >= BATCH_LIMIT {
        o.idle = false;
        let r = o.w.write_all(&o.batch);
        o.batch.clear();
        return r;
    }
    Ok(())
}

/// Appends a frame to the batch, or sends batch and frame when the payload is
/// large.
fn send_frame(o: &mut Out, seq: u64, call: &Call, payload: &[u8]) -> Result<(), Replay> {
    crane_wire::encode(&mut o.batch, seq, call, payload.len() as u64)
        .map_err(|e| Replay::Failed(format!("cannot encode {}: {e}", call.name())))?;
    Ok(put(o, payload, false)?)
}

/// Sends a journaled call again under a new seq: a thread waiting for its
/// answer follows it there (`renumbered`), a call that answers but that
/// nobody waits for gets a slot nobody waits on, and what the replay's
/// checks need to know of it (part of the checkpoint's state, failed
/// before) goes with the new number.
fn resend(
    s: &Session,
    o: &mut Out,
    e: &mut super::journal::Entry,
    in_state: bool,
) -> Result<(), Replay> {
    o.seq += 1;
    let seq = o.seq;
    {
        let mut st = lock(&s.shared.state);
        if let Some(slot) = st.slots.remove(&e.seq) {
            if slot.waiter.is_some() {
                st.renumbered.insert(e.seq, seq);
            }
            st.slots.insert(seq, slot);
        } else if e.call.replies() {
            st.slots.insert(seq, Slot::ignored());
        }
        let before = st.reported.contains(&e.seq);
        if before {
            st.reported.insert(seq);
        }
        if let Some(rc) = st.replay.as_mut() {
            if in_state {
                rc.state.insert(seq);
            }
            if before {
                rc.before.insert(seq);
            }
        }
    }
    e.seq = seq;
    send_frame(o, seq, &e.call, &e.payload)
}

/// A call of the replay's own, with a fresh seq; `answered`: the replay
/// waits for its answer.
fn internal_call(
    s: &Session,
    o: &mut Out,
    call: &Call,
    payload: &[u8],
    answered: bool,
) -> Result<u64, Replay> {
    o.seq += 1;
    let seq = o.seq;
    {
        let mut st = lock(&s.shared.state);
        if let Some(rc) = st.replay.as_mut() {
            rc.internal.insert(seq);
        }
        if answered {
            st.slots.insert(
                seq,
                Slot {
                    waiter: Some(std::thread::current()),
                    ..Slot::ignored()
                },
            );
        }
    }
    send_frame(o, seq, call, payload)?;
    if answered {
        o.w.write_all(&o.batch)?;
        o.batch.clear();
    }
    Ok(seq)
}

/// Waits for the answer to a call of the replay's own.
fn wait_answer(s: &Session, seq: u64) -> Result<Answer, Replay> {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        {
            let mut st = lock(&s.shared.state);
            if let Some(slot) = st.slots.get_mut(&seq)
                && let Some((a, _)) = slot.answer.take()
            {
                st.slots.remove(&seq);
                return Ok(a);
            }
            if let Some(why) = &st.dead {
                return Err(Replay::Failed(why.clone()));
            }
        }
        if lock(&s.shared.recov).broke {
            lock(&s.shared.state).slots.remove(&seq);
            return Err(Replay::Broken("the new connection broke too".into()));
        }
        if Instant::now() >= end {
            return Err(Replay::Failed(
                "crane-proxy did not answer within 120 s".into(),
            ));
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// Fills a memory object just made at a replay with what it held at the
/// last checkpoint, on a queue of the replay's own. Returns the bytes sent.
fn fill(
    s: &Session,
    o: &mut Out,
    made: &Call,
    c: &Content,
    fillers: &mut Vec<(crane_wire::Id, crane_wire::Id)>,
) -> Result<u64, Replay> {
    let Some(m) = c.mem.upgrade() else {
        // Released by the application since, on the proxy too.
        return Ok(0);
    };
    let id = match made {
        Call::CreateBuffer { id, .. } | Call::CreateImage { id, .. } => *id,
        _ => return Ok(0),
    };
    let shadow = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
    let data: &[u8] = match (&c.copy, shadow.data()) {
        (Some(copy), _) => copy,
        (None, Some(d)) => d,
        (None, None) => return Ok(0),
    };
    let queue = match fillers.iter().find(|f| f.0 == c.context) {
        Some(f) => f.1,
        None => {
            let q = s.new_id();
            internal_call(
                s,
                o,
                &Call::CreateQueue {
                    id: q,
                    context: c.context,
                    device: c.device,
                    props: Vec::new(),
                },
                &[],
                false,
            )?;
            fillers.push((c.context, q));
            q
        }
    };
    let max = (s.limits.max_payload as usize).max(1);
    // Memory the host may not write is filled through a buffer of the
    // replay's own and a copy on the device (as `api::fill_large` does).
    let staged = m.flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) != 0;
    let target = if staged {
        let t = s.new_id();
        internal_call(
            s,
            o,
            &Call::CreateBuffer {
                id: t,
                context: c.context,
                flags: CL_MEM_READ_WRITE,
                size: data.len() as u64,
                props: Vec::new(),
                init: false,
            },
            &[],
            false,
        )?;
        t
    } else {
        id
    };
    let write_pieces = |o: &mut Out| -> Result<(), Replay> {
        for (k, piece) in data.chunks(max).enumerate() {
            internal_call(
                s,
                o,
                &Call::EnqueueWriteBuffer {
                    queue,
                    buffer: target,
                    offset: (k * max) as u64,
                    size: piece.len() as u64,
                    sync: Default::default(),
                },
                piece,
                false,
            )?;
        }
        Ok(())
    };
    if staged {
        write_pieces(o)?;
        let copy = match &m.kind {
            crate::objects::MemKind::Image { desc, .. } => Call::EnqueueCopyBufferToImage {
                queue,
                src: target,
                dst: id,
                src_offset: 0,
                dst_origin: [0; 3],
                region: crate::api::memory::image_region(desc).map(|v| v as u64),
                sync: Default::default(),
            },
            _ => Call::EnqueueCopyBuffer {
                queue,
                src: target,
                dst: id,
                src_offset: 0,
                dst_offset: 0,
                size: data.len() as u64,
                sync: Default::default(),
            },
        };
        internal_call(s, o, &copy, &[], false)?;
        internal_call(s, o, &Call::Release { id: target }, &[], false)?;
        return Ok(data.len() as u64);
    }
    if let crate::objects::MemKind::Image { desc, .. } = &m.kind {
        if data.len() > max {
            return Err(Replay::Failed(format!(
                "an image of {} bytes is larger than one frame",
                data.len()
            )));
        }
        let region = crate::api::memory::image_region(desc).map(|v| v as u64);
        internal_call(
            s,
            o,
            &Call::EnqueueWriteImage {
                queue,
                image: id,
                origin: [0; 3],
                region,
                sync: Default::default(),
            },
            data,
            false,
        )?;
        return Ok(data.len() as u64);
    }
    write_pieces(o)?;
    Ok(data.len() as u64)
}

/// Waits until every fill has landed (later calls on the application's own
/// queues may read that memory) and releases the replay's queues.
fn finish_fillers(
    s: &Session,
    o: &mut Out,
    fillers: &mut Vec<(crane_wire::Id, crane_wire::Id)>,
) -> Result<(), Replay> {
    let mut waits = Vec::new();
    for &(_, q) in fillers.iter() {
        waits.push(internal_call(s, o, &Call::Finish { queue: q }, &[], true)?);
    }
    for seq in waits {
        match wait_answer(s, seq)? {
            Answer::Status(CL_SUCCESS) => {}
            a => {
                return Err(Replay::Failed(format!(
                    "filling memory on the new proxy failed: {a:?}"
                )));
            }
        }
    }
    for (_, q) in fillers.drain(..) {
        internal_call(s, o, &Call::Release { id: q }, &[], false)?;
    }
    Ok(())
}

impl Slot {
    /// A slot for an answer nobody waits for (a replayed call that makes
    /// objects).
    fn ignored() -> Slot {
        Slot {
            dest: Dest::Keep,
            waiter: None,
            answer: None,
            arrived: None,
            landing: Vec::new(),
            ticket: None,
        }
    }
}
