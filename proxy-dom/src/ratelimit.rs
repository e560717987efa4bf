//! Rate-limited logging. Anything a client can trigger (a bad frame, a failed
//! call, a refused token) is logged through [`limited!`], so that a guest
//! cannot flood the proxy domain's log: each call site may log a burst of
//! messages per window, and says how many it dropped when it logs again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Length of one rate-limiting window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Messages one call site may log per window.
pub const BURST: u32 = 20;

struct Window {
    start: Instant,
    count: u32,
    suppressed: u64,
}

/// The budget of one call site.
pub struct RateLimit {
    state: Mutex<Option<Window>>,
}

impl RateLimit {
    pub const fn new() -> RateLimit {
        RateLimit {
            state: Mutex::new(None),
        }
    }

    /// `Some(n)` when a message may be logged now, `n` being the number of
    /// messages dropped since the last one that was logged.
    pub fn admit(&self) -> Option<u64> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let w = g.get_or_insert(Window {
            start: now,
            count: 0,
            suppressed: 0,
        });
        if now.duration_since(w.start) >= WINDOW {
            w.start = now;
            w.count = 0;
        }
        if w.count < BURST {
            w.count += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new()
    }
}

/// `limited!(log::Level::Warn, "format", args...)`: logs at most [`BURST`]
/// messages per [`WINDOW`] from this call site.
macro_rules! limited {
    ($lvl:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        let lvl: log::Level = $lvl;
        if log::log_enabled!(lvl) {
            if let Some(dropped) = LIMIT.admit() {
                if dropped > 0 {
                    log::log!(lvl, "({dropped} similar messages were suppressed)");
                }
                log::log!(lvl, $($arg)+);
            }
        }
    }};
}
pub(crate) use limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_messages_are_counted_not_logged() {
        let rl = RateLimit::new();
        for _ in 0..BURST {
            assert_eq!(rl.admit(), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(rl.admit(), None);
        }
        // Age the window instead of sleeping through it.
        rl.state.lock().unwrap().as_mut().unwrap().start -= WINDOW;
        assert_eq!(rl.admit(), Some(5));
    }
}
