//! Rate-limited logging (crate crane-ratelimit): whatever a guest can trigger
//! in dom0 (its agent's answers and error texts, malformed keys it writes) is
//! logged through [`limited!`], so a guest cannot flood the host's log.

/// Messages one call site may log per window.
pub const BURST: u32 = 10;

/// `limited!(log::Level::Warn, "format", args...)`: at most [`BURST`]
/// messages per window from this call site.
macro_rules! limited {
    ($lvl:expr, $($arg:tt)+) => {
        crane_ratelimit::limited!($crate::ratelimit::BURST, $lvl, $($arg)+)
    };
}
pub(crate) use limited;
