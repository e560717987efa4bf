//! The real XenStore: xenstored over its unix socket (dom0) or the xenbus
//! device (guest). Plain reads and writes go through xenstore-rs's blocking
//! `XsUnix`; permissions and watches, which it lacks, through crane's
//! [`WireClient`] on a second connection (watch events then never interleave
//! with xenstore-rs's replies, which it could not handle). xenstored orders
//! everything, so a read on one connection after an event on the other sees
//! the change. Both connections find xenstored the same way: `$XENSTORED_PATH`,
//! else `/run/xenstored/socket`, else `/dev/xen/xenbus`.

use std::cell::RefCell;
use std::io;
use std::time::Duration;

use xenstore_rs::Xs;
use xenstore_rs::unix::XsUnix;

use crate::error::XsError;
use crate::layout::validate_path;
use crate::perms::Perm;
use crate::store::{WatchEvent, XsData, XsPerms, XsWatch};
use crate::wire::{WireClient, default_endpoint};

pub struct SystemStore {
    data: XsUnix,
    control: RefCell<WireClient>,
}

impl SystemStore {
    pub fn open() -> Result<SystemStore, XsError> {
        let endpoint = default_endpoint();
        let data = XsUnix::new().map_err(|source| XsError::Connect {
            path: endpoint.clone(),
            source,
        })?;
        let control = WireClient::open(&endpoint)?;
        Ok(SystemStore {
            data,
            control: RefCell::new(control),
        })
    }

    /// The wire client, for requests the traits do not cover
    /// (`XS_GET_DOMAIN_PATH`, `XS_MKDIR`).
    pub fn wire(&self) -> std::cell::RefMut<'_, WireClient> {
        self.control.borrow_mut()
    }
}

/// xenstore-rs reports xenstored's errno names as "XS interface error ENAME".
fn from_xs(op: &'static str, path: &str, e: io::Error) -> XsError {
    let msg = e.to_string();
    match msg.strip_prefix("XS interface error ") {
        Some(errno) => XsError::Refused {
            op,
            path: path.to_string(),
            errno: errno.to_string(),
        },
        None => XsError::Io(e),
    }
}

impl XsData for SystemStore {
    fn read(&self, path: &str) -> Result<Option<String>, XsError> {
        validate_path(path)?;
        match self.data.read(path) {
            Ok(v) => Ok(Some(v.into())),
            Err(e) => match from_xs("read", path, e) {
                e if e.is_not_found() => Ok(None),
                e => Err(e),
            },
        }
    }

    fn write(&self, path: &str, value: &str) -> Result<(), XsError> {
        validate_path(path)?;
        if value.len() + path.len() + 1 > crate::wire::PAYLOAD_MAX {
            return Err(XsError::InvalidArgument(format!(
                "the value for {path} is too long for one XenStore message"
            )));
        }
        self.data
            .write(path, value)
            .map_err(|e| from_xs("write", path, e))
    }

    fn rm(&self, path: &str) -> Result<(), XsError> {
        validate_path(path)?;
        match self.data.rm(path) {
            Ok(()) => Ok(()),
            Err(e) => match from_xs("rm", path, e) {
                e if e.is_not_found() => Ok(()),
                e => Err(e),
            },
        }
    }

    fn directory(&self, path: &str) -> Result<Vec<String>, XsError> {
        validate_path(path)?;
        match self.data.directory(path) {
            Ok(v) => Ok(v.into_iter().map(String::from).collect()),
            Err(e) => match from_xs("directory", path, e) {
                e if e.is_not_found() => Ok(Vec::new()),
                e => Err(e),
            },
        }
    }
}

impl XsPerms for SystemStore {
    fn get_perms(&self, path: &str) -> Result<Vec<Perm>, XsError> {
        self.control.borrow_mut().get_perms(path)
    }

    fn set_perms(&self, path: &str, perms: &[Perm]) -> Result<(), XsError> {
        self.control.borrow_mut().set_perms(path, perms)
    }
}

impl XsWatch for SystemStore {
    fn watch(&self, path: &str, token: &str) -> Result<(), XsError> {
        self.control.borrow_mut().watch(path, token)
    }

    fn unwatch(&self, path: &str, token: &str) -> Result<(), XsError> {
        self.control.borrow_mut().unwatch(path, token)
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<WatchEvent>, XsError> {
        self.control.borrow_mut().wait_event(timeout)
    }
}
