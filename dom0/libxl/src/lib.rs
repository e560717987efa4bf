//! A small safe wrapper over Xen's libxl for crane's dom0 service: open a
//! context whose log goes to the `log` crate, look domains up, read their
//! information, move PCI devices in and out of the assignable pool and of
//! running domains, create a domain from an xl configuration file and destroy
//! one. Everything craned needs is behind the narrow [`Xl`] trait, so its
//! logic runs against a fake in unit tests and against [`Libxl`] (real libxl)
//! in the end-to-end tier.
//!
//! Domain creation is the one thing not done through libxl: turning an xl
//! configuration file into a `libxl_domain_config` is most of xl itself
//! (`parse_config_data`, thousands of lines over libxlutil), so
//! [`Libxl::create`] runs the real `xl create` instead (see [`create`]).

pub mod create;
pub mod error;
mod logger;
pub mod pci;
mod system;
pub mod xl;

pub use error::{LibxlCode, LibxlError};
pub use pci::PciAddr;
pub use system::Libxl;
pub use xl::{DomainInfo, DomainState, Xl};
