//! Proxy session tokens through XenStore. dom0 knows which guests may open
//! sessions on crane-proxy (it derives one token per guest); crane-proxy, in
//! the proxy domain, checks each Hello against a token file (`TOKEN TENANT`
//! per line, read again at every Hello). dom0 publishes the tokens under the
//! proxy domain's `crane/proxy/tokens/<tenant>` (owned by dom0, readable only
//! by the proxy domain), and the proxy domain turns them into its token file
//! with [`sync_token_file`], at boot and whenever its watch fires.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::error::XsError;
use crate::layout::{PROXY_NOW, PROXY_TOKENS, absolute, proxy_token_key, valid_element};
use crate::message::{validate_proxy, validate_token};
use crate::perms::{Access, Perm};
use crate::store::{XsData, XsPerms};
use crate::value::{Fields, ValueError};

/// Longest token value (`token=...`).
pub const MAX_TOKEN_VALUE: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum ProxyTokensError {
    #[error(transparent)]
    Xs(#[from] XsError),
    #[error("tenant {0:?} is not a valid key (want [A-Za-z0-9_-], 1 to 64 characters)")]
    BadTenant(String),
    #[error("the token of tenant {tenant} is not valid: {source}")]
    BadToken { tenant: String, source: ValueError },
    #[error("cannot write the token file {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
}

fn format_token(token: &str) -> String {
    let mut f = Fields::new();
    f.push("token", token);
    f.format()
}

fn parse_token(tenant: &str, raw: &str) -> Result<String, ProxyTokensError> {
    let bad = |source| ProxyTokensError::BadToken {
        tenant: tenant.to_string(),
        source,
    };
    let mut f = Fields::parse(raw, MAX_TOKEN_VALUE).map_err(bad)?;
    let token = f.required("token").map_err(bad)?;
    f.finish().map_err(bad)?;
    validate_token(&token).map_err(bad)?;
    Ok(token)
}

/// dom0: makes the proxy domain's token list exactly `tokens` (tenant →
/// token): `crane/proxy/tokens` owned by dom0 and readable by the proxy
/// domain, stale tenants removed. Idempotent.
pub fn publish_tokens<S: XsData + XsPerms>(
    store: &S,
    proxy_domid: u16,
    tokens: &BTreeMap<String, String>,
) -> Result<(), ProxyTokensError> {
    for (tenant, token) in tokens {
        if !valid_element(tenant) {
            return Err(ProxyTokensError::BadTenant(tenant.clone()));
        }
        validate_token(token).map_err(|source| ProxyTokensError::BadToken {
            tenant: tenant.clone(),
            source,
        })?;
    }
    let dir = absolute(proxy_domid, PROXY_TOKENS);
    let crane = absolute(proxy_domid, "crane");
    let perms = [
        Perm::new(0, Access::None),
        Perm::new(proxy_domid, Access::Read),
    ];
    // Nothing is written that is already so: craned calls this every tick,
    // and every write (permissions too) fires the proxy domain's watch.
    for node in [&crane, &dir] {
        if store.read(node)?.is_none() {
            store.write(node, "")?;
        }
        if store.get_perms(node)? != perms {
            store.set_perms(node, &perms)?;
        }
    }
    for old in store.directory(&dir)? {
        if !tokens.contains_key(&old) {
            store.rm(&format!("{dir}/{old}"))?;
        }
    }
    for (tenant, token) in tokens {
        let key = absolute(proxy_domid, &proxy_token_key(tenant));
        let value = format_token(token);
        if store.read(&key)?.as_deref() != Some(value.as_str()) {
            store.write(&key, &value)?;
        }
    }
    Ok(())
}

/// The proxy domain: the tokens dom0 published (tenant → token), read
/// strictly; an entry that is not valid is an error naming it.
pub fn read_tokens<S: XsData>(store: &S) -> Result<BTreeMap<String, String>, ProxyTokensError> {
    let mut out = BTreeMap::new();
    for tenant in store.directory(PROXY_TOKENS)? {
        if !valid_element(&tenant) {
            return Err(ProxyTokensError::BadTenant(tenant));
        }
        if let Some(raw) = store.read(&proxy_token_key(&tenant))? {
            let token = parse_token(&tenant, &raw)?;
            out.insert(tenant, token);
        }
    }
    Ok(out)
}

/// The token file crane-proxy reads: `TOKEN TENANT` per line.
pub fn render_token_file(tokens: &BTreeMap<String, String>) -> String {
    let mut s = String::from("# written from XenStore crane/proxy/tokens; do not edit\n");
    for (tenant, token) in tokens {
        s.push_str(&format!("{token} {tenant}\n"));
    }
    s
}

/// The proxy domain: rewrites `path` (mode 0600, replaced atomically) from
/// the published tokens; returns how many there are. Run at boot and on every
/// watch event on `crane/proxy/tokens`.
pub fn sync_token_file<S: XsData>(store: &S, path: &Path) -> Result<usize, ProxyTokensError> {
    let tokens = read_tokens(store)?;
    let file_err = |source| ProxyTokensError::File {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(file_err)?;
        f.write_all(render_token_file(&tokens).as_bytes())
            .map_err(file_err)?;
        f.sync_all().map_err(file_err)?;
    }
    std::fs::rename(&tmp, path).map_err(file_err)?;
    Ok(tokens.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStore;
    use std::time::Duration;

    fn tokens(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn dom0_publishes_and_only_the_proxy_reads() {
        let store = MemStore::new();
        store.introduce(4);
        store.introduce(5);
        let dom0 = store.connect(0);
        publish_tokens(&dom0, 4, &tokens(&[("gpu1", "abc123"), ("gpu2", "def456")])).unwrap();
        let proxy = store.connect(4);
        assert_eq!(
            read_tokens(&proxy).unwrap(),
            tokens(&[("gpu1", "abc123"), ("gpu2", "def456")])
        );
        // Another guest cannot read them, and the proxy cannot change them.
        let other = store.connect(5);
        assert!(
            other
                .read("/local/domain/4/crane/proxy/tokens/gpu1")
                .unwrap_err()
                .is_access_denied()
        );
        assert!(
            proxy
                .write("crane/proxy/tokens/gpu1", "token=mine")
                .unwrap_err()
                .is_access_denied()
        );
        // Republishing drops stale tenants and keeps the rest.
        publish_tokens(&dom0, 4, &tokens(&[("gpu2", "def456")])).unwrap();
        assert_eq!(read_tokens(&proxy).unwrap(), tokens(&[("gpu2", "def456")]));
    }

    #[test]
    fn republishing_the_same_tokens_fires_no_watch() {
        use crate::store::XsWatch;
        let store = MemStore::new();
        store.introduce(4);
        let dom0 = store.connect(0);
        let t = tokens(&[("gpu1", "abc123")]);
        publish_tokens(&dom0, 4, &t).unwrap();
        let proxy = store.connect(4);
        proxy.watch(PROXY_TOKENS, "t").unwrap();
        // A new watch fires once at once.
        assert!(proxy.wait_event(Duration::from_secs(1)).unwrap().is_some());
        while proxy
            .wait_event(Duration::from_millis(50))
            .unwrap()
            .is_some()
        {}
        publish_tokens(&dom0, 4, &t).unwrap();
        assert_eq!(proxy.wait_event(Duration::from_millis(200)).unwrap(), None);
        publish_tokens(&dom0, 4, &tokens(&[("gpu1", "abc124")])).unwrap();
        assert!(proxy.wait_event(Duration::from_secs(1)).unwrap().is_some());
    }

    #[test]
    fn bad_tenants_and_tokens_are_refused_both_ways() {
        let store = MemStore::new();
        store.introduce(4);
        let dom0 = store.connect(0);
        assert!(publish_tokens(&dom0, 4, &tokens(&[("a/b", "x")])).is_err());
        assert!(publish_tokens(&dom0, 4, &tokens(&[("a", "has space")])).is_err());
        dom0.write("/local/domain/4/crane/proxy/tokens/g", "token=ok%20no")
            .unwrap();
        let e = read_tokens(&store.connect(4)).unwrap_err().to_string();
        assert!(e.contains("tenant g"), "{e}");
        assert!(!e.contains("ok no"), "the token must not be quoted: {e}");
    }

    #[test]
    fn the_token_file_is_what_crane_proxy_reads() {
        let store = MemStore::new();
        store.introduce(4);
        publish_tokens(
            &store.connect(0),
            4,
            &tokens(&[("gpu1", "abc123"), ("gpu2", "def456")]),
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("crane-xs-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        assert_eq!(sync_token_file(&store.connect(4), &path).unwrap(), 2);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines, ["abc123 gpu1", "def456 gpu2"]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Longest `crane/proxy-now` value.
pub const MAX_PROXY_NOW: usize = 600;

/// Where a guest's crane-proxy is now (`crane/proxy-now`): dom0 publishes it
/// again, with a new `gen`, whenever it (re)starts the proxy domain and when
/// the proxy answers again; the guest agent then redirects every process
/// that waits for its dead proxy there (`crane_control::Request::Redirect`),
/// which also starts their wait again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyNow {
    /// Changes at every publication (processes are redirected once per gen).
    pub generation: u64,
    /// `tcp://HOST:PORT` or `unix:/PATH`.
    pub proxy: String,
    /// The guest's session token there (none: the one the processes have).
    pub token: Option<String>,
}

impl ProxyNow {
    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("gen", self.generation.to_string())
            .push("proxy", self.proxy.as_str());
        if let Some(t) = &self.token {
            f.push("token", t.as_str());
        }
        f.format()
    }

    pub fn parse(s: &str) -> Result<ProxyNow, ValueError> {
        let mut f = Fields::parse(s, MAX_PROXY_NOW)?;
        let generation = f.required_u64("gen")?;
        let proxy = f.required("proxy")?;
        validate_proxy(&proxy)?;
        let token = f.take("token");
        if let Some(t) = &token {
            validate_token(t)?;
        }
        f.finish()?;
        Ok(ProxyNow {
            generation,
            proxy,
            token,
        })
    }
}

/// dom0: publishes `now` in guest `domid`'s `crane/proxy-now`, owned by dom0
/// and readable by the guest alone.
pub fn publish_proxy_now<S: XsData + XsPerms>(
    store: &S,
    domid: u16,
    now: &ProxyNow,
) -> Result<(), XsError> {
    let key = absolute(domid, PROXY_NOW);
    store.write(&key, &now.format())?;
    store.set_perms(
        &key,
        &[Perm::new(0, Access::None), Perm::new(domid, Access::Read)],
    )
}

/// The guest: where its crane-proxy is now, if dom0 said; a value that does
/// not parse is an error naming why (the token is never shown).
pub fn read_proxy_now<S: XsData>(store: &S) -> Result<Option<ProxyNow>, ValueError> {
    match store.read(PROXY_NOW) {
        Ok(Some(raw)) => ProxyNow::parse(&raw).map(Some),
        Ok(None) | Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod proxy_now_tests {
    use super::*;
    use crate::mem::MemStore;

    #[test]
    fn proxy_now_round_trips_and_rejects_bad_values() {
        let now = ProxyNow {
            generation: 3,
            proxy: "tcp://10.77.0.2:7000".into(),
            token: Some("abc-DEF_1".into()),
        };
        assert_eq!(ProxyNow::parse(&now.format()).unwrap(), now);
        let bare = ProxyNow {
            token: None,
            ..now.clone()
        };
        assert_eq!(ProxyNow::parse(&bare.format()).unwrap(), bare);
        for bad in [
            "proxy=tcp://10.77.0.2:7000",
            "gen=x proxy=tcp://10.77.0.2:7000",
            "gen=1 proxy=http://evil",
            "gen=1 proxy=tcp://h:7000 token=a;b",
            "gen=1 proxy=tcp://h:7000 extra=1",
        ] {
            assert!(ProxyNow::parse(bad).is_err(), "{bad}");
        }
        let e = ProxyNow::parse("gen=1 proxy=tcp://h:7000 token=sec;ret")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("sec;ret"), "the token shows in {e}");
    }

    #[test]
    fn dom0_publishes_it_for_the_guest_alone() {
        let store = MemStore::new();
        let dom0 = store.connect(0);
        let now = ProxyNow {
            generation: 1,
            proxy: "unix:/run/crane/proxy.sock".into(),
            token: None,
        };
        publish_proxy_now(&dom0, 7, &now).unwrap();
        let key = absolute(7, PROXY_NOW);
        assert_eq!(
            dom0.read(&key).unwrap().as_deref(),
            Some(now.format().as_str())
        );
        assert_eq!(
            dom0.get_perms(&key).unwrap(),
            vec![Perm::new(0, Access::None), Perm::new(7, Access::Read)]
        );
        // The guest reads it (relative); another guest may not.
        assert_eq!(read_proxy_now(&store.connect(7)).unwrap(), Some(now));
        assert!(store.connect(8).read(&key).is_err());
    }
}
