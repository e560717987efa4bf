//! The proxy domain: craned keeps it running (created from its xl
//! configuration when absent, recreated when it dies or stops answering),
//! gives it its own GPU, and publishes the managed guests' session tokens to
//! it. When it creates the proxy domain again, and when crane-proxy answers
//! again, it tells the managed guests where their proxy is
//! (`crane/proxy-now`), so that their processes waiting for it go there and
//! wait for it to boot. One [`ProxySupervisor::tick`] per supervision period.

use std::collections::BTreeMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crane_libxl::{DomainState, Xl};
use crane_xs::XenStore;
use crane_xs::proxy::{ProxyNow, publish_proxy_now, publish_tokens};
use craned_control::ProxyStatus;

use crate::config::Config;
use crate::tokens;

/// Checks that crane-proxy answers at `address`.
pub type HealthCheck = dyn Fn(&str, Duration) -> Result<(), String> + Send + Sync;

/// Connects to `tcp://HOST:PORT` (or `unix:/PATH`): the proxy listens.
pub fn connect_check(address: &str, timeout: Duration) -> Result<(), String> {
    if let Some(path) = address.strip_prefix("unix:") {
        return std::os::unix::net::UnixStream::connect(path)
            .map(drop)
            .map_err(|e| format!("cannot connect to {address}: {e}"));
    }
    let hostport = address
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("{address} is not tcp://HOST:PORT"))?;
    let addrs: Vec<_> = hostport
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {hostport}: {e}"))?
        .collect();
    let mut last = format!("{hostport} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("cannot connect to {a}: {e}"),
        }
    }
    Err(last)
}

pub struct ProxySupervisor {
    status: ProxyStatus,
    failures: u32,
    started: Option<Instant>,
    check: Arc<HealthCheck>,
    /// The status as of the last tick, for `crane status` while a tick runs
    /// on the supervisor's own thread.
    published: Arc<Mutex<ProxyStatus>>,
    /// The last generation of `crane/proxy-now` published to the guests,
    /// and when.
    told: u64,
    told_at: Option<Instant>,
    /// The proxy domain created paused, waiting for its GPU: it is let run
    /// only once the GPU is attached, so that its kernel finds the device
    /// when it boots (a device hot-plugged while a PV kernel boots can be
    /// missed by pcifront).
    held: Option<u32>,
}

impl ProxySupervisor {
    pub fn new(cfg: &Config, check: Box<HealthCheck>) -> ProxySupervisor {
        let status = ProxyStatus {
            address: cfg.proxy.address.clone(),
            domain: (!cfg.proxy.domain.is_empty()).then(|| cfg.proxy.domain.clone()),
            domid: None,
            healthy: false,
            last_error: None,
            restarts: 0,
        };
        ProxySupervisor {
            published: Arc::new(Mutex::new(status.clone())),
            status,
            failures: 0,
            started: None,
            check: Arc::from(check),
            told: 0,
            told_at: None,
            held: None,
        }
    }

