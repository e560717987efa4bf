//! crane's contract over XenStore, shared by the guest agent (`crane-agent`)
//! and the dom0 service: one place for the key layout ([`layout`]), the value
//! formats ([`value`], [`message`]), the request/response state machine
//! ([`message::Outcome`], [`message::GuestState`], [`message::check_seq`]), and
//! the narrow traits over XenStore access ([`store`]) with their
//! implementations: [`system::SystemStore`] (xenstored over its socket or the
//! guest's xenbus device) and [`mem::MemStore`] (in-process, for standalone
//! mode and unit tests). [`proxy`] carries the proxy session tokens dom0
//! gives the proxy domain; [`admin`] the migration requests an administrator
//! writes into dom0's tree. docs/xenstore-layout.md describes the protocol.
//!
//! Everything read from XenStore was written by the other side and is parsed
//! strictly: a hostile value gives an error that says what is wrong, never a
//! panic, and every length is bounded.

pub mod admin;
pub mod dom0;
pub mod error;
pub mod guest;
pub mod layout;
pub mod mem;
pub mod message;
pub mod perms;
pub mod proxy;
pub mod store;
pub mod system;
pub mod value;
pub mod wire;

pub use error::XsError;
pub use perms::{Access, Perm};
pub use store::{WatchEvent, XenStore, XsData, XsPerms, XsWatch};
