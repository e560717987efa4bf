//! The proxy domain's token file, kept in sync with XenStore
//! (`--tokens-from-xenstore`). dom0's craned publishes one token per guest
//! under this domain's `crane/proxy/tokens/<guest>` (owned by dom0, readable
//! only by this domain; docs/xenstore-layout.md); crane-proxy reads its token
//! file again at every Hello, so rewriting the file whenever the watch fires
//! is all it takes for a new guest to be let in and a removed one kept out.
//!
//! A published entry that does not parse leaves the previous file in place
//! (logged): a half-written update never locks every guest out.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crane_xs::layout::PROXY_TOKENS;
use crane_xs::proxy::sync_token_file;
use crane_xs::store::{XsData, XsWatch};
use crane_xs::system::SystemStore;

const WATCH_TOKEN: &str = "crane-proxy-tokens";
/// A watch event is only "look again"; a periodic look covers a lost one.
const RESYNC: Duration = Duration::from_secs(30);

/// Syncs once, then on every watch event on `crane/proxy/tokens` (and every
/// [`RESYNC`]) until the store fails or `synced` returns false. Calls
/// `synced` after each attempt with the number of tokens written or the error.
pub fn follow<S: XsData + XsWatch>(
    store: &S,
    path: &Path,
    mut synced: impl FnMut(Result<usize, String>) -> bool,
) -> Result<(), crane_xs::error::XsError> {
    store.watch(PROXY_TOKENS, WATCH_TOKEN)?;
    loop {
        if !synced(sync_token_file(store, path).map_err(|e| e.to_string())) {
            return Ok(());
        }
        // Several events in a row (dom0 writes a few keys) need one sync.
        let mut event = store.wait_event(RESYNC)?;
        while event.is_some() {
            event = store.wait_event(Duration::from_millis(20))?;
        }
    }
}

/// Whether the file's contents differ from `last` (then remembered).
fn changed(path: &Path, last: &mut Option<Vec<u8>>) -> bool {
    let now = std::fs::read(path).ok();
    let changed = now != *last;
    *last = now;
    changed
}

/// Starts the thread that keeps `path` in sync with this domain's XenStore.
/// Returns once the first sync has been done (so the first Hello already
/// sees the published tokens), or with the reason XenStore cannot be used.
pub fn start(path: PathBuf) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel::<Result<usize, String>>();
    thread::Builder::new()
        .name("xs-tokens".into())
        .spawn(move || {
            let mut first = Some(tx);
            let mut last = std::fs::read(&path).ok();
            let mut delay = Duration::from_millis(500);
            loop {
                let result = SystemStore::open().and_then(|store| {
                    follow(&store, &path, |r| {
                        match (&r, first.is_some()) {
                            (Ok(n), true) => {
                                changed(&path, &mut last);
                                log::info!("token file {}: {n} token(s)", path.display())
                            }
                            (Ok(n), false) if changed(&path, &mut last) => log::info!(
                                "tokens changed in XenStore: {} now holds {n}",
                                path.display()
                            ),
                            (Ok(_), false) => {}
                            (Err(e), _) => log::error!(
                                "tokens in XenStore not usable, {} kept as it was: {e}",
                                path.display()
                            ),
                        }
                        if let Some(tx) = first.take() {
                            let _ = tx.send(r);
                        }
                        true
                    })
                });
                if let Err(e) = result {
                    if let Some(tx) = first.take() {
                        let _ = tx.send(Err(format!("XenStore: {e}")));
                        return;
                    }
                    log::error!("XenStore watch on {PROXY_TOKENS} failed, reconnecting: {e}");
                    thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        })?;
    match rx.recv() {
        Ok(Ok(_)) => Ok(()),
        // Malformed entries are logged; the proxy still serves (with an
        // empty or the previous file) and picks up a fixed publication.
        Ok(Err(e)) if !e.starts_with("XenStore: ") => Ok(()),
        Ok(Err(e)) => anyhow::bail!("--tokens-from-xenstore: {e}"),
        Err(_) => anyhow::bail!("--tokens-from-xenstore: the sync thread ended"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crane_xs::mem::MemStore;
    use crane_xs::proxy::publish_tokens;
    use std::collections::BTreeMap;

    #[test]
    fn follows_what_dom0_publishes() {
        let store = MemStore::new();
        store.introduce(4);
        let dom0 = store.connect(0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let (tx, rx) = mpsc::channel();
        let proxy = store.connect(4);
        let p = path.clone();
        let t = thread::spawn(move || {
            let _ = follow(&proxy, &p, |r| {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                tx.send((r, text)).is_ok()
            });
        });
        let (r, text) = rx.recv().unwrap();
        assert_eq!(r, Ok(0));
        assert!(text.lines().all(|l| l.starts_with('#')), "{text}");

        let mut tokens = BTreeMap::new();
        tokens.insert("gpuguest".to_string(), "0123456789abcdef".to_string());
        publish_tokens(&dom0, 4, &tokens).unwrap();
        let text = loop {
            let (r, text) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            if r == Ok(1) {
                break text;
            }
        };
        assert!(text.contains("0123456789abcdef gpuguest\n"), "{text}");

        // A malformed entry keeps the previous file.
        dom0.write("/local/domain/4/crane/proxy/tokens/evil", "token=")
            .unwrap();
        let (r, text) = loop {
            let (r, text) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            if r.is_err() {
                break (r, text);
            }
        };
        assert!(r.unwrap_err().contains("evil"));
        assert!(text.contains("0123456789abcdef gpuguest\n"), "{text}");

        // Removing the guest's token locks it out.
        tokens.clear();
        publish_tokens(&dom0, 4, &tokens).unwrap();
        loop {
            let (r, text) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            if r == Ok(0) {
                assert!(!text.contains("gpuguest"), "{text}");
                break;
            }
        }
        drop(rx);
        // The follower ends at its next sync.
        dom0.write("/local/domain/4/crane/proxy/tokens/x", "")
            .unwrap();
        t.join().unwrap();
    }
}
