//! Timing counters for profiling the per-call path (`CRANE_PROXY_TRACE=1`):
//! per session, the time its thread spent waiting for the client, reading
//! frames, decoding and running each kind of call, and how the answers of
//! waited-for commands went out; written to stderr when the session ends.
//! Off, they cost one branch per call.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub(crate) static ON: LazyLock<bool> =
    LazyLock::new(|| std::env::var_os("CRANE_PROXY_TRACE").is_some_and(|v| v != "0"));

#[inline]
pub(crate) fn on() -> bool {
    *ON
}

/// Counters shared by every thread of the proxy (summed over sessions).
#[derive(Default)]
pub(crate) struct Global {
    /// Read syscalls on client sockets, and bytes they returned.
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Frames written.
    pub sends: AtomicU64,
    pub send_ns: AtomicU64,
    /// Waited-for registrations answered by the vendor callback, a waiter
    /// thread, the poll; and the summed time from registration to answer.
    pub by_callback: AtomicU64,
    pub by_waiter: AtomicU64,
    pub by_poll: AtomicU64,
    pub answer_ns: AtomicU64,
    /// Registrations (clSetEventCallback) and the time they took.
    pub registrations: AtomicU64,
    pub register_ns: AtomicU64,
    /// Transfers staged in pinned memory, in ordinary memory; pinned
    /// buffers made.
    pub pinned: AtomicU64,
    pub unpinned: AtomicU64,
    pub pinned_made: AtomicU64,
    /// Reads answered by the session thread watching them.
    pub read_spun: AtomicU64,
}

pub(crate) static GLOBAL: LazyLock<Global> = LazyLock::new(Global::default);

pub(crate) fn add(c: &AtomicU64, v: u64) {
    c.fetch_add(v, Ordering::Relaxed);
}

pub(crate) fn ns(since: Instant) -> u64 {
    since.elapsed().as_nanos() as u64
}

/// One session thread's counters.
#[derive(Default)]
pub(crate) struct Session {
    /// Time blocked before a frame's first byte was there, reading the rest.
    pub wait_ns: u64,
    pub decode_ns: u64,
    pub frames: u64,
    pub calls: HashMap<&'static str, (u64, u64)>,
}

impl Session {
    pub fn call(&mut self, name: &'static str, since: Instant) {
        let e = self.calls.entry(name).or_default();
        e.0 += 1;
        e.1 += ns(since);
    }

    pub fn report(&self, id: u64) {
        let g = &*GLOBAL;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = format!(
            "TRACE session {id}: {} frames, waited {:.1} ms, decoded {:.1} ms ({:.0} ns/frame)\n",
            self.frames,
            self.wait_ns as f64 / 1e6,
            self.decode_ns as f64 / 1e6,
            self.decode_ns as f64 / self.frames.max(1) as f64
        );
        let mut calls: Vec<_> = self.calls.iter().collect();
        calls.sort_by_key(|(_, (_, t))| std::cmp::Reverse(*t));
        for (name, (n, t)) in calls {
            out += &format!(
                "TRACE   {name:<28} {n:>9} calls {:>9.1} ms {:>8.0} ns/call\n",
                *t as f64 / 1e6,
                *t as f64 / (*n).max(1) as f64
            );
        }
        let answered = l(&g.by_callback) + l(&g.by_waiter) + l(&g.by_poll);
        out += &format!(
            "TRACE proxy: {} socket reads ({:.0} B/read), {} sends ({:.0} ns/send), {} registrations ({:.0} ns each), answers by callback/waiter/poll {}/{}/{} ({:.1} us from registration)\n",
            l(&g.reads),
            l(&g.read_bytes) as f64 / l(&g.reads).max(1) as f64,
            l(&g.sends),
            l(&g.send_ns) as f64 / l(&g.sends).max(1) as f64,
            l(&g.registrations),
            l(&g.register_ns) as f64 / l(&g.registrations).max(1) as f64,
            l(&g.by_callback),
            l(&g.by_waiter),
            l(&g.by_poll),
            l(&g.answer_ns) as f64 / answered.max(1) as f64 / 1e3,
        );
        out += &format!(
            "TRACE proxy: transfers staged pinned/ordinary {}/{}, {} pinned buffers made, {} reads answered by the session thread\n",
            l(&g.pinned),
            l(&g.unpinned),
            l(&g.pinned_made),
            l(&g.read_spun),
        );
        eprint!("{out}");
    }
}
