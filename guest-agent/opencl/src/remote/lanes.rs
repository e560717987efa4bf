//! Lanes (wire 1.6): a move's bulk data over several connections side by
//! side. One TCP connection on loopback carries about 3 GB/s
//! (docs/benchmarks.md, `tcp-intake`), so 256 MiB cannot cross one in much
//! under 90 ms; connections side by side add up. At a move's rebuild the
//! session asks crane-proxy for lanes ([`Call::OpenLanes`]), connects each
//! ([`Call::JoinLane`], proven by the secret the session got over its own
//! connection), and re-injection then sends each buffer's RAM copy in
//! pieces spread over the lanes ([`Call::LanePiece`]) while the session's
//! own connection carries, in order, the writes that take them
//! ([`Call::EnqueueWriteLane`]). crane-proxy reads each piece straight into
//! pinned staging it reuses and writes it to the device as soon as the
//! session reaches its write; a lane holds at most [`LANE_HELD`] pieces not
//! yet written, so what the proxy holds stays bounded.
//!
//! A lane that fails fails the rebuild (the move is refused and the
//! process goes on where it was); a proxy that offers no lanes (older than
//! 1.6, or configured without) gets everything over the session's own
//! connection, as before.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crane_wire::{Answer, Call, LANE_SECRET_LEN, MINOR_LANES};
use opencl_sys::*;

use super::Session;
use super::session::{Dest, Stream, write_two};
use crate::config::debug;

/// Why the last rebuild's lanes failed, for its report.
static FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Keeps why a lane failed (the first reason of a rebuild wins).
pub fn note_failure(why: String) {
    FAILURE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(why);
}

