//! The narrow interface craned needs from the toolstack. [`crate::Libxl`]
//! implements it over libxl; craned's unit tests implement it with a fake
//! (fakes never replace the end-to-end tier, which runs the real one).

use std::path::Path;

use crate::error::LibxlError;
use crate::pci::PciAddr;

/// What a domain is doing, from `libxl_dominfo`'s flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DomainState {
    Running,
    Blocked,
    Paused,
    /// Shut down (powered off, crashed, suspended for save) but not yet
    /// destroyed.
    Shutdown,
    Dying,
}

impl DomainState {
    /// Whether the domain is alive: running, blocked or paused.
    pub fn is_alive(self) -> bool {
        matches!(
            self,
            DomainState::Running | DomainState::Blocked | DomainState::Paused
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DomainInfo {
    pub domid: u32,
    /// Empty when the domain has no name (yet).
    pub name: String,
    pub state: DomainState,
    pub memory_kib: u64,
}

/// Domains and PCI passthrough, as craned uses them. Every operation is
/// synchronous. PCI operations are idempotent where libxl's are (making a
/// device assignable twice succeeds); callers check `pci_list` before
/// attaching or detaching.
pub trait Xl {
    /// The domain called `name`; `None` when no domain has that name.
    fn domid(&self, name: &str) -> Result<Option<u32>, LibxlError>;
    /// One domain's information; `None` when it does not exist.
    fn domain_info(&self, domid: u32) -> Result<Option<DomainInfo>, LibxlError>;
    /// Every domain, dom0 included.
    fn domains(&self) -> Result<Vec<DomainInfo>, LibxlError>;
    /// The PCI devices bound to pciback, ready to be given to a domain.
    fn pci_assignable_list(&self) -> Result<Vec<PciAddr>, LibxlError>;
    /// Binds the device to pciback (unbinding it from its dom0 driver; with
    /// `rebind`, remembering that driver for [`Xl::pci_assignable_remove`]).
    fn pci_assignable_add(&self, bdf: PciAddr, rebind: bool) -> Result<(), LibxlError>;
    /// Unbinds the device from pciback (with `rebind`, back to its driver).
    fn pci_assignable_remove(&self, bdf: PciAddr, rebind: bool) -> Result<(), LibxlError>;
    /// The PCI devices passed through to a domain.
    fn pci_list(&self, domid: u32) -> Result<Vec<PciAddr>, LibxlError>;
    /// Hot-plugs an assignable device into a running domain.
    fn pci_attach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError>;
    /// Hot-unplugs a device from a domain; it stays assignable.
    fn pci_detach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError>;
    /// Creates a domain from an xl configuration file: started, or with
    /// `paused` left paused (`xl create -p`) until [`Xl::unpause`], so that
    /// devices can be given to it before it boots.
    fn create(&self, config: &Path, paused: bool) -> Result<(), LibxlError>;
    /// Lets a paused domain run.
    fn unpause(&self, domid: u32) -> Result<(), LibxlError>;
    /// Destroys a domain at once.
    fn destroy(&self, domid: u32) -> Result<(), LibxlError>;
}
