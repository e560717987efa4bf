//! Errors of XenStore access, shared by every [`crate::store`] implementation.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum XsError {
    #[error("cannot connect to xenstored at {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the xenstored connection failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("xenstored closed the connection")]
    Closed,
    #[error("xenstored refused {op} {path}: {errno}")]
    Refused {
        op: &'static str,
        path: String,
        /// The errno name xenstored sent (`ENOENT`, `EACCES`, ...).
        errno: String,
    },
    #[error("xenstored sent a malformed message: {0}")]
    Protocol(String),
    #[error("xenstored did not answer {op} within {secs} s")]
    Timeout { op: &'static str, secs: u64 },
    #[error("{0}")]
    InvalidArgument(String),
}

impl XsError {
    /// The node (or its parent, for `rm`) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, XsError::Refused { errno, .. } if errno == "ENOENT")
    }

    /// The node's permissions do not allow the operation.
    pub fn is_access_denied(&self) -> bool {
        matches!(self, XsError::Refused { errno, .. } if errno == "EACCES" || errno == "EPERM")
    }
}
