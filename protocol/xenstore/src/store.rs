//! The narrow traits over XenStore access. Logic that talks to XenStore is
//! generic over these, so it runs against [`crate::mem::MemStore`] in unit tests
//! and against [`crate::system::SystemStore`] (real xenstored) in the
//! end-to-end tier. Paths are absolute (`/local/domain/3/crane`) or, from a
//! guest, relative to the guest's home `/local/domain/<domid>`.

use std::time::Duration;

use crate::error::XsError;
use crate::perms::Perm;

/// Reading and writing nodes (what xenstore-rs's `Xs` trait covers).
pub trait XsData {
    /// The node's value; `None` when the node does not exist.
    fn read(&self, path: &str) -> Result<Option<String>, XsError>;
    /// Writes the value, creating the node and missing parents.
    fn write(&self, path: &str, value: &str) -> Result<(), XsError>;
    /// Removes the node and its children; a missing node is not an error.
    fn rm(&self, path: &str) -> Result<(), XsError>;
    /// The names of the node's children; empty when the node does not exist.
    fn directory(&self, path: &str) -> Result<Vec<String>, XsError>;
}

/// Node permissions (`XS_GET_PERMS`, `XS_SET_PERMS`). The first entry names
/// the owner, who may do anything, and the access every domain not listed
/// after it gets.
pub trait XsPerms {
    fn get_perms(&self, path: &str) -> Result<Vec<Perm>, XsError>;
    fn set_perms(&self, path: &str, perms: &[Perm]) -> Result<(), XsError>;
}

/// A watch fired: `path` changed (created, written, removed or had its
/// permissions changed). Relative when the watch was set relative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub path: String,
    pub token: String,
}

/// Watches (`XS_WATCH`, `XS_UNWATCH`, `XS_WATCH_EVENT`). A new watch fires once
/// at once; watches may also fire spuriously, so a handler re-reads state and
/// treats an event only as "look again".
pub trait XsWatch {
    fn watch(&self, path: &str, token: &str) -> Result<(), XsError>;
    fn unwatch(&self, path: &str, token: &str) -> Result<(), XsError>;
    /// The next event, waiting at most `timeout`; `None` when none came.
    fn wait_event(&self, timeout: Duration) -> Result<Option<WatchEvent>, XsError>;
}

/// Everything crane needs from XenStore.
pub trait XenStore: XsData + XsPerms + XsWatch {}
impl<T: XsData + XsPerms + XsWatch> XenStore for T {}
