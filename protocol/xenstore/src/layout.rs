//! The XenStore key layout, the one place that names crane's keys. Paths here
//! are relative to a domain's home (`/local/domain/<domid>`): the guest agent
//! uses them as they are (xenstored resolves them for the guest, and they stay
//! right when a migration gives the guest a new domid); dom0 makes them
//! absolute with [`absolute`]. docs/xenstore-layout.md has the table.

use crate::error::XsError;

/// The protocol version both sides publish; a side refuses a peer speaking
/// another one.
pub const PROTOCOL_VERSION: u32 = 1;

/// dom0-owned, guest-readable: everything crane keeps for the domain.
pub const CRANE: &str = "crane";
/// dom0-owned: the protocol version dom0 speaks.
pub const PROTOCOL: &str = "crane/protocol";
/// dom0-owned, guest-readable: the one pending request (a single write, so it
/// is read whole).
pub const REQUEST: &str = "crane/request";
/// Guest-owned: everything the agent publishes.
pub const AGENT: &str = "crane/agent";
/// Guest-owned: the protocol version the agent speaks.
pub const AGENT_PROTOCOL: &str = "crane/agent/protocol";
/// Guest-owned: the agent's state and the last sequence number it handled.
pub const AGENT_STATE: &str = "crane/agent/state";
/// Guest-owned: the answer to the latest request, written last (after the
/// per-app results), so a reader that sees it sees the results too.
pub const AGENT_RESPONSE: &str = "crane/agent/response";
/// Guest-owned: one child per interposed process, named by pid.
pub const AGENT_APPS: &str = "crane/agent/apps";

/// In a guest's home; dom0-owned, guest-readable: where the guest's
/// crane-proxy is now (`crate::proxy::ProxyNow`), published again whenever
/// dom0 (re)starts the proxy or it answers again.
pub const PROXY_NOW: &str = "crane/proxy-now";
/// In the proxy domain's home; dom0-owned, readable by the proxy domain: one
/// child per tenant (a managed guest's name) whose value is that tenant's
/// proxy session token (`crate::proxy`).
pub const PROXY_TOKENS: &str = "crane/proxy/tokens";
/// dom0's own tree (absolute; no guest may read it): the dom0 service's
/// migration journal, one child per guest being migrated.
pub const DOM0_MIGRATIONS: &str = "/local/domain/0/crane/migrations";
/// dom0's own tree: migration requests from an administrator or a management
/// stack, one child per guest (`crate::admin`).
pub const DOM0_REQUESTS: &str = "/local/domain/0/crane/requests";
/// dom0's own tree: the dom0 service's answers to those requests.
pub const DOM0_RESULTS: &str = "/local/domain/0/crane/results";

/// Longest request value either side accepts.
pub const MAX_REQUEST_LEN: usize = 1024;
/// Longest response value.
pub const MAX_RESPONSE_LEN: usize = 2048;
/// Longest per-app result value.
pub const MAX_APP_RESULT_LEN: usize = 768;
/// Longest agent state value.
pub const MAX_STATE_LEN: usize = 256;
/// Most per-app results a reader looks at.
pub const MAX_APPS: usize = 4096;
/// Longest error text carried in a value (longer ones are cut).
pub const MAX_ERROR_CHARS: usize = 300;

/// The per-app result key of one process.
pub fn app_key(pid: u32) -> String {
    format!("{AGENT_APPS}/{pid}")
}

/// One tenant's token key in the proxy domain (relative).
pub fn proxy_token_key(tenant: &str) -> String {
    format!("{PROXY_TOKENS}/{tenant}")
}

/// dom0's journal entry of one guest's migration (absolute).
pub fn migration_key(guest: &str) -> String {
    format!("{DOM0_MIGRATIONS}/{guest}")
}

/// Whether a name can be one XenStore path element (guest and tenant names
/// become keys): `[A-Za-z0-9_-]`, 1 to 64 characters.
pub fn valid_element(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A domain's home.
pub fn home(domid: u16) -> String {
    format!("/local/domain/{domid}")
}

/// A layout path made absolute for dom0.
pub fn absolute(domid: u16, relative: &str) -> String {
    format!("{}/{relative}", home(domid))
}

/// Longest absolute path xenstored accepts (XENSTORE_ABS_PATH_MAX).
pub const MAX_PATH_LEN: usize = 3072;

/// Checks a path against xenstore.txt's rules: ASCII alphanumerics and
/// `-/_@`, no doubled or trailing slash, not empty, bounded length.
pub fn validate_path(path: &str) -> Result<(), XsError> {
    let bad = |why: &str| {
        XsError::InvalidArgument(format!(
            "invalid XenStore path {:?}: {why}",
            path.chars().take(64).collect::<String>()
        ))
    };
    if path.is_empty() {
        return Err(bad("empty"));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(bad("too long"));
    }
    if path == "/" {
        return Ok(());
    }
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-/_@".contains(&b))
    {
        return Err(bad("characters outside [A-Za-z0-9-/_@]"));
    }
    if path.contains("//") || path.ends_with('/') {
        return Err(bad("doubled or trailing slash"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(absolute(7, REQUEST), "/local/domain/7/crane/request");
        assert_eq!(app_key(42), "crane/agent/apps/42");
        for ok in ["/", "/local/domain/1", "crane/request", "@releaseDomain"] {
            validate_path(ok).unwrap();
        }
        for bad in ["", "a//b", "a/", "a b", "a\0b", "é"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        assert!(validate_path(&"a".repeat(MAX_PATH_LEN + 1)).is_err());
        assert_eq!(
            migration_key("gpu-1"),
            "/local/domain/0/crane/migrations/gpu-1"
        );
        assert_eq!(
            absolute(3, &proxy_token_key("g")),
            "/local/domain/3/crane/proxy/tokens/g"
        );
        for ok in ["g", "gpu-guest_2", &"a".repeat(64)] {
            assert!(valid_element(ok), "{ok}");
        }
        for bad in ["", "a/b", "a.b", "a b", "@x", &"a".repeat(65)] {
            assert!(!valid_element(bad), "{bad}");
        }
    }
}