    /// Tells every managed guest where its crane-proxy is now
    /// (`crane/proxy-now`, a new generation): its agent redirects the
    /// processes waiting for a dead proxy there, and they wait again from
    /// then (docs/reliability.md). Done when the proxy domain is created
    /// again, so that they wait for it to boot, and when the proxy answers
    /// again. A generation is the time in ms (later than any before), so
    /// that a restarted craned never repeats one.
    fn tell_guests<S: XenStore, X: Xl>(
        &mut self,
        store: &S,
        xl: &X,
        cfg: &Config,
        secret: Option<&[u8]>,
        why: &str,
    ) {
        if cfg.proxy.address.is_empty() {
            return;
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.told = ms.max(self.told + 1);
        self.told_at = Some(Instant::now());
        let mut told = 0;
        for g in &cfg.guests {
            let Ok(Some(domid)) = xl.domid(g) else {
                continue;
            };
            let now = ProxyNow {
                generation: self.told,
                proxy: cfg.proxy.address.clone(),
                token: secret.map(|s| tokens::derive(s, g, cfg.tokens.epoch)),
            };
            match publish_proxy_now(store, u16::try_from(domid).unwrap_or(u16::MAX), &now) {
                Ok(()) => told += 1,
                Err(e) => log::warn!("proxy: cannot tell guest {g} where its proxy is: {e}"),
            }
        }
        log::info!(
            "proxy: {why}; told {told} guest(s) it is at {} (generation {})",
            cfg.proxy.address,
            self.told
        );
    }

    pub fn status(&self) -> &ProxyStatus {
        &self.status
    }

    /// The health check, for a check on demand (before a remote move).
    pub fn checker(&self) -> Arc<HealthCheck> {
        self.check.clone()
    }

    /// The status each tick publishes, readable while the next one runs.
    pub fn published(&self) -> Arc<Mutex<ProxyStatus>> {
        self.published.clone()
    }

    fn error(&mut self, e: String) {
        if self.status.last_error.as_deref() != Some(e.as_str()) {
            log::warn!("proxy: {e}");
        }
        self.status.last_error = Some(e);
    }

    /// The tokens of every managed guest, for the proxy domain.
    pub fn token_map(cfg: &Config, secret: &[u8]) -> BTreeMap<String, String> {
        cfg.guests
            .iter()
            .map(|g| (g.clone(), tokens::derive(secret, g, cfg.tokens.epoch)))
            .collect()
    }

    fn start<X: Xl>(&mut self, xl: &X, cfg: &Config) -> Option<u32> {
        if let Some(gpu) = cfg.proxy.gpu
            && let Err(e) = xl.pci_assignable_add(gpu, false)
        {
            self.error(format!("cannot make its GPU {gpu} assignable: {e}"));
        }
        log::info!(
            "proxy: creating domain {} from {}",
            cfg.proxy.domain,
            cfg.proxy.config.display()
        );
        if self.started.is_some() {
            self.status.restarts += 1;
        }
        self.started = Some(Instant::now());
        self.failures = 0;
        // With a GPU to give it, created paused: the GPU may still be held
        // by the domain just destroyed (pciback releases it a moment later,
        // and libxl answers "not assignable" until then); `supervise`
        // attaches it, retrying on each tick, then lets the domain run.
        let paused = cfg.proxy.gpu.is_some();
        if let Err(e) = xl.create(&cfg.proxy.config, paused) {
            self.error(e.to_string());
            return None;
        }
        match xl.domid(&cfg.proxy.domain) {
            Ok(Some(d)) => {
                self.held = paused.then_some(d);
                Some(d)
            }
            Ok(None) => {
                self.error(format!(
                    "xl create {} made no domain named {}",
                    cfg.proxy.config.display(),
                    cfg.proxy.domain
                ));
                None
            }
            Err(e) => {
                self.error(e.to_string());
                None
            }
        }
    }

    /// Makes sure the proxy domain runs (creating it if needed), has its
    /// GPU and the current tokens, and answers; recreates it after
    /// `failures_before_restart` failed checks outside the boot grace.
    pub fn tick<S: XenStore, X: Xl>(
        &mut self,
        store: &S,
        xl: &X,
        cfg: &Config,
        secret: Option<&[u8]>,
    ) {
        // Created again, or answering again: the guests are told.
        let restarts = self.status.restarts;
        let was_healthy = self.status.healthy;
        self.supervise(store, xl, cfg, secret);
        if self.status.restarts > restarts {
            self.tell_guests(store, xl, cfg, secret, "the proxy domain was created again");
        } else if self.status.healthy && !was_healthy {
            self.tell_guests(store, xl, cfg, secret, "crane-proxy answers");
        } else if !self.status.healthy
            && self.status.restarts > 0
            && self
                .told_at
                .is_some_and(|t| t.elapsed() >= Duration::from_millis(cfg.proxy.retell_ms))
        {
            // Booting still: the processes waiting for it wait anew.
            self.tell_guests(store, xl, cfg, secret, "the proxy domain is still starting");
        }
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = self.status.clone();
    }

    /// [`tick`](Self::tick) without telling the guests.
    fn supervise<S: XenStore, X: Xl>(
        &mut self,
        store: &S,
        xl: &X,
        cfg: &Config,
        secret: Option<&[u8]>,
    ) {
        if !cfg.proxy.domain.is_empty() {
            let Some(domid) = self.ensure_running(xl, cfg) else {
                self.status.domid = None;
                self.status.healthy = false;
                return;
            };
            self.status.domid = Some(domid);
            if self.held.is_some_and(|h| h != domid) {
                self.held = None;
            }
            if let Some(gpu) = cfg.proxy.gpu {
                let has_gpu = match xl.pci_list(domid) {
                    Ok(l) if l.contains(&gpu) => true,
                    Ok(_) => {
                        let r = xl
                            .pci_assignable_add(gpu, false)
                            .and_then(|()| xl.pci_attach(domid, gpu));
                        match r {
                            Ok(()) => {
                                log::info!("proxy: GPU {gpu} attached");
                                true
                            }
                            Err(e) => {
                                let e = format!("cannot attach its GPU {gpu}: {e}");
                                match self.held {
                                    Some(_) => self.error(format!("{e} (kept paused; retrying)")),
                                    None => self.error(e),
                                }
                                false
                            }
                        }
                    }
                    Err(e) => {
                        self.error(e.to_string());
                        false
                    }
                };
                if has_gpu && self.held == Some(domid) {
                    match xl.unpause(domid) {
                        Ok(()) => {
                            log::info!("proxy: domain {} (id {domid}) runs", cfg.proxy.domain);
                            self.held = None;
                        }
                        Err(e) => self.error(format!("cannot unpause the proxy domain: {e}")),
                    }
                }
            }
            if let Some(secret) = secret {
                let map = Self::token_map(cfg, secret);
                let proxy = u16::try_from(domid).unwrap_or(u16::MAX);
                if let Err(e) = publish_tokens(store, proxy, &map) {
                    self.error(format!("cannot publish the guests' tokens: {e}"));
                }
            }
        }
        if cfg.proxy.address.is_empty() {
            return;
        }
        match (self.check)(
            &cfg.proxy.address,
            Duration::from_millis(cfg.proxy.health_timeout_ms),
        ) {
            Ok(()) => {
                if !self.status.healthy {
                    log::info!("proxy: crane-proxy answers at {}", cfg.proxy.address);
                }
                self.status.healthy = true;
                self.status.last_error = None;
                self.failures = 0;
            }
            Err(e) => {
                self.status.healthy = false;
                let booting = self
                    .started
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(cfg.proxy.boot_grace_ms));
                if booting {
                    self.status.last_error = Some(format!("booting: {e}"));
                    return;
                }
                self.failures += 1;
                self.error(format!("health check {} failed: {e}", self.failures));
                if !cfg.proxy.domain.is_empty()
                    && self.failures >= cfg.proxy.failures_before_restart
                    && let Some(domid) = self.status.domid
                {
                    log::warn!(
                        "proxy: no answer {} times in a row; recreating domain {}",
                        self.failures,
                        cfg.proxy.domain
                    );
                    if let Err(e) = xl.destroy(domid) {
                        self.error(format!("cannot destroy the unresponsive proxy: {e}"));
                        return;
                    }
                    self.status.domid = self.start(xl, cfg);
                }
            }
        }
    }

