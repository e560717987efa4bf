//! libxl's error codes (`libxl_error`, the `ERROR_*` values of libxl.h) as a
//! typed enum, and the wrapper's errors.

use libxl_sys::libxl_error as e;

use crate::pci::PciAddr;

/// One of libxl's `ERROR_*` codes, or a code this build does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibxlCode {
    Nonspecific,
    Version,
    Fail,
    NotImplemented,
    NoMem,
    Inval,
    BadFail,
    GuestTimedOut,
    TimedOut,
    NoParavirt,
    NotReady,
    OseventRegFail,
    BufferFull,
    UnknownChild,
    LockFail,
    JsonConfigEmpty,
    DeviceExists,
    CheckpointDevopsDoesNotMatch,
    CheckpointDeviceNotSupported,
    VnumaConfigInvalid,
    DomainNotFound,
    Aborted,
    NotFound,
    DomainDestroyed,
    FeatureRemoved,
    ProtocolErrorQmp,
    UnknownQmpError,
    QmpGenericError,
    QmpCommandNotFound,
    QmpDeviceNotActive,
    QmpDeviceNotFound,
    QemuApi,
    /// A negative code newer than this build's libxl.h.
    Unknown(i32),
}

const CODES: &[(e::Type, LibxlCode, &str)] = &[
    (
        e::ERROR_NONSPECIFIC,
        LibxlCode::Nonspecific,
        "ERROR_NONSPECIFIC",
    ),
    (e::ERROR_VERSION, LibxlCode::Version, "ERROR_VERSION"),
    (e::ERROR_FAIL, LibxlCode::Fail, "ERROR_FAIL"),
    (e::ERROR_NI, LibxlCode::NotImplemented, "ERROR_NI"),
    (e::ERROR_NOMEM, LibxlCode::NoMem, "ERROR_NOMEM"),
    (e::ERROR_INVAL, LibxlCode::Inval, "ERROR_INVAL"),
    (e::ERROR_BADFAIL, LibxlCode::BadFail, "ERROR_BADFAIL"),
    (
        e::ERROR_GUEST_TIMEDOUT,
        LibxlCode::GuestTimedOut,
        "ERROR_GUEST_TIMEDOUT",
    ),
    (e::ERROR_TIMEDOUT, LibxlCode::TimedOut, "ERROR_TIMEDOUT"),
    (
        e::ERROR_NOPARAVIRT,
        LibxlCode::NoParavirt,
        "ERROR_NOPARAVIRT",
    ),
    (e::ERROR_NOT_READY, LibxlCode::NotReady, "ERROR_NOT_READY"),
    (
        e::ERROR_OSEVENT_REG_FAIL,
        LibxlCode::OseventRegFail,
        "ERROR_OSEVENT_REG_FAIL",
    ),
    (
        e::ERROR_BUFFERFULL,
        LibxlCode::BufferFull,
        "ERROR_BUFFERFULL",
    ),
    (
        e::ERROR_UNKNOWN_CHILD,
        LibxlCode::UnknownChild,
        "ERROR_UNKNOWN_CHILD",
    ),
    (e::ERROR_LOCK_FAIL, LibxlCode::LockFail, "ERROR_LOCK_FAIL"),
    (
        e::ERROR_JSON_CONFIG_EMPTY,
        LibxlCode::JsonConfigEmpty,
        "ERROR_JSON_CONFIG_EMPTY",
    ),
    (
        e::ERROR_DEVICE_EXISTS,
        LibxlCode::DeviceExists,
        "ERROR_DEVICE_EXISTS",
    ),
    (
        e::ERROR_CHECKPOINT_DEVOPS_DOES_NOT_MATCH,
        LibxlCode::CheckpointDevopsDoesNotMatch,
        "ERROR_CHECKPOINT_DEVOPS_DOES_NOT_MATCH",
    ),
    (
        e::ERROR_CHECKPOINT_DEVICE_NOT_SUPPORTED,
        LibxlCode::CheckpointDeviceNotSupported,
        "ERROR_CHECKPOINT_DEVICE_NOT_SUPPORTED",
    ),
    (
        e::ERROR_VNUMA_CONFIG_INVALID,
        LibxlCode::VnumaConfigInvalid,
        "ERROR_VNUMA_CONFIG_INVALID",
    ),
    (
        e::ERROR_DOMAIN_NOTFOUND,
        LibxlCode::DomainNotFound,
        "ERROR_DOMAIN_NOTFOUND",
    ),
    (e::ERROR_ABORTED, LibxlCode::Aborted, "ERROR_ABORTED"),
    (e::ERROR_NOTFOUND, LibxlCode::NotFound, "ERROR_NOTFOUND"),
    (
        e::ERROR_DOMAIN_DESTROYED,
        LibxlCode::DomainDestroyed,
        "ERROR_DOMAIN_DESTROYED",
    ),
    (
        e::ERROR_FEATURE_REMOVED,
        LibxlCode::FeatureRemoved,
        "ERROR_FEATURE_REMOVED",
    ),
    (
        e::ERROR_PROTOCOL_ERROR_QMP,
        LibxlCode::ProtocolErrorQmp,
        "ERROR_PROTOCOL_ERROR_QMP",
    ),
    (
        e::ERROR_UNKNOWN_QMP_ERROR,
        LibxlCode::UnknownQmpError,
        "ERROR_UNKNOWN_QMP_ERROR",
    ),
    (
        e::ERROR_QMP_GENERIC_ERROR,
        LibxlCode::QmpGenericError,
        "ERROR_QMP_GENERIC_ERROR",
    ),
    (
        e::ERROR_QMP_COMMAND_NOT_FOUND,
        LibxlCode::QmpCommandNotFound,
        "ERROR_QMP_COMMAND_NOT_FOUND",
    ),
    (
        e::ERROR_QMP_DEVICE_NOT_ACTIVE,
        LibxlCode::QmpDeviceNotActive,
        "ERROR_QMP_DEVICE_NOT_ACTIVE",
    ),
    (
        e::ERROR_QMP_DEVICE_NOT_FOUND,
        LibxlCode::QmpDeviceNotFound,
        "ERROR_QMP_DEVICE_NOT_FOUND",
    ),
    (e::ERROR_QEMU_API, LibxlCode::QemuApi, "ERROR_QEMU_API"),
];

