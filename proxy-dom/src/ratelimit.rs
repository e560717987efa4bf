//! Rate-limited logging (crate crane-ratelimit): anything a client can trigger
//! (a bad frame, a failed call, a refused token) is logged through
//! [`limited!`], so that a guest cannot flood the proxy domain's log.

/// Messages one call site may log per window.
pub const BURST: u32 = 20;

/// `limited!(log::Level::Warn, "format", args...)`: at most [`BURST`]
/// messages per window from this call site.
macro_rules! limited {
    ($lvl:expr, $($arg:tt)+) => {
        crane_ratelimit::limited!($crate::ratelimit::BURST, $lvl, $($arg)+)
    };
}
pub(crate) use limited;
