//! Lanes (wire 1.6): extra connections that carry one session's bulk data
//! side by side with its own (docs/wire-protocol.md, "Lanes"). One TCP
//! connection on loopback carries about 3 GB/s; a move to crane-proxy sends
//! its buffers' contents over several.
//!
//! A session asks for lanes ([`crane_wire::Call::OpenLanes`]) and gets a
//! secret of 32 random bytes over its own, authenticated connection; a
//! lane's connection then starts with [`crane_wire::Call::JoinLane`]
//! naming the session, its lane number and the secret instead of a Hello.
//! A lane only delivers pieces ([`crane_wire::Call::LanePiece`]), each read
//! straight into pinned staging from a pool the proxy keeps warm for lanes
//! ([`lane_pool`]); the session's own calls
//! ([`crane_wire::Call::EnqueueWriteLane`]) say, in order, where each
//! piece goes, and the session waits for a piece that has not arrived yet.
//!
//! Bounds: a lane holds at most [`LANE_HELD`] pieces the session has not
//! written (it is not read meanwhile, so TCP holds the client back), each at
//! most [`LANE_PIECE_MAX`] bytes; a session has at most
//! `CRANE_PROXY_LANES` lanes (default 4, at most [`MAX_LANES`]). The
//! session writes pieces in the order its client sent them, and each lane
//! carries its pieces in that order, so the piece the session waits for is
//! always the next one of some lane, which that lane can read: the bound
//! cannot deadlock. A session waits for a piece until it comes, every lane
//! that joined has closed, or no lane has delivered anything for
//! [`STALL`]; the write then fails (`CL_INVALID_VALUE`), not the session.

use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crane_wire::{
    Answer, Call, LANE_HELD, LANE_PIECE, LANE_PIECE_MAX, LANE_SECRET_LEN, MAX_BODY, MAX_LANES,
};
use log::Level;
use opencl_sys::*;

use crate::conn::{FrameReader, ReadError, Stream, Writer};
use crate::pinned::{Budget, HostBuf, Pool};
use crate::ratelimit::limited;
use crate::server::Shared;

/// How long a session waits for a piece while no lane delivers anything.
pub(crate) const STALL: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lanes a session may have (`CRANE_PROXY_LANES`, default 4, at most
/// [`MAX_LANES`]; 0: none).
pub(crate) fn max_lanes() -> u32 {
    static N: std::sync::LazyLock<u32> = std::sync::LazyLock::new(|| {
        std::env::var("CRANE_PROXY_LANES")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(4)
            .min(MAX_LANES)
    });
    *N
}

/// The pinned staging lanes read pieces into: one pool for the whole
/// proxy, in the proxy's own context (`api::stash`; NVIDIA's pinned memory
/// is pinned for every context), bounded by `CRANE_PROXY_LANE_PINNED_MIB`
/// (default 128; 0: pieces go to ordinary memory). Made at start and kept
/// warm ([`warm_up`]): pinning fresh memory runs at about 1 GB/s, slower
/// than the lanes.
fn lane_pool(shared: &Shared) -> Option<Arc<Pool>> {
    static POOL: OnceLock<Option<Arc<Pool>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let mib = std::env::var("CRANE_PROXY_LANE_PINNED_MIB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(128);
        let budget = Budget::fixed(mib << 20)?;
        let (ctx, dev) = crate::api::stash_context(shared.vendor.first_device())?;
        Pool::new(ctx, dev, budget)
    })
    .clone()
}

/// Fills the lane pool with pinned chunks of the default piece size, up
/// to half its budget, so that the first move finds them made.
pub(crate) fn warm_up(shared: &Shared) {
    if max_lanes() == 0 {
        return;
    }
    let Some(pool) = lane_pool(shared) else {
        return;
    };
    let chunks: Vec<_> = (0..pool.budget_limit() / 2 / LANE_PIECE)
        .map_while(|_| pool.take(LANE_PIECE as usize))
        .collect();
    log::debug!("{} pinned chunk(s) ready for lanes", chunks.len());
}