impl LibxlCode {
    /// The code of a libxl return value; `None` for success (0 or more).
    pub fn from_rc(rc: i32) -> Option<LibxlCode> {
        if rc >= 0 {
            return None;
        }
        Some(
            CODES
                .iter()
                .find(|(c, _, _)| *c == rc)
                .map_or(LibxlCode::Unknown(rc), |(_, code, _)| *code),
        )
    }

    /// The name in libxl.h (`ERROR_DOMAIN_NOTFOUND`), or `ERROR(-99)`.
    pub fn name(self) -> String {
        match CODES.iter().find(|(_, code, _)| *code == self) {
            Some((_, _, name)) => (*name).to_string(),
            None => match self {
                LibxlCode::Unknown(rc) => format!("ERROR({rc})"),
                _ => unreachable!("every known code is in CODES"),
            },
        }
    }

    /// The numeric value libxl returns.
    pub fn rc(self) -> i32 {
        match self {
            LibxlCode::Unknown(rc) => rc,
            known => {
                CODES
                    .iter()
                    .find(|(_, code, _)| *code == known)
                    .expect("every known code is in CODES")
                    .0
            }
        }
    }
}

impl std::fmt::Display for LibxlCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.rc())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LibxlError {
    #[error("cannot open a libxl context (is this dom0 of a running Xen?): {0}")]
    Open(LibxlCode),
    #[error("libxl {op} failed: {code}")]
    Call { op: &'static str, code: LibxlCode },
    #[error("libxl {op} on domain {domid} failed: {code}")]
    Domain {
        op: &'static str,
        domid: u32,
        code: LibxlCode,
    },
    #[error("libxl {op} of PCI device {bdf} failed: {code}")]
    Pci {
        op: &'static str,
        bdf: PciAddr,
        code: LibxlCode,
    },
    #[error("libxl {op} returned nothing")]
    Null { op: &'static str },
    #[error("the domain name {0:?} contains a NUL byte")]
    BadName(String),
    #[error("xl create {config}: {why}")]
    Create { config: String, why: String },
}

impl LibxlError {
    /// The libxl code behind the error, if any.
    pub fn code(&self) -> Option<LibxlCode> {
        match self {
            LibxlError::Open(c) => Some(*c),
            LibxlError::Call { code, .. }
            | LibxlError::Domain { code, .. }
            | LibxlError::Pci { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The domain does not exist (any more).
    pub fn is_domain_not_found(&self) -> bool {
        matches!(
            self.code(),
            Some(LibxlCode::DomainNotFound | LibxlCode::DomainDestroyed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_both_ways() {
        assert_eq!(LibxlCode::from_rc(0), None);
        assert_eq!(LibxlCode::from_rc(3), None);
        assert_eq!(LibxlCode::from_rc(-3), Some(LibxlCode::Fail));
        assert_eq!(LibxlCode::from_rc(-21), Some(LibxlCode::DomainNotFound));
        assert_eq!(LibxlCode::from_rc(-32), Some(LibxlCode::QemuApi));
        assert_eq!(LibxlCode::from_rc(-99), Some(LibxlCode::Unknown(-99)));
        for rc in -32..=-1 {
            let code = LibxlCode::from_rc(rc).unwrap();
            assert!(!matches!(code, LibxlCode::Unknown(_)), "{rc} unknown");
            assert_eq!(code.rc(), rc);
            assert!(code.name().starts_with("ERROR_"), "{}", code.name());
        }
        assert_eq!(LibxlCode::Unknown(-40).name(), "ERROR(-40)");
        assert_eq!(
            LibxlCode::DeviceExists.to_string(),
            "ERROR_DEVICE_EXISTS (-17)"
        );
    }

    #[test]
    fn errors_say_what_failed() {
        let e = LibxlError::Pci {
            op: "device_pci_remove",
            bdf: "0000:00:05.0".parse().unwrap(),
            code: LibxlCode::from_rc(-28).unwrap(),
        };
        assert_eq!(
            e.to_string(),
            "libxl device_pci_remove of PCI device 0000:00:05.0 failed: ERROR_QMP_GENERIC_ERROR (-28)"
        );
        assert!(
            LibxlError::Domain {
                op: "domain_info",
                domid: 4,
                code: LibxlCode::DomainNotFound
            }
            .is_domain_not_found()
        );
        assert!(!e.is_domain_not_found());
    }
}