/// Why a lane failed since the last call, if one did.
pub fn take_failure() -> Option<String> {
    FAILURE.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// How long a lane may take to connect and join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Pieces queued per lane before [`Lanes::send`] waits.
const QUEUED: usize = 4;

/// A piece to send: `len` bytes at `ptr`, for the write `key`.
struct Piece {
    key: u64,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the memory belongs to a RAM copy that [`Lanes::send`]'s caller
// keeps unchanged until [`Lanes::finish`] has joined the lane threads; a
// lane thread only reads it.
unsafe impl Send for Piece {}

/// The lanes of one rebuild.
pub struct Lanes {
    queues: Vec<SyncSender<Piece>>,
    threads: Vec<JoinHandle<Result<u64, String>>>,
    next: usize,
}

/// Why a lane could not be used.
fn lane_error(what: &str, e: impl std::fmt::Display) -> String {
    format!("a lane to crane-proxy: {what}: {e}")
}

impl Lanes {
    /// Asks the session's proxy for up to `want` lanes and connects those
    /// it grants; None when it grants none (or speaks no lanes). Lanes that
    /// cannot join are left out.
    pub fn open(s: &Session, want: u32) -> Option<Lanes> {
        if want == 0 || s.proxy_minor < MINOR_LANES {
            return None;
        }
        let (count, secret) = match s.call(&Call::OpenLanes { count: want }, &[], Dest::Keep) {
            Ok((
                Answer::Lanes {
                    status: CL_SUCCESS,
                    count,
                    secret,
                },
                _,
            )) => (count, secret),
            Ok((a, _)) => {
                debug!("crane-proxy grants no lanes: {a:?}");
                return None;
            }
            Err(e) => {
                debug!("asking crane-proxy for lanes failed: {e}");
                return None;
            }
        };
        let addr = s.addr();
        let session = s.proxy_session();
        let mut lanes = Lanes {
            queues: Vec::new(),
            threads: Vec::new(),
            next: 0,
        };
        for lane in 0..count {
            match join(&addr, session, lane, &secret) {
                Ok(stream) => {
                    if let Err(e) = lanes.start(lane, stream) {
                        debug!("{e}");
                    }
                }
                Err(e) => debug!("{e}"),
            }
        }
        if lanes.queues.is_empty() {
            return None;
        }
        debug!("{} lane(s) to crane-proxy at {addr}", lanes.queues.len());
        Some(lanes)
    }

    fn start(&mut self, lane: u32, mut stream: Stream) -> Result<(), String> {
        let (tx, rx) = sync_channel::<Piece>(QUEUED);
        let t = std::thread::Builder::new()
            .name(format!("crane-lane-{lane}"))
            .spawn(move || carry(&mut stream, rx))
            .map_err(|e| lane_error("cannot start its thread", e))?;
        self.queues.push(tx);
        self.threads.push(t);
        Ok(())
    }

    /// How many lanes carry pieces.
    pub fn count(&self) -> usize {
        self.queues.len()
    }

    /// Queues `data` as the piece `key` on the next lane (waiting while
    /// that lane has [`QUEUED`] pieces queued).
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until [`Lanes::finish`]
    /// returns.
    pub unsafe fn send(&mut self, key: u64, data: &[u8]) -> Result<(), String> {
        let lane = self.next % self.queues.len();
        self.next += 1;
        self.queues[lane]
            .send(Piece {
                key,
                ptr: data.as_ptr(),
                len: data.len(),
            })
            .map_err(|_| format!("lane {lane} to crane-proxy failed"))
    }

    /// Waits until every piece is sent and closes the lanes: the bytes
    /// sent, or why a lane failed.
    pub fn finish(self) -> Result<u64, String> {
        drop(self.queues);
        let mut sent = 0;
        let mut failed = None;
        for t in self.threads {
            match t.join() {
                Ok(Ok(n)) => sent += n,
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(_) => failed = failed.or(Some("a lane's thread panicked".to_string())),
            }
        }
        failed.map_or(Ok(sent), Err)
    }
}

/// How long a lane waits, once it has sent everything, for the proxy to
/// take the rest and close it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// A lane's thread: sends its pieces in order until the queue closes, then
/// ends its side and waits for the proxy's end: a lane the proxy ended
/// (`Goodbye`: a piece cut short, a limit) fails, with the proxy's reason.
/// After a failure it drops what is still queued (the rebuild fails).
fn carry(stream: &mut Stream, rx: Receiver<Piece>) -> Result<u64, String> {
    let sent = send_pieces(stream, rx)?;
    stream.shutdown_write();
    stream
        .set_read_timeout(Some(CLOSE_TIMEOUT))
        .map_err(|e| lane_error("closing", e))?;
    let mut body = Vec::new();
    loop {
        match crane_wire::read_frame(stream, 0, &mut body) {
            Ok(None) => return Ok(sent),
            Ok(Some(_)) => {
                if let Ok(Answer::Goodbye { reason }) = crane_wire::decode::<Answer>(&body) {
                    return Err(lane_error("the proxy ended it", reason));
                }
            }
            Err(e) => return Err(lane_error("closing", e)),
        }
    }
}

fn send_pieces(w: &mut Stream, rx: Receiver<Piece>) -> Result<u64, String> {
    let mut header = Vec::with_capacity(64);
    let mut sent = 0u64;
    for (seq, p) in (2u64..).zip(rx.iter()) {
        // SAFETY: see `Piece`: the caller of `send` keeps the memory.
        let data = unsafe { std::slice::from_raw_parts(p.ptr, p.len) };
        header.clear();
        crane_wire::encode(
            &mut header,
            seq,
            &Call::LanePiece { key: p.key },
            p.len as u64,
        )
        .map_err(|e| lane_error("cannot encode a piece", e))?;
        write_two(w, &header, data).map_err(|e| lane_error("sending failed", e))?;
        sent += p.len as u64;
    }
    Ok(sent)
}

/// Connects lane `lane` of the proxy's session `session` at `addr`.
fn join(
    addr: &str,
    session: u64,
    lane: u32,
    secret: &[u8; LANE_SECRET_LEN],
) -> Result<Stream, String> {
    let mut w = Stream::connect(addr, JOIN_TIMEOUT).map_err(|e| lane_error("connect", e))?;
    let mut buf = Vec::new();
    let call = Call::JoinLane {
        session,
        lane,
        secret: *secret,
    };
    crane_wire::encode(&mut buf, 1, &call, 0).map_err(|e| lane_error("encode", e))?;
    write_two(&mut w, &buf, &[]).map_err(|e| lane_error("join", e))?;
    w.set_read_timeout(Some(JOIN_TIMEOUT))
        .map_err(|e| lane_error("join", e))?;
    let mut body = Vec::new();
    let answer = crane_wire::read_frame(&mut w, 0, &mut body)
        .map_err(|e| lane_error("join", e))?
        .ok_or_else(|| lane_error("join", "the proxy closed the connection"))
        .and_then(|_| crane_wire::decode::<Answer>(&body).map_err(|e| lane_error("join", e)))?;
    match answer {
        Answer::Status(CL_SUCCESS) => {}
        Answer::Goodbye { reason } => return Err(lane_error("refused", reason)),
        a => return Err(lane_error("join", format!("answered {a:?}"))),
    }
    w.set_read_timeout(None)
        .map_err(|e| lane_error("join", e))?;
    Ok(w)
}
