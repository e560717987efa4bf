//! Kernel `printf` output: what the vendor library writes to the proxy's
//! standard output on behalf of a session's kernels goes back to that
//! session's application (`Answer::Output`), and never to another tenant.
//!
//! At start ([`capture_stdout`]) the proxy keeps a duplicate of its real
//! standard output and points fd 1 at a pipe that the capture thread reads.
//! Everything the vendor writes there (a kernel's printf, anything else it
//! prints) lands in the capture buffer. The buffer is cut into *epochs* by
//! *boundaries*: a boundary flushes libc's stdio buffers (`fflush(NULL)`),
//! writes a unique marker to fd 1 and waits (bounded) until the capture
//! thread has read up to it; the bytes before the marker are the epoch's.
//!
//! An epoch belongs to a session only when that session was the only
//! *printer* all along: a session becomes one when it creates a program
//! whose source mentions `printf`, or one from IL or binaries (which the
//! proxy cannot see into), and stays one until it has been torn down. The
//! set of printers only changes right after a boundary, under the lock that
//! serialises boundaries, so an epoch has one set of printers: with exactly
//! one, its bytes go to that session's pending output; otherwise (none, or
//! several printing at once) to the proxy's log, never to a session.
//!
//! A printer collects when it answers a call that waits for the device
//! (`Finish`, `WaitForEvents`, a read) and launched kernels that no
//! collection has covered yet: a boundary, then its pending output goes out
//! as `Answer::Output` frames (seq 0) before the answer. Sessions that never
//! become printers pay one match per call and one atomic load per answer.
//!
//! Memory is bounded: an epoch keeps at most [`MAX_KEPT`] bytes, and so does
//! a session's pending output; the excess is dropped and logged.

use std::collections::HashMap;
use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crane_wire::{Call, Id, MINOR_OUTPUT};
use log::Level;

use crate::ratelimit::limited;

/// Bytes kept per epoch and per session between two collections (a
/// printf buffer's worth); the rest are dropped and logged.
pub const MAX_KEPT: usize = 1 << 20;
/// How long a boundary waits for the capture thread to read its marker.
const MARK_WAIT: Duration = Duration::from_secs(2);
/// A marker: a random prefix of 32 bytes, then the boundary's number in 16
/// hex digits.
const PREFIX_LEN: usize = 32;
const MARK_LEN: usize = PREFIX_LEN + 16;
/// At most this much of an unattributed epoch is copied into one log line.
const LOG_SHOWN: usize = 4096;

static CAPTURE: OnceLock<Capture> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Capture {
    prefix: [u8; PREFIX_LEN],
    /// The sessions that may print. Held for a whole boundary: boundaries
    /// are serial and the set changes only between them.
    printers: Mutex<Vec<Arc<Tenant>>>,
    /// `printers.len()`, for the capture thread (which must never wait for
    /// `printers`: a boundary holds it while waiting for that thread).
    n_printers: AtomicUsize,
    next_mark: AtomicU64,
    state: Mutex<CapState>,
    seen: Condvar,
    /// The real standard output, kept open for the proxy's own messages.
    real_stdout: OwnedFd,
}

#[derive(Default)]
struct CapState {
    /// The current epoch's bytes (at most MAX_KEPT, then the last
    /// MARK_LEN - 1 bytes read, where a marker may begin).
    buf: Vec<u8>,
    /// Bytes of the current epoch dropped over MAX_KEPT.
    dropped: u64,
    /// Where the marker search resumes in `buf`.
    scan: usize,
    /// The last marker read.
    seen: u64,
    /// Boundaries whose markers are on their way, and whose their bytes are.
    epochs: VecDeque<(u64, Target)>,
    /// The pipe has closed (nothing more will be read).
    closed: bool,
}

#[derive(Clone)]
enum Target {
    Tenant(Arc<Tenant>),
    Log,
}

/// The real standard output that [`capture_stdout`] kept, if capturing.
pub fn real_stdout() -> Option<RawFd> {
    CAPTURE.get().map(|c| c.real_stdout.as_raw_fd())
}

