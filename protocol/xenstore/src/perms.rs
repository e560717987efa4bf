//! XenStore node permissions in their wire form (`n0`, `r5`, `b5`, `w5`).

use std::fmt;

use crate::error::XsError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    None,
    Read,
    Write,
    Both,
}

impl Access {
    pub fn can_read(self) -> bool {
        matches!(self, Access::Read | Access::Both)
    }
    pub fn can_write(self) -> bool {
        matches!(self, Access::Write | Access::Both)
    }
}

/// One entry of a node's permission list. In a list, the first entry's domain
/// owns the node and its access applies to every domain not listed later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm {
    pub domid: u16,
    pub access: Access,
}

impl Perm {
    pub fn new(domid: u16, access: Access) -> Perm {
        Perm { domid, access }
    }

    /// Parses `n0`, `r12`, `w3`, `b65535`.
    pub fn parse(s: &str) -> Result<Perm, XsError> {
        let bad = || XsError::Protocol(format!("not a permission: {:?}", truncate(s)));
        let mut chars = s.chars();
        let access = match chars.next() {
            Some('n') => Access::None,
            Some('r') => Access::Read,
            Some('w') => Access::Write,
            Some('b') => Access::Both,
            _ => return Err(bad()),
        };
        let digits = chars.as_str();
        if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let domid: u32 = digits.parse().map_err(|_| bad())?;
        let domid = u16::try_from(domid).map_err(|_| bad())?;
        Ok(Perm { domid, access })
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = match self.access {
            Access::None => 'n',
            Access::Read => 'r',
            Access::Write => 'w',
            Access::Both => 'b',
        };
        write!(f, "{c}{}", self.domid)
    }
}

/// What `domid` may do on a node with these permissions (dom0 and the owner
/// may do anything), following xenstored.
pub fn access_for(perms: &[Perm], domid: u16) -> Access {
    let Some(owner) = perms.first() else {
        return Access::None;
    };
    if domid == 0 || owner.domid == domid {
        return Access::Both;
    }
    perms[1..]
        .iter()
        .find(|p| p.domid == domid)
        .map_or(owner.access, |p| p.access)
}

/// Why a node is not trusted as written by dom0 alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotDom0Only {
    #[error("the node has no permissions")]
    Empty,
    #[error("the node is owned by domain {0}, not by dom0")]
    Owner(u16),
    #[error("domain {0} may write the node")]
    Writable(u16),
    #[error("every domain may write the node")]
    WritableByAll,
}

/// Checks that only dom0 can have written a node: dom0 owns it and no other
/// domain has write access. A node a guest created is owned by that guest
/// (xenstored makes an unprivileged creator the owner).
pub fn check_dom0_only(perms: &[Perm]) -> Result<(), NotDom0Only> {
    let owner = perms.first().ok_or(NotDom0Only::Empty)?;
    if owner.domid != 0 {
        return Err(NotDom0Only::Owner(owner.domid));
    }
    if owner.access.can_write() {
        return Err(NotDom0Only::WritableByAll);
    }
    match perms[1..]
        .iter()
        .find(|p| p.domid != 0 && p.access.can_write())
    {
        Some(p) => Err(NotDom0Only::Writable(p.domid)),
        None => Ok(()),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(16) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_round_trip_and_reject_garbage() {
        for s in ["n0", "r5", "w65535", "b12"] {
            assert_eq!(Perm::parse(s).unwrap().to_string(), s);
        }
        for s in [
            "", "x1", "r", "r-1", "r65536", "r1a", "rr1", "r 1", "r123456",
        ] {
            assert!(Perm::parse(s).is_err(), "{s:?} accepted");
        }
    }

    #[test]
    fn access_follows_xenstored_rules() {
        let p = [Perm::new(0, Access::None), Perm::new(5, Access::Read)];
        assert_eq!(access_for(&p, 0), Access::Both);
        assert_eq!(access_for(&p, 5), Access::Read);
        assert_eq!(access_for(&p, 6), Access::None);
        let owned = [Perm::new(5, Access::None)];
        assert_eq!(access_for(&owned, 5), Access::Both);
    }

    #[test]
    fn dom0_only_check() {
        let ok = [Perm::new(0, Access::None), Perm::new(5, Access::Read)];
        assert!(check_dom0_only(&ok).is_ok());
        assert_eq!(
            check_dom0_only(&[Perm::new(5, Access::None)]),
            Err(NotDom0Only::Owner(5))
        );
        assert_eq!(
            check_dom0_only(&[Perm::new(0, Access::None), Perm::new(5, Access::Both)]),
            Err(NotDom0Only::Writable(5))
        );
        assert_eq!(
            check_dom0_only(&[Perm::new(0, Access::Write)]),
            Err(NotDom0Only::WritableByAll)
        );
        assert_eq!(check_dom0_only(&[]), Err(NotDom0Only::Empty));
    }
}
