//! Pre-copy to crane-proxy (docs/architecture.md, "Pre-copy to
//! crane-proxy"): before a move, while the application still runs on its own
//! device, the buffers' contents are read into RAM (the local pre-copy,
//! [`crate::lifecycle::precopy`]) and sent ahead to the proxy, which keeps
//! them as blobs of the session the move will use (wire 1.5,
//! [`Call::Stash`]). Rounds repeat this for what the application changed
//! meanwhile until little is left. The move then writes each buffer whose
//! RAM copy is still the one sent from its blob on the proxy
//! ([`Call::EnqueueWriteStash`]), and sends only the rest: the application
//! stops for what it wrote since the last round.
//!
//! Which RAM copy was sent is told by the copy's generation
//! ([`crate::objects::Shadow::generation`]), which changes at every change
//! of the copy. Blobs the move does not use are dropped at its end.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crane_control::Phase;
use crane_wire::{Answer, Call};
use opencl_sys::*;

use super::Session;
use super::session::Dest;
use crate::handle;
use crate::objects::{Mem, MemKind};

/// A blob sent ahead: its key on the proxy and the generation of the RAM
/// copy it holds.
#[derive(Clone, Copy)]
struct Sent {
    key: u64,
    generation: u64,
}

/// The session opened ahead of a move and what was sent on it, by memory
/// object (its address: a generation is unique to one object, so an address
/// reused by a later object never matches).
struct Ahead {
    addr: String,
    token: String,
    session: Arc<Session>,
    sent: HashMap<usize, Sent>,
}

/// Between a pre-copy and the move that takes its session.
static AHEAD: Mutex<Option<Ahead>> = Mutex::new(None);
/// During the move's rebuild: the blobs not used yet.
static TAKEN: Mutex<Option<HashMap<usize, Sent>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffers whose RAM copy the move would write into a new buffer with a
/// write (what [`Call::EnqueueWriteStash`] stands in for).
pub fn eligible(m: &Mem) -> bool {
    matches!(m.kind, MemKind::Buffer)
        && m.flags & (CL_MEM_USE_HOST_PTR | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS) == 0
}

/// What a round did.
pub struct Round {
    pub read: u64,
    pub sent: u64,
}

/// Pre-copy to crane-proxy at `addr`: up to `rounds` rounds of a local
/// pre-copy and sending what changed, stopping early once a round sends at
/// most `small` bytes or no less than the round before (the application
/// writes as fast as they go). Returns the phases (all run beside the application)
/// and each round's figures. On failure nothing is kept (the move then
/// sends everything, as without a pre-copy).
pub fn send(
    addr: &str,
    token: &str,
    deadline: Duration,
    rounds: u32,
    small: u64,
) -> Result<(Vec<Phase>, Vec<Round>), String> {
    let r = send_rounds(addr, token, deadline, rounds, small);
    if r.is_err() {
        discard();
    }
    r
}

fn send_rounds(
    addr: &str,
    token: &str,
    deadline: Duration,
    rounds: u32,
    small: u64,
) -> Result<(Vec<Phase>, Vec<Round>), String> {
    let t = Instant::now();
    let session = session_for(addr, token)?;
    if session.proxy_minor < crane_wire::MINOR_STASH {
        discard();
        return Err(format!(
            "crane-proxy at {addr} speaks wire 1.{} and takes no pre-copy (1.{} does)",
            session.proxy_minor,
            crane_wire::MINOR_STASH
        ));
    }
    let mut phases = vec![Phase {
        name: "precopy-connect".into(),
        ms: t.elapsed().as_secs_f64() * 1e3,
        bytes: 0,
        parallel: true,
    }];
    let mut done = Vec::new();
    for round in 1..=rounds.max(1) {
        let t = Instant::now();
        let local = crate::lifecycle::precopy(deadline, crate::lifecycle::Pins::All)?;
        let read: u64 = local.iter().map(|p| p.bytes).sum();
        phases.push(Phase {
            name: format!("precopy-read-{round}"),
            ms: t.elapsed().as_secs_f64() * 1e3,
            bytes: read,
            parallel: true,
        });
        let t = Instant::now();
        let sent = send_changed(&session)?;
        phases.push(Phase {
            name: format!("precopy-send-{round}"),
            ms: t.elapsed().as_secs_f64() * 1e3,
            bytes: sent,
            parallel: true,
        });
        let gaining = done.last().is_none_or(|r: &Round| sent < r.sent);
        done.push(Round { read, sent });
        if sent <= small || !gaining {
            break;
        }
    }
    // One round trip: every piece has been taken (a refused one, over the
    // session's memory limit say, has been reported by then).
    let t = Instant::now();
    let synced = match session.call(&Call::Sync, &[], Dest::Keep) {
        Ok((Answer::Status(CL_SUCCESS), _)) => session.take_failure().map_or(Ok(()), Err),
        Ok((Answer::Status(e), _)) | Err(e) => Err(e),
        Ok(_) => Err(CL_INVALID_OPERATION),
    };
    if let Err(e) = synced {
        return Err(session.broken().unwrap_or_else(|| {
            format!(
                "crane-proxy at {addr} refused the pre-copy with OpenCL error {}",
                crate::entry::error_text(e)
            )
        }));
    }
    phases.push(Phase {
        name: "precopy-sync".into(),
        ms: t.elapsed().as_secs_f64() * 1e3,
        bytes: 0,
        parallel: true,
    });
    Ok((phases, done))
}