/// A session's lanes, shared by the session and its lanes' threads.
pub(crate) struct Lanes {
    session: u64,
    secret: [u8; LANE_SECRET_LEN],
    state: Mutex<State>,
    cond: Condvar,
}

#[derive(Default)]
struct State {
    /// Lanes granted so far (lane numbers below it may join).
    granted: u32,
    /// Lanes connected now.
    open: HashMap<u32, Arc<Stream>>,
    /// Whether any lane ever joined.
    joined: bool,
    /// Pieces delivered and not yet written, with their lane.
    pieces: HashMap<u64, (u32, HostBuf)>,
    /// When a lane last joined or delivered a piece.
    progress: Option<Instant>,
    /// The session has ended.
    ended: bool,
}

impl State {
    /// The pieces lane `lane` delivered that the session has not written.
    fn held(&self, lane: u32) -> usize {
        self.pieces.values().filter(|(l, _)| *l == lane).count()
    }
}

impl Lanes {
    /// The lanes of session `session`, registered for lanes to join.
    pub fn open(shared: &Shared, session: u64) -> Result<Arc<Lanes>, String> {
        let mut secret = [0u8; LANE_SECRET_LEN];
        getrandom::fill(&mut secret).map_err(|e| format!("no random secret: {e}"))?;
        let l = Arc::new(Lanes {
            session,
            secret,
            state: Mutex::new(State::default()),
            cond: Condvar::new(),
        });
        lock(&shared.lanes).insert(session, l.clone());
        Ok(l)
    }

    /// Grants up to `want` lanes in all; returns how many and the secret.
    pub fn grant(&self, want: u32) -> (u32, [u8; LANE_SECRET_LEN]) {
        let mut st = lock(&self.state);
        st.granted = st.granted.max(want.min(max_lanes()));
        st.progress = Some(Instant::now());
        (st.granted, self.secret)
    }

