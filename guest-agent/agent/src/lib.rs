//! `crane-agent`, the guest migration daemon (the paper's "guest migration
//! daemon"): dom0 asks through XenStore (protocol in `crane-xs`,
//! docs/xenstore-layout.md) to prepare a migration or a resume, and the agent
//! moves every interposed OpenCL process off the GPU (remote or suspended),
//! unloads the GPU driver and reports `ready-for-detach`, or loads the driver,
//! waits for the GPU and brings every process back, reporting `resumed`.

pub mod apps;
pub mod config;
pub mod daemon;
pub mod device;
pub mod holders;
pub mod migration;
pub mod modules;
pub mod proxy_now;
pub mod standalone;