/// The session ahead for `addr`: the one of an earlier pre-copy there, or a
/// new one (one to elsewhere is closed).
fn session_for(addr: &str, token: &str) -> Result<Arc<Session>, String> {
    let mut ahead = lock(&AHEAD);
    if let Some(a) = ahead.as_ref()
        && a.addr == addr
        && a.token == token
        && a.session.broken().is_none()
    {
        return Ok(a.session.clone());
    }
    if let Some(old) = ahead.take() {
        old.session.close();
    }
    let session = Session::open(addr, token)?;
    *ahead = Some(Ahead {
        addr: addr.to_string(),
        token: token.to_string(),
        session: session.clone(),
        sent: HashMap::new(),
    });
    Ok(session)
}

/// Sends every eligible RAM copy not sent at its present generation;
/// returns the bytes sent.
fn send_changed(session: &Session) -> Result<u64, String> {
    let limit = session.limits.max_payload.clamp(1, crane_wire::STASH_PIECE) as usize;
    let failed = |e: cl_int| {
        session.broken().unwrap_or_else(|| {
            format!(
                "sending ahead failed with OpenCL error {}",
                crate::entry::error_text(e)
            )
        })
    };
    let mut bytes = 0u64;
    for m in handle::live::<Mem>() {
        // A dirty buffer's RAM copy is stale: the move reads it again.
        if !eligible(&m) || m.dirty.load(Ordering::Relaxed) {
            continue;
        }
        let key_of = Arc::as_ptr(&m) as usize;
        let sh = m.shadow.lock().unwrap_or_else(|e| e.into_inner());
        let Some(data) = sh.data().filter(|d| d.len() == m.size) else {
            continue;
        };
        let generation = sh.generation();
        let before = lock(&AHEAD)
            .as_ref()
            .and_then(|a| a.sent.get(&key_of).copied());
        if before.is_some_and(|s| s.generation == generation) {
            continue;
        }
        let key = session.new_id();
        let total = data.len() as u64;
        let mut offset = 0usize;
        loop {
            let len = limit.min(data.len() - offset);
            session
                .post(
                    &Call::Stash {
                        key,
                        total,
                        offset: offset as u64,
                    },
                    &data[offset..offset + len],
                    false,
                )
                .map_err(failed)?;
            offset += len;
            if offset >= data.len() {
                break;
            }
        }
        drop(sh);
        bytes += total;
        if let Some(old) = before {
            let _ = session.post(&Call::Unstash { key: old.key }, &[], false);
        }
        if let Some(a) = lock(&AHEAD).as_mut() {
            a.sent.insert(key_of, Sent { key, generation });
        }
    }
    session.flush().map_err(failed)?;
    Ok(bytes)
}

/// The move's connection: the session of a pre-copy to `addr` (with the
/// same token, still connected), whose blobs the rebuild then uses.
pub fn take_session(addr: &str, token: &str) -> Option<Arc<Session>> {
    let mut ahead = lock(&AHEAD);
    let a = ahead.take()?;
    if a.addr != addr || a.token != token || a.session.broken().is_some() {
        a.session.close();
        return None;
    }
    *lock(&TAKEN) = Some(a.sent);
    Some(a.session)
}

/// At the rebuild: the key of the blob holding `m`'s RAM copy at
/// `generation`, if one was sent (it is used once).
pub fn blob_for(m: &Mem, generation: u64) -> Option<u64> {
    let mut taken = lock(&TAKEN);
    let sent = taken.as_mut()?;
    let key = sent_at(sent, m, generation)?;
    sent.remove(&(std::ptr::from_ref(m) as usize));
    Some(key)
}

/// At the rebuild: whether a blob holds `m`'s RAM copy at `generation`
/// (without taking it).
pub fn holds(m: &Mem, generation: u64) -> bool {
    lock(&TAKEN)
        .as_ref()
        .is_some_and(|sent| sent_at(sent, m, generation).is_some())
}

/// The key of the blob in `sent` that holds `m`'s RAM copy at `generation`.
fn sent_at(sent: &HashMap<usize, Sent>, m: &Mem, generation: u64) -> Option<u64> {
    sent.get(&(std::ptr::from_ref(m) as usize))
        .filter(|s| s.generation == generation && eligible(m))
        .map(|s| s.key)
}

/// After the move's rebuild (done or not): the blobs it did not use are
/// dropped on the proxy. Returns how many.
pub fn finish(session: Option<&Session>) -> usize {
    let Some(left) = lock(&TAKEN).take() else {
        return 0;
    };
    if let Some(s) = session {
        for sent in left.values() {
            let _ = s.post(&Call::Unstash { key: sent.key }, &[], false);
        }
    }
    left.len()
}

/// Gives up a pre-copy that no move took: its session is closed (the proxy
/// drops its blobs with it).
pub fn discard() {
    if let Some(a) = lock(&AHEAD).take() {
        a.session.close();
    }
    lock(&TAKEN).take();
}
