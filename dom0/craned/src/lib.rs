//! crane's dom0 service (`craned`): it keeps the proxy domain running and
//! answering, publishes the guests' proxy tokens to it, and carries out the
//! migration choreography around `xl migrate` for the xl wrapper and
//! `crane status` over a local control socket. Everything that touches Xen
//! goes through narrow traits (crane-xs's `XenStore`, crane-libxl's `Xl`), so
//! the logic here runs against fakes in unit tests and against real
//! xenstored and libxl in the end-to-end tier.
//!
//! - [`config`]: the configuration file, `/etc/crane/craned.toml`.
//! - [`migrate`]: the choreography, with [`journal`] keeping each step.
//! - [`proxy`]: the proxy domain's supervision and its tokens ([`tokens`]).
//! - [`service`]: the state behind the control socket; [`server`]: the socket.
//! - [`admin`]: the XenStore trigger (requests under dom0's crane tree), with
//!   [`transfer`] running `xl migrate` for it.

pub(crate) mod admin;
pub mod config;
pub mod journal;
pub mod migrate;
pub mod proxy;
pub(crate) mod ratelimit;
pub mod server;
pub mod service;
pub mod tokens;
pub mod transfer;

#[cfg(test)]
pub(crate) mod testing;
