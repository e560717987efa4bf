//! Processes waiting for a dead crane-proxy, told where it is now.
//!
//! dom0 publishes `crane/proxy-now` ([`ProxyNow`]) whenever it (re)starts
//! the proxy domain and when the proxy answers again, each time with a new
//! generation. At every new generation the agent sends each interposed
//! process a `Redirect` (answered at once): a process waiting for its dead
//! proxy replays its session there and waits again from now (a proxy domain
//! may take longer to boot than a process waits by default); one on a
//! connection that still looks alive keeps the address for a recovery and
//! leaves the connection if TCP sees its peer gone (a destroyed proxy
//! domain closes nothing: without this, the process would notice only after
//! its TCP timeout); the others (not on crane-proxy) refuse, and nothing
//! happens to them.
//!
//! It runs on a thread and a XenStore connection of its own, not in the
//! request loop: a prepare-resume whose processes wait for that very proxy
//! (their move back reads what the proxy changed) holds the request loop
//! until they are done.

use std::path::PathBuf;
use std::time::Duration;

use crane_control::{Request, list_pids};
use crane_xs::XenStore;
use crane_xs::error::XsError;
use crane_xs::layout::PROXY_NOW;
use crane_xs::message::AppOutcome;
use crane_xs::proxy::{ProxyNow, read_proxy_now};

use crate::apps::send_all;

pub const WATCH_TOKEN: &str = "crane-agent-proxy-now";
/// Look again this often even without an event.
const POLL: Duration = Duration::from_secs(30);
/// How long one process may take to answer a redirect (it answers at once,
/// before any request it is busy with).
const ANSWER: Duration = Duration::from_secs(5);

/// What one generation did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Redirected {
    pub generation: u64,
    /// Processes on crane-proxy that took the address (those waiting
    /// replay there now; the others keep it for a recovery).
    pub redirected: usize,
    /// Processes not on crane-proxy, or that did not answer.
    pub others: usize,
}

pub struct Watcher<'s, S> {
    store: &'s S,
    run_dir: PathBuf,
    last: Option<u64>,
}

impl<'s, S: XenStore> Watcher<'s, S> {
    pub fn new(store: &'s S, run_dir: PathBuf) -> Self {
        Watcher {
            store,
            run_dir,
            last: None,
        }
    }

    /// One look at `crane/proxy-now`: a new generation redirects every
    /// process (see the module's text); None when there is nothing new.
    pub fn step(&mut self) -> Option<Redirected> {
        let now = match read_proxy_now(self.store) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(e) => {
                if self.last.is_some() {
                    log::warn!("crane/proxy-now: {e}");
                }
                return None;
            }
        };
        if self.last == Some(now.generation) {
            return None;
        }
        self.last = Some(now.generation);
        Some(self.redirect_all(&now))
    }

    fn redirect_all(&self, now: &ProxyNow) -> Redirected {
        let req = Request::Redirect {
            proxy: now.proxy.clone(),
            token: now.token.clone(),
        };
        let pids = list_pids(&self.run_dir);
        let reports = send_all(&self.run_dir, &pids, |_| Some(req.clone()), ANSWER);
        let redirected = reports
            .iter()
            .filter(|r| r.outcome == AppOutcome::Remote)
            .count();
        let out = Redirected {
            generation: now.generation,
            redirected,
            others: reports.len() - redirected,
        };
        if redirected > 0 {
            log::warn!(
                "crane-proxy is now at {} (generation {}): {redirected} process(es) on crane-proxy redirected there",
                now.proxy,
                now.generation
            );
        } else {
            log::info!(
                "crane-proxy is now at {} (generation {}): no process on crane-proxy",
                now.proxy,
                now.generation
            );
        }
        out
    }

    /// Runs until XenStore fails.
    pub fn run(&mut self) -> Result<(), XsError> {
        self.store.watch(PROXY_NOW, WATCH_TOKEN)?;
        loop {
            self.step();
            self.store.wait_event(POLL)?;
        }
    }
}

/// Starts a [`Watcher`] on a thread of its own with its own connection
/// (`connect`); a failure is logged, the agent goes on without it.
pub fn spawn<S: XenStore + 'static>(
    connect: impl FnOnce() -> Result<S, XsError> + Send + 'static,
    run_dir: PathBuf,
) {
    let started =
        std::thread::Builder::new()
            .name("proxy-now".into())
            .spawn(move || match connect() {
                Ok(store) => {
                    if let Err(e) = Watcher::new(&store, run_dir).run() {
                        log::warn!("watching crane/proxy-now stopped: {e}");
                    }
                }
                Err(e) => log::warn!("cannot watch crane/proxy-now: {e}"),
            });
    if let Err(e) = started {
        log::warn!("cannot start the crane/proxy-now watcher: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::fake::{Behaviour, spawn as spawn_app};
    use crane_control::Mode;
    use crane_xs::layout::absolute;
    use crane_xs::mem::MemStore;
    use crane_xs::proxy::publish_proxy_now;

    const DOMID: u16 = 7;

    #[test]
    fn each_new_generation_redirects_the_waiting_processes_once() {
        let run =
            std::env::temp_dir().join(format!("crane-agent-proxy-now-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        // pid 1 and this test's own: live processes.
        let waiting = spawn_app(&run, 1, Behaviour::Obedient);
        *waiting.mode.lock().unwrap() = Mode::Remote;
        let local = spawn_app(&run, std::process::id(), Behaviour::Obedient);
        let store = MemStore::new();
        let dom0 = store.connect(0);
        let guest = store.connect(DOMID);
        let mut w = Watcher::new(&guest, run.clone());
        assert_eq!(w.step(), None, "nothing published yet");
        let now = ProxyNow {
            generation: 1,
            proxy: "tcp://10.77.0.9:7000".into(),
            token: Some("t0k".into()),
        };
        publish_proxy_now(&dom0, DOMID, &now).unwrap();
        assert_eq!(
            w.step(),
            Some(Redirected {
                generation: 1,
                redirected: 1,
                others: 1
            })
        );
        assert_eq!(*waiting.redirects.lock().unwrap(), vec![now.proxy.clone()]);
        assert!(local.redirects.lock().unwrap().is_empty());
        // The same generation again (a watch firing twice): nothing.
        assert_eq!(w.step(), None);
        // A new one (the proxy restarted at the same address): again.
        let again = ProxyNow {
            generation: 2,
            ..now.clone()
        };
        publish_proxy_now(&dom0, DOMID, &again).unwrap();
        assert_eq!(w.step().map(|r| r.redirected), Some(1));
        assert_eq!(waiting.redirects.lock().unwrap().len(), 2);
        // A value that does not parse changes nothing.
        crane_xs::XsData::write(&dom0, &absolute(DOMID, PROXY_NOW), "gen=3 proxy=ftp://x").unwrap();
        assert_eq!(w.step(), None);
        assert_eq!(waiting.redirects.lock().unwrap().len(), 2);
        let _ = std::fs::remove_dir_all(&run);
    }
}
