//! One client connection: the socket (TCP or unix), its options, the reading
//! side (bounded frames) and the writing side (one lock per connection, so
//! the frames of the session thread, the completion thread and vendor
//! callbacks never interleave).

use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crane_wire::{Answer, HEADER_LEN, Header};
use log::Level;

use crate::pool::BufferPool;
use crate::ratelimit::limited;

/// Idle seconds before TCP keepalive probes start, seconds between probes,
/// and probes lost before the peer is declared dead: a dead guest is noticed
/// within about 40 s. Clients are remote because their guests migrate, and a
/// migrating guest goes dark for a while (paused for its last pages, its
/// network front end reconnecting on the destination: 18 s were seen under
/// software emulation); its session must outlive that.
const KEEPALIVE: (libc::c_int, libc::c_int, libc::c_int) = (10, 5, 6);
/// Longest time sent data may stay unacknowledged before the connection is
/// dropped (TCP_USER_TIMEOUT), for the same reason.
const USER_TIMEOUT_MS: libc::c_int = 60_000;
/// Longest time one write may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Payloads up to this size are copied into the frame buffer and go out in
/// one write with their header.
const INLINE_PAYLOAD: usize = 64 << 10;

/// A connected client socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Sets the options every connection gets: no Nagle delay and short
    /// keepalive timers on TCP; a write timeout everywhere.
    pub fn configure(&self) -> io::Result<()> {
        if let Stream::Tcp(s) = self {
            s.set_nodelay(true)?;
            let fd = s.as_raw_fd();
            setsockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
            setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE.0)?;
            setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE.1)?;
            setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE.2)?;
            setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                USER_TIMEOUT_MS,
            )?;
        }
        self.set_write_timeout(Some(WRITE_TIMEOUT))
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub fn shutdown(&self, how: Shutdown) {
        // Errors mean the socket is already gone, which is the goal.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    /// The peer, for logs.
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp:?".into(), |a| format!("tcp:{a}")),
            Stream::Unix(_) => "unix".into(),
        }
    }
}

fn setsockopt(
    fd: libc::c_int,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `fd` is an open socket; the value is a c_int of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).read(buf),
            Stream::Unix(s) => (&*s).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(s) => (&*s).write(buf),
            Stream::Unix(s) => (&*s).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading side of a shared stream, with an optional deadline for the
/// whole of what is read (the Hello must arrive in time, however slowly its
/// bytes trickle in).
struct StreamReader {
    stream: Arc<Stream>,
    deadline: Option<Instant>,
}

/// How long the session thread watches its socket for the client's next bytes
/// before it sleeps in `read` (`CRANE_PROXY_IDLE_SPIN_US`, default 100, 0:
/// never). A remoted frame loop sends its next batch a few microseconds after
/// it got its answer; a sleeping session thread costs each batch a wake-up.
static IDLE_SPIN: std::sync::LazyLock<Duration> = std::sync::LazyLock::new(|| {
    Duration::from_micros(
        std::env::var("CRANE_PROXY_IDLE_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(100),
    )
});

impl Stream {
    /// One `recv` that does not block: `WouldBlock` when nothing is there.
    fn recv_now(&self, buf: &mut [u8]) -> io::Result<usize> {
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        // SAFETY: `buf` is writable for its length; the socket is ours.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl StreamReader {
    /// Watches the socket for up to `IDLE_SPIN`; `None` when nothing came.
    fn spin(&self, buf: &mut [u8]) -> Option<io::Result<usize>> {
        let until = Instant::now() + *IDLE_SPIN;
        loop {
            match self.stream.recv_now(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return Some(r),
            }
            if Instant::now() >= until {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
        }
        let watched = (self.deadline.is_none() && !IDLE_SPIN.is_zero())
            .then(|| self.spin(buf))
            .flatten();
        let r = watched.unwrap_or_else(|| (&*self.stream).read(buf));
        if crate::trace::on() {
            let g = &*crate::trace::GLOBAL;
            crate::trace::add(&g.reads, 1);
            crate::trace::add(&g.read_bytes, *r.as_ref().unwrap_or(&0) as u64);
        }
        r
    }
}

/// Why reading a frame stopped.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// The bytes are not a frame crane accepts; the client is told.
    #[error("{0}")]
    Frame(String),
    /// The connection ended in the middle of a frame.
    #[error("the connection ended in the middle of a frame")]
    Truncated,
    /// The client took too long (only while a deadline is set).
    #[error("the client sent nothing complete in time")]
    TimedOut,
    #[error("the connection failed: {0}")]
    Io(io::Error),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::UnexpectedEof => ReadError::Truncated,
            // ETIMEDOUT from the socket is TCP giving up on the peer (keepalive
            // or TCP_USER_TIMEOUT), not a deadline of ours.
            io::ErrorKind::TimedOut if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                ReadError::Io(e)
            }
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ReadError::TimedOut,
            _ => ReadError::Io(e),
        }
    }
}

/// Reads frames with bounds that the caller sets per phase of the session.
pub(crate) struct FrameReader {
    r: BufReader<StreamReader>,
    pub body: Vec<u8>,
}