/// Points fd 1 at a pipe read by the capture thread, keeping a duplicate
/// of the real standard output ([`real_stdout`]). Called once, after the
/// proxy printed what its caller reads from its standard output.
pub fn capture_stdout() -> io::Result<()> {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: plain descriptor system calls on fds this process owns.
    let real = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
    if real < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `real` is a new descriptor owned by nothing else.
    let real_stdout = unsafe { OwnedFd::from_raw_fd(real) };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are new descriptors owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // A larger pipe lets a burst of output wait for the capture thread
    // without blocking the vendor (best effort).
    // SAFETY: as above.
    unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, MAX_KEPT as libc::c_int) };
    let mut prefix = [0u8; PREFIX_LEN];
    let hex = b"0123456789abcdef";
    for (i, chunk) in prefix.chunks_mut(16).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        let v = h.finish();
        for (j, b) in chunk.iter_mut().enumerate() {
            *b = hex[((v >> (4 * j)) & 15) as usize];
        }
    }
    prefix[..4].copy_from_slice(b"\x1e\x1fCM");
    let cap = Capture {
        prefix,
        printers: Mutex::new(Vec::new()),
        n_printers: AtomicUsize::new(0),
        next_mark: AtomicU64::new(0),
        state: Mutex::new(CapState::default()),
        seen: Condvar::new(),
        real_stdout,
    };
    if CAPTURE.set(cap).is_err() {
        return Err(io::Error::other("standard output is captured already"));
    }
    std::thread::Builder::new()
        .name("crane-stdout".into())
        .spawn(move || read_pipe(r))?;
    // SAFETY: `w` is open; fd 1 is replaced atomically.
    if unsafe { libc::dup2(w.as_raw_fd(), 1) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The capture thread: reads the pipe until it closes.
fn read_pipe(r: OwnedFd) {
    let Some(cap) = CAPTURE.get() else { return };
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        // SAFETY: `chunk` is writable for its length.
        let n = unsafe { libc::read(r.as_raw_fd(), chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        cap.push(&chunk[..n as usize]);
    }
    lock(&cap.state).closed = true;
    cap.seen.notify_all();
}

impl Capture {
    /// Takes in bytes read from the pipe.
    fn push(&self, data: &[u8]) {
        let mut st = lock(&self.state);
        if st.epochs.is_empty() && st.buf.is_empty() && self.n_printers.load(Ordering::Acquire) == 0
        {
            // No session may print and no boundary is under way: nobody's.
            drop(st);
            log_unattributed(data, 0);
            return;
        }
        st.buf.extend_from_slice(data);
        let mut logs = Vec::new();
        loop {
            let from = st.scan;
            let Some(i) = find(&st.buf[from..], &self.prefix) else {
                st.scan = st.buf.len().saturating_sub(PREFIX_LEN - 1).max(from);
                break;
            };
            let at = from + i;
            if st.buf.len() < at + MARK_LEN {
                st.scan = at;
                break;
            }
            let id = std::str::from_utf8(&st.buf[at + PREFIX_LEN..at + MARK_LEN])
                .ok()
                .and_then(|s| u64::from_str_radix(s, 16).ok());
            let Some(id) = id else {
                // Not one of ours after all.
                st.scan = at + 1;
                continue;
            };
            let rest = st.buf.split_off(at + MARK_LEN);
            let mut bytes = std::mem::replace(&mut st.buf, rest);
            bytes.truncate(at);
            let dropped = std::mem::take(&mut st.dropped);
            st.scan = 0;
            let mut target = Target::Log;
            while let Some((e, _)) = st.epochs.front() {
                if *e > id {
                    break;
                }
                let (e, t) = st.epochs.pop_front().expect("not empty");
                if e == id {
                    target = t;
                }
            }
            st.seen = st.seen.max(id);
            match target {
                // Delivered before `seen` is published (the state lock is
                // held), so the collector finds its bytes.
                Target::Tenant(t) => t.add(&bytes, dropped),
                Target::Log => logs.push((bytes, dropped)),
            }
        }
        // Bounded: keep MAX_KEPT bytes and the tail where a marker may begin.
        let len = st.buf.len();
        if len > MAX_KEPT + MARK_LEN {
            let cut = len - (MARK_LEN - 1);
            st.buf.drain(MAX_KEPT..cut);
            st.dropped += (cut - MAX_KEPT) as u64;
            st.scan = st.scan.min(MAX_KEPT);
        }
        drop(st);
        self.seen.notify_all();
        for (bytes, dropped) in logs {
            log_unattributed(&bytes, dropped);
        }
    }

    /// Ends the current epoch; `printers` is the locked set. False when the
    /// marker could not be written or was not read in time (its epoch's
    /// bytes then go where the marker's epoch says once it is read).
    fn boundary(&self, printers: &[Arc<Tenant>]) -> bool {
        let target = match printers {
            [one] => Target::Tenant(one.clone()),
            _ => Target::Log,
        };
        // SAFETY: fflush(NULL) flushes every output stream.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let id = self.next_mark.fetch_add(1, Ordering::AcqRel) + 1;
        let mut mark = Vec::with_capacity(MARK_LEN);
        mark.extend_from_slice(&self.prefix);
        mark.extend_from_slice(format!("{id:016x}").as_bytes());
        lock(&self.state).epochs.push_back((id, target));
        if let Err(e) = write_all(1, &mark) {
            lock(&self.state).epochs.retain(|(e, _)| *e != id);
            limited!(
                Level::Error,
                "kernel output: cannot write to the captured standard output: {e}"
            );
            return false;
        }
        let deadline = Instant::now() + MARK_WAIT;
        let mut st = lock(&self.state);
        while st.seen < id {
            let left = deadline.saturating_duration_since(Instant::now());
            if st.closed || left.is_zero() {
                limited!(
                    Level::Warn,
                    "kernel output: the capture thread did not read a marker within {MARK_WAIT:?}"
                );
                return false;
            }
            st = self
                .seen
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn write_all(fd: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is readable for its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn log_unattributed(bytes: &[u8], dropped: u64) {
    if bytes.is_empty() && dropped == 0 {
        return;
    }
    let shown = &bytes[..bytes.len().min(LOG_SHOWN)];
    limited!(
        Level::Info,
        "kernel output that is no single session's ({} bytes{}): {:?}",
        bytes.len() as u64 + dropped,
        if shown.len() < bytes.len() || dropped > 0 {
            ", shown in part"
        } else {
            ""
        },
        String::from_utf8_lossy(shown)
    );
}

/// A session that may print.
pub(crate) struct Tenant {
    session: u64,
    /// Whether its client understands `Answer::Output`.
    deliver: bool,
    /// The largest payload of one frame to it.
    max_frame: usize,
    pending: Mutex<(Vec<u8>, u64)>,
    track: Mutex<Track>,
}

#[derive(Default)]
struct Track {
    /// Queues with kernels launched since a collection covered them: the
    /// seq of the latest launch.
    launches: HashMap<Id, u64>,
    /// Calls that wait for the device, not answered yet: their seq, and the
    /// queue a Finish drains.
    waits: HashMap<u64, Option<Id>>,
}

impl Tenant {
    fn add(&self, bytes: &[u8], dropped: u64) {
        let mut p = lock(&self.pending);
        let room = MAX_KEPT.saturating_sub(p.0.len());
        let kept = bytes.len().min(room);
        p.0.extend_from_slice(&bytes[..kept]);
        p.1 += dropped + (bytes.len() - kept) as u64;
    }

    fn take(&self) -> Vec<u8> {
        let (bytes, dropped) = std::mem::take(&mut *lock(&self.pending));
        if dropped > 0 {
            limited!(
                Level::Warn,
                "session {}: {dropped} bytes of kernel output dropped (more than {MAX_KEPT} between two waits)",
                self.session
            );
        }
        bytes
    }
}

/// A session's end of the capture, held by its writer.
#[derive(Default)]
pub(crate) struct Tap {
    /// The client's protocol minor and the session's largest payload.
    config: OnceLock<(u16, u64)>,
    tenant: OnceLock<Arc<Tenant>>,
}

impl Tap {
    /// Records what the client understands; called once, before its calls.
    pub fn configure(&self, client_minor: u16, max_payload: u64) {
        let _ = self.config.set((client_minor, max_payload));
    }

    /// Called on the session thread before each call runs.
    pub fn note_call(&self, session: u64, seq: u64, call: &Call) {
        match call {
            Call::CreateProgramWithSource { source, .. }
            | Call::SetProgramSource { source, .. }
                if source.contains("printf") =>
            {
                self.become_printer(session)
            }
            Call::CreateProgramWithIl { .. } | Call::CreateProgramWithBinary { .. } => {
                self.become_printer(session)
            }
            Call::EnqueueNdRange { queue, .. } => {
                if let Some(t) = self.tenant.get() {
                    lock(&t.track).launches.insert(*queue, seq);
                }
            }
            Call::Finish { queue } => self.waits(seq, Some(*queue)),
            Call::WaitForEvents { .. }
            | Call::EnqueueReadBuffer { .. }
            | Call::EnqueueReadBufferRect { .. }
            | Call::EnqueueReadImage { .. } => self.waits(seq, None),
            _ => {}
        }
    }

    fn waits(&self, seq: u64, queue: Option<Id>) {
        if let Some(t) = self.tenant.get() {
            lock(&t.track).waits.insert(seq, queue);
        }
    }

    fn become_printer(&self, session: u64) {
        let Some(cap) = CAPTURE.get() else { return };
        if self.tenant.get().is_some() {
            return;
        }
        let (minor, max_payload) = self.config.get().copied().unwrap_or((0, 0));
        let t = Arc::new(Tenant {
            session,
            deliver: minor >= MINOR_OUTPUT,
            max_frame: usize::try_from(max_payload)
                .unwrap_or(usize::MAX)
                .clamp(1, MAX_KEPT),
            pending: Mutex::default(),
            track: Mutex::default(),
        });
        let mut printers = lock(&cap.printers);
        // What was printed so far belongs to the printers before this one.
        cap.boundary(&printers);
        printers.push(t.clone());
        cap.n_printers.store(printers.len(), Ordering::Release);
        drop(printers);
        let _ = self.tenant.set(t);
        limited!(
            Level::Debug,
            "session {session} may print: its kernels' output is collected"
        );
    }

    /// Called before an answer with `seq` (not 0) goes out: the frames of
    /// kernel output that must precede it, if it answers a wait. `None`
    /// costs one atomic load for a session that never printed.
    pub fn before_answer(&self, seq: u64) -> Option<Vec<Vec<u8>>> {
        let t = self.tenant.get()?;
        let cap = CAPTURE.get()?;
        let (collect, queue) = {
            let mut tr = lock(&t.track);
            let queue = tr.waits.remove(&seq)?;
            (!tr.launches.is_empty(), queue)
        };
        if collect {
            let printers = lock(&cap.printers);
            cap.boundary(&printers);
            drop(printers);
            if let Some(q) = queue {
                // The Finish covered the kernels launched on `q` before it.
                let mut tr = lock(&t.track);
                if tr.launches.get(&q).is_some_and(|&l| l < seq) {
                    tr.launches.remove(&q);
                }
            }
        }
        let bytes = t.take();
        if bytes.is_empty() {
            return None;
        }
        if !t.deliver {
            limited!(
                Level::Info,
                "session {}: its client is too old for kernel output; logged instead",
                t.session
            );
            log_unattributed(&bytes, 0);
            return None;
        }
        Some(bytes.chunks(t.max_frame).map(<[u8]>::to_vec).collect())
    }

    /// The session has been torn down: it is no longer a printer; what it
    /// printed and never collected is logged.
    pub fn session_ended(&self) {
        let (Some(t), Some(cap)) = (self.tenant.get(), CAPTURE.get()) else {
            return;
        };
        let mut printers = lock(&cap.printers);
        cap.boundary(&printers);
        printers.retain(|p| !Arc::ptr_eq(p, t));
        cap.n_printers.store(printers.len(), Ordering::Release);
        drop(printers);
        let left = t.take();
        if !left.is_empty() {
            log_unattributed(&left, 0);
        }
    }
}