    fn ensure_running<X: Xl>(&mut self, xl: &X, cfg: &Config) -> Option<u32> {
        let domid = match xl.domid(&cfg.proxy.domain) {
            Ok(d) => d,
            Err(e) => {
                self.error(e.to_string());
                return None;
            }
        };
        let Some(domid) = domid else {
            if self.started.is_some() {
                log::warn!("proxy: domain {} is gone", cfg.proxy.domain);
            }
            return self.start(xl, cfg);
        };
        match xl.domain_info(domid) {
            Ok(Some(i)) if i.state.is_alive() => {
                if self.started.is_none() {
                    // Running before craned started: no boot grace.
                    self.started =
                        Some(Instant::now() - Duration::from_millis(cfg.proxy.boot_grace_ms));
                    if i.state == DomainState::Paused && cfg.proxy.gpu.is_some() {
                        // Left paused by a craned stopped before it gave the
                        // domain its GPU: given it and let run now.
                        self.started = Some(Instant::now());
                        self.held = Some(domid);
                    }
                }
                Some(domid)
            }
            Ok(_) => {
                log::warn!(
                    "proxy: domain {} (id {domid}) has shut down; recreating it",
                    cfg.proxy.domain
                );
                if let Err(e) = xl.destroy(domid) {
                    self.error(format!("cannot destroy the dead proxy: {e}"));
                    return None;
                }
                self.start(xl, cfg)
            }
            Err(e) => {
                self.error(e.to_string());
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeXl, gpu};
    use crane_libxl::DomainState;
    use crane_xs::mem::MemStore;
    use std::sync::{Arc, Mutex};

    const SECRET: &[u8] = b"0123456789abcdef-shared";

    fn config() -> Config {
        let mut cfg = Config {
            guests: vec!["g1".into()],
            ..Config::default()
        };
        cfg.proxy.address = "tcp://10.77.0.2:7000".into();
        cfg.proxy.domain = "proxy".into();
        cfg.proxy.gpu = Some(gpu("0000:00:07.0"));
        cfg.proxy.boot_grace_ms = 0;
        cfg.proxy.failures_before_restart = 2;
        cfg
    }

    /// A health check whose answer the test sets.
    fn switch() -> (Arc<Mutex<bool>>, Box<HealthCheck>) {
        let up = Arc::new(Mutex::new(true));
        let u = up.clone();
        (
            up,
            Box::new(move |_: &str, _| {
                if *u.lock().unwrap() {
                    Ok(())
                } else {
                    Err("connection refused".into())
                }
            }),
        )
    }

    #[test]
    fn creates_the_proxy_gives_it_its_gpu_and_tokens() {
        let cfg = config();
        let store = MemStore::new();
        let dom0 = store.connect(0);
        let xl = FakeXl::default();
        xl.create_makes("proxy");
        let (_up, check) = switch();
        let mut sup = ProxySupervisor::new(&cfg, check);
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        assert_eq!(xl.created(), std::slice::from_ref(&cfg.proxy.config));
        let domid = xl.domid("proxy").unwrap().unwrap();
        assert_eq!(xl.gpus_of(domid), [gpu("0000:00:07.0")]);
        store.introduce(domid as u16);
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        let tokens = crane_xs::proxy::read_tokens(&store.connect(domid as u16)).unwrap();
        assert_eq!(tokens["g1"], tokens::derive(SECRET, "g1", 1));
        assert!(sup.status().healthy);
        assert_eq!(sup.status().domid, Some(domid));
        // Running and healthy: nothing is created again.
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        assert_eq!(xl.created().len(), 1);
        assert_eq!(sup.status().restarts, 0);
    }

    fn state(xl: &FakeXl, domid: u32) -> DomainState {
        xl.domain_info(domid).unwrap().unwrap().state
    }

    #[test]
    fn the_proxy_domain_runs_only_once_it_has_its_gpu() {
        // Right after the old proxy domain is destroyed its GPU may not be
        // assignable yet: the new domain waits, paused, until the GPU is
        // attached (a PV kernel booting meanwhile would not see it).
        let mut cfg = config();
        cfg.proxy.boot_grace_ms = 60_000;
        let store = MemStore::new();
        let dom0 = store.connect(0);
        let xl = FakeXl::default();
        xl.create_makes("proxy");
        xl.fail_attach(true);
        let (up, check) = switch();
        *up.lock().unwrap() = false;
        let mut sup = ProxySupervisor::new(&cfg, check);
        for _ in 0..3 {
            sup.tick(&dom0, &xl, &cfg, None);
        }
        let domid = xl.domid("proxy").unwrap().unwrap();
        assert_eq!(xl.created().len(), 1, "waiting is not a reason to recreate");
        assert_eq!(state(&xl, domid), DomainState::Paused);
        assert!(xl.gpus_of(domid).is_empty());
        let e = sup.status().last_error.clone().unwrap();
        assert!(e.starts_with("booting"), "{e}");
        // The GPU is free now: attached, then the domain runs.
        xl.fail_attach(false);
        sup.tick(&dom0, &xl, &cfg, None);
        assert_eq!(xl.gpus_of(domid), [gpu("0000:00:07.0")]);
        assert_eq!(state(&xl, domid), DomainState::Running);
        *up.lock().unwrap() = true;
        sup.tick(&dom0, &xl, &cfg, None);
        assert!(sup.status().healthy);
        assert_eq!(xl.created().len(), 1);
    }

    #[test]
    fn without_a_gpu_to_give_the_proxy_domain_starts_at_once() {
        let mut cfg = config();
        cfg.proxy.gpu = None;
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.create_makes("proxy");
        let (_up, check) = switch();
        let mut sup = ProxySupervisor::new(&cfg, check);
        sup.tick(&store.connect(0), &xl, &cfg, None);
        let domid = xl.domid("proxy").unwrap().unwrap();
        assert_eq!(state(&xl, domid), DomainState::Running);
    }

    #[test]
    fn a_proxy_domain_left_paused_is_given_its_gpu_and_let_run() {
        // craned stopped between creating the domain paused and letting it
        // run: the next craned finishes the job.
        let cfg = config();
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.add_domain("proxy", 6, &[]);
        xl.set_state(6, DomainState::Paused);
        let (_up, check) = switch();
        let mut sup = ProxySupervisor::new(&cfg, check);
        sup.tick(&store.connect(0), &xl, &cfg, None);
        assert_eq!(xl.gpus_of(6), [gpu("0000:00:07.0")]);
        assert_eq!(state(&xl, 6), DomainState::Running);
        assert!(xl.created().is_empty());
    }

    #[test]
    fn restarts_a_dead_or_silent_proxy() {
        let cfg = config();
        let store = MemStore::new();
        let dom0 = store.connect(0);
        let xl = FakeXl::default();
        xl.add_domain("proxy", 4, &[gpu("0000:00:07.0")]);
        xl.create_makes("proxy");
        let (up, check) = switch();
        let mut sup = ProxySupervisor::new(&cfg, check);
        sup.tick(&dom0, &xl, &cfg, None);
        assert!(xl.created().is_empty(), "it was running already");
        // It crashed: destroyed and created again.
        xl.set_state(4, DomainState::Shutdown);
        sup.tick(&dom0, &xl, &cfg, None);
        assert_eq!(xl.destroyed(), [4]);
        assert_eq!(xl.created().len(), 1);
        assert_eq!(sup.status().restarts, 1);
        // crane-proxy stops answering: after two failed checks, recreated.
        *up.lock().unwrap() = false;
        sup.tick(&dom0, &xl, &cfg, None);
        assert_eq!(xl.created().len(), 1);
        assert!(!sup.status().healthy);
        assert!(
            sup.status()
                .last_error
                .as_deref()
                .unwrap()
                .contains("connection refused"),
            "{:?}",
            sup.status()
        );
        sup.tick(&dom0, &xl, &cfg, None);
        assert_eq!(xl.created().len(), 2);
        assert_eq!(sup.status().restarts, 2);
        *up.lock().unwrap() = true;
        sup.tick(&dom0, &xl, &cfg, None);
        assert!(sup.status().healthy);
    }

    /// The guest's crane/proxy-now, as its agent reads it.
    fn proxy_now(store: &MemStore, domid: u16) -> Option<ProxyNow> {
        crane_xs::proxy::read_proxy_now(&store.connect(domid)).unwrap()
    }

    #[test]
    fn guests_are_told_where_the_proxy_is_when_it_comes_back() {
        let mut cfg = config();
        cfg.proxy.retell_ms = 0;
        let store = MemStore::new();
        store.introduce(9);
        let dom0 = store.connect(0);
        let xl = FakeXl::default();
        xl.add_domain("proxy", 4, &[gpu("0000:00:07.0")]);
        xl.add_domain("g1", 9, &[]);
        xl.create_makes("proxy");
        let (up, check) = switch();
        let mut sup = ProxySupervisor::new(&cfg, check);
        // First seen answering: told once, with the guest's token.
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        let first = proxy_now(&store, 9).expect("told");
        assert_eq!(first.proxy, cfg.proxy.address);
        assert_eq!(first.token, Some(tokens::derive(SECRET, "g1", 1)));
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        assert_eq!(proxy_now(&store, 9), Some(first.clone()), "nothing new");
        // It stops answering and is created again: told at once (its
        // processes wait for it to boot), and again once it answers.
        *up.lock().unwrap() = false;
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        assert_eq!(
            proxy_now(&store, 9),
            Some(first.clone()),
            "one failed check"
        );
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        assert_eq!(sup.status().restarts, 1);
        let recreated = proxy_now(&store, 9).unwrap();
        assert!(recreated.generation > first.generation);
        // Booting for longer than the processes wait: told again every
        // `retell_ms` (0 here: every tick) until it answers.
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        let booting = proxy_now(&store, 9).unwrap();
        assert!(booting.generation > recreated.generation);
        let recreated = booting;
        *up.lock().unwrap() = true;
        sup.tick(&dom0, &xl, &cfg, Some(SECRET));
        let answers = proxy_now(&store, 9).unwrap();
        assert!(answers.generation > recreated.generation);
        assert_eq!(answers.proxy, cfg.proxy.address);
    }

    #[test]
    fn the_boot_grace_keeps_a_booting_proxy() {
        let mut cfg = config();
        cfg.proxy.boot_grace_ms = 60_000;
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.create_makes("proxy");
        let (up, check) = switch();
        *up.lock().unwrap() = false;
        let mut sup = ProxySupervisor::new(&cfg, check);
        for _ in 0..5 {
            sup.tick(&store.connect(0), &xl, &cfg, None);
        }
        assert_eq!(xl.created().len(), 1);
        assert!(
            sup.status()
                .last_error
                .as_deref()
                .unwrap()
                .starts_with("booting")
        );
    }

    #[test]
    fn the_connect_check_tells_listening_from_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let addr = format!("tcp://127.0.0.1:{port}");
        connect_check(&addr, Duration::from_secs(1)).unwrap();
        drop(l);
        let e = connect_check(&addr, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("cannot connect"), "{e}");
        assert!(connect_check("http://x", Duration::from_secs(1)).is_err());
    }
}