impl FrameReader {
    pub fn new(stream: Arc<Stream>, deadline: Option<Instant>) -> FrameReader {
        FrameReader {
            r: BufReader::with_capacity(64 << 10, StreamReader { stream, deadline }),
            body: Vec::new(),
        }
    }

    /// Whether the next frame must come from the socket (nothing buffered).
    pub fn drained(&self) -> bool {
        self.r.buffer().is_empty()
    }

    /// Ends the deadline (after the Hello).
    pub fn clear_deadline(&mut self) -> io::Result<()> {
        let inner = self.r.get_mut();
        inner.deadline = None;
        inner.stream.set_read_timeout(None)
    }

    /// Reads a header and body into `self.body`; `Ok(None)` at a clean end
    /// of stream. Memory grows with what actually arrives, not with what a
    /// header announces.
    pub fn next(&mut self, max_body: u32, max_payload: u64) -> Result<Option<Header>, ReadError> {
        let mut h = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match self.r.read(&mut h[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(ReadError::Truncated),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let h = Header::parse(&h, max_payload).map_err(|e| ReadError::Frame(e.to_string()))?;
        if h.body_len > max_body {
            return Err(ReadError::Frame(format!(
                "a frame body of {} bytes exceeds the limit of {max_body} at this point of the session",
                h.body_len
            )));
        }
        self.body.clear();
        read_exactly(&mut self.r, h.body_len as u64, &mut self.body)?;
        Ok(Some(h))
    }

    /// Reads a frame's payload (the session is authenticated and the length
    /// within its limit) into a buffer of the session's pool.
    pub fn payload(&mut self, len: u64, pool: &BufferPool) -> Result<Vec<u8>, ReadError> {
        let mut v = pool
            .take(len as usize)
            .ok_or_else(|| ReadError::Frame("the proxy is out of memory".into()))?;
        self.r.read_exact(&mut v)?;
        Ok(v)
    }

    /// Reads a payload of `buf.len()` bytes into `buf`.
    pub fn payload_into(&mut self, buf: &mut [u8]) -> Result<(), ReadError> {
        self.r.read_exact(buf)?;
        Ok(())
    }
}

/// Appends exactly `len` bytes to `out`, growing it as data arrives.
fn read_exactly(r: &mut impl Read, len: u64, out: &mut Vec<u8>) -> Result<(), ReadError> {
    const FIRST: u64 = 8 << 20;
    out.try_reserve_exact(len.min(FIRST) as usize)
        .map_err(|_| ReadError::Frame("the proxy is out of memory".into()))?;
    let n = r.take(len).read_to_end(out)?;
    if (n as u64) < len {
        return Err(ReadError::Truncated);
    }
    Ok(())
}

/// Reads and discards what the peer still sends, briefly, so that closing
/// the socket does not reset the connection before the client has read our
/// Goodbye.
pub(crate) fn drain(stream: &Stream) {
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut buf = [0u8; 16 << 10];
    let mut total = 0usize;
    while total < (4 << 20) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match (&*stream).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

/// The writing side of a connection, shared by everything that answers the
/// client. After the first failed write it drops everything quietly: the
/// session may end long before late vendor callbacks stop arriving.
pub(crate) struct Writer {
    stream: Arc<Stream>,
    state: Mutex<WriterState>,
    /// The session's kernel output ([`crate::output`]).
    pub output: crate::output::Tap,
}

struct WriterState {
    buf: Vec<u8>,
    closed: bool,
}

impl Writer {
    pub fn new(stream: Arc<Stream>) -> Writer {
        Writer {
            stream,
            state: Mutex::new(WriterState {
                buf: Vec::with_capacity(4096),
                closed: false,
            }),
            output: crate::output::Tap::default(),
        }
    }

    /// Sends one frame; false when the connection is closed.
    pub fn send(&self, seq: u64, answer: &Answer, payload: &[u8]) -> bool {
        let t0 = crate::trace::on().then(Instant::now);
        if seq != 0
            && let Some(frames) = self.output.before_answer(seq)
        {
            // Kernel output goes out before the answer to the wait.
            for f in frames {
                self.send_frame(0, &Answer::Output, &f);
            }
        }
        let ok = self.send_frame(seq, answer, payload);
        if let Some(t0) = t0 {
            let g = &*crate::trace::GLOBAL;
            crate::trace::add(&g.sends, 1);
            crate::trace::add(&g.send_ns, crate::trace::ns(t0));
        }
        ok
    }

    fn send_frame(&self, seq: u64, answer: &Answer, payload: &[u8]) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return false;
        }
        st.buf.clear();
        if let Err(e) = crane_wire::encode(&mut st.buf, seq, answer, payload.len() as u64) {
            limited!(
                Level::Error,
                "an answer cannot be encoded ({e}); the connection is closed"
            );
            st.closed = true;
            return false;
        }
        let inline = payload.len() <= INLINE_PAYLOAD;
        if inline {
            st.buf.extend_from_slice(payload);
        }
        let mut w = &*self.stream;
        let ok = w.write_all(&st.buf).is_ok() && (inline || w.write_all(payload).is_ok());
        if !ok {
            // The peer is gone or does not read: end the session too (its
            // thread sees the end of the stream).
            st.closed = true;
            self.stream.shutdown(Shutdown::Both);
        }
        ok
    }

    /// Marks the connection closed: later sends are dropped.
    pub fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
    }
}