    /// Waits for piece `key` and takes it: `Err` when it cannot come any
    /// more (see the module's text).
    pub fn take(&self, key: u64) -> Result<HostBuf, cl_int> {
        let mut st = lock(&self.state);
        loop {
            if let Some((_, piece)) = st.pieces.remove(&key) {
                self.cond.notify_all();
                return Ok(piece);
            }
            let idle = st.progress.map_or(Duration::ZERO, |t| t.elapsed());
            if st.ended || (st.joined && st.open.is_empty()) || idle >= STALL {
                return Err(CL_INVALID_VALUE);
            }
            st = self
                .cond
                .wait_timeout(st, STALL - idle)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// At the session's end: no lane may join any more, open ones are
    /// closed, pieces not written are dropped.
    pub fn end(&self, shared: &Shared) {
        lock(&shared.lanes).remove(&self.session);
        let mut st = lock(&self.state);
        st.ended = true;
        for s in st.open.values() {
            s.shutdown(Shutdown::Both);
        }
        st.pieces.clear();
        self.cond.notify_all();
    }

    /// Lane `lane` of this session is connected on `stream`, unless that
    /// number is not granted or taken.
    fn join(&self, lane: u32, stream: &Arc<Stream>) -> Result<(), String> {
        let mut st = lock(&self.state);
        if st.ended {
            return Err("the session has ended".into());
        }
        if lane >= st.granted {
            return Err(format!("lane {lane} was not granted"));
        }
        if st.open.contains_key(&lane) {
            return Err(format!("lane {lane} is already connected"));
        }
        st.open.insert(lane, stream.clone());
        st.joined = true;
        st.progress = Some(Instant::now());
        Ok(())
    }

    /// Waits until lane `lane` may take another piece; false once the
    /// session has ended.
    fn room(&self, lane: u32) -> bool {
        let mut st = lock(&self.state);
        while !st.ended && st.held(lane) >= LANE_HELD {
            st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        !st.ended
    }

    fn deliver(&self, lane: u32, key: u64, piece: HostBuf) -> Result<(), String> {
        let mut st = lock(&self.state);
        if st.ended {
            return Ok(());
        }
        if st.pieces.contains_key(&key) {
            return Err(format!("piece {key} was delivered twice"));
        }
        st.pieces.insert(key, (lane, piece));
        st.progress = Some(Instant::now());
        self.cond.notify_all();
        Ok(())
    }

    fn left(&self, lane: u32) {
        let mut st = lock(&self.state);
        st.open.remove(&lane);
        self.cond.notify_all();
    }
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8; LANE_SECRET_LEN], b: &[u8; LANE_SECRET_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Serves a connection whose first frame was `JoinLane` (sequence number
/// `seq`): checks it, then reads pieces until the client closes it, the
/// session ends, or the lane misbehaves (told why, closed).
pub(crate) fn serve(
    stream: &Arc<Stream>,
    reader: &mut FrameReader,
    writer: &Writer,
    shared: &Shared,
    id: u64,
    (seq, session, lane, secret): (u64, u64, u32, [u8; LANE_SECRET_LEN]),
) -> Result<(), (u64, String)> {
    let lanes = lock(&shared.lanes).get(&session).cloned();
    let lanes = match lanes {
        Some(l) if same_secret(&l.secret, &secret) => l,
        _ => return Err((seq, "no such session has lanes with that secret".into())),
    };
    lanes.join(lane, stream).map_err(|e| (seq, e))?;
    let ended = |e: String| {
        lanes.left(lane);
        Err((0, e))
    };
    if let Err(e) = reader.clear_deadline() {
        return ended(e.to_string());
    }
    writer.send(seq, &Answer::Status(CL_SUCCESS), &[]);
    log::debug!("connection {id}: lane {lane} of session {session}");
    let max_piece = LANE_PIECE_MAX.min(shared.limits.max_payload);
    let pool = lane_pool(shared);
    let mut last = seq;
    loop {
        if !lanes.room(lane) {
            break;
        }
        let h = match reader.next(MAX_BODY, max_piece) {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e @ (ReadError::Frame(_) | ReadError::Truncated)) => return ended(e.to_string()),
            Err(e) => {
                limited!(Level::Debug, "lane {lane} of session {session} lost: {e}");
                break;
            }
        };
        let key = match crane_wire::decode::<Call>(&reader.body) {
            Ok(Call::LanePiece { key }) => key,
            Ok(c) => return ended(format!("a lane carries pieces only, not {}", c.name())),
            Err(e) => return ended(format!("a message cannot be decoded: {e}")),
        };
        if h.seq <= last {
            return ended(format!("sequence number {} does not follow {last}", h.seq));
        }
        last = h.seq;
        if h.payload_len == 0 {
            return ended("an empty piece".into());
        }
        let len = h.payload_len as usize;
        let mut piece = match pool.as_ref().and_then(|p| p.take(len)) {
            Some(c) => HostBuf::Pinned(c),
            None => HostBuf::Heap(vec![0; len]),
        };
        match reader.payload_into(&mut piece) {
            Ok(()) => {}
            Err(e @ (ReadError::Frame(_) | ReadError::Truncated)) => return ended(e.to_string()),
            Err(e) => {
                limited!(Level::Debug, "lane {lane} of session {session} lost: {e}");
                break;
            }
        }
        if let Err(e) = lanes.deliver(lane, key, piece) {
            return ended(e);
        }
    }
    lanes.left(lane);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        let a = [7u8; LANE_SECRET_LEN];
        let mut b = a;
        assert!(same_secret(&a, &b));
        b[LANE_SECRET_LEN - 1] ^= 1;
        assert!(!same_secret(&a, &b));
        b = a;
        b[0] = 0;
        assert!(!same_secret(&a, &b));
    }
}
