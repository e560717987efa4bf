//! Rate-limited logging. Whatever a guest can trigger (in crane-proxy a bad
//! frame, a failed call, a refused token; in craned its agent's answers and
//! the keys it writes) is logged through [`limited!`], so that a guest cannot
//! flood a log: each call site may log a burst of messages per window, and
//! says how many it dropped when it logs again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[doc(hidden)]
pub use log as __log;

/// Length of one rate-limiting window.
pub const WINDOW: Duration = Duration::from_secs(10);

struct Window {
    start: Instant,
    count: u32,
    suppressed: u64,
}

/// The budget of one call site: `burst` messages per [`WINDOW`].
pub struct RateLimit {
    burst: u32,
    state: Mutex<Option<Window>>,
}

impl RateLimit {
    pub const fn new(burst: u32) -> RateLimit {
        RateLimit {
            burst,
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
        if w.count < self.burst {
            w.count += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// `limited!(burst, log::Level::Warn, "format", args...)`: logs at most
/// `burst` messages per [`WINDOW`] from this call site.
#[macro_export]
macro_rules! limited {
    ($burst:expr, $lvl:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::RateLimit = $crate::RateLimit::new($burst);
        let lvl: $crate::__log::Level = $lvl;
        if $crate::__log::log_enabled!(lvl) {
            if let Some(dropped) = LIMIT.admit() {
                if dropped > 0 {
                    $crate::__log::log!(lvl, "({dropped} similar messages were suppressed)");
                }
                $crate::__log::log!(lvl, $($arg)+);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_messages_are_counted_not_logged() {
        let rl = RateLimit::new(20);
        for _ in 0..20 {
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
