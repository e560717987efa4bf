//! `crane-proxy`: runs the OpenCL calls that crane's interposer forwards
//! from guests while they migrate. It listens on TCP and unix sockets,
//! speaks crane's wire protocol (`crane-wire`, docs/wire-protocol.md), and
//! executes each session's calls on a vendor OpenCL library it loads itself
//! (no ICD loader), through the ICD dispatch tables of the vendor's objects.
//!
//! Every connection is an isolated session with its own id namespace and
//! limits; a session that misbehaves is told why and closed, and a session
//! whose client disappears is torn down, its objects released. See
//! docs/operations.md for running it.

pub mod config;
pub mod server;
pub mod tokens;
pub mod xs_tokens;

mod api;
mod conn;
mod lanes;
pub mod output;
mod pinned;
mod pool;
mod quirks;
mod ratelimit;
mod session;
mod trace;
mod vendor;
pub mod warm;

pub use config::{Config, ListenAddr};
pub use server::{BoundAddr, Proxy, ServerError, SessionStats, Stats};
