//! The state behind craned's control socket: the configuration, XenStore,
//! the toolstack, the token secret and the proxy supervisor, and what each
//! control request does with them (the choreography itself is
//! crate::migrate). The server serialises requests and supervision ticks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use crane_libxl::{PciAddr, Xl};
use crane_xs::XenStore;
use crane_xs::dom0::GuestChannel;
use crane_xs::layout::{PROTOCOL, absolute};
use craned_control::{AppMode, Domain, Done, GpuStatus, GuestStatus, ProxyStatus, Request, Status};

use crate::admin::Job;
use crate::config::Config;
use crate::journal;
use crate::migrate::{Attached, MigrateError, Migration, Recovered};
use crate::proxy::{HealthCheck, ProxySupervisor};
use crate::ratelimit::limited;
use crate::transfer::{Transfers, XlTransfers};

pub struct Service<S, X> {
    pub(crate) cfg: Config,
    pub(crate) store: S,
    pub(crate) xl: X,
    pub(crate) secret: Option<Vec<u8>>,
    /// The proxy supervisor, ticked with the service; None once it runs on
    /// a thread of its own ([`Service::take_proxy`]).
    pub(crate) proxy: Option<ProxySupervisor>,
    /// Its health check, for the check before a remote move.
    proxy_check: Arc<HealthCheck>,
    /// Its status as of its last tick.
    proxy_status: Arc<Mutex<ProxyStatus>>,
    /// Each guest's latest outcomes, newest last, for `crane status`.
    pub(crate) last: BTreeMap<String, VecDeque<String>>,
    /// Runs `xl migrate` for the XenStore trigger.
    pub(crate) transfers: Box<dyn Transfers>,
    /// XenStore-triggered migrations whose transfer is under way.
    pub(crate) jobs: BTreeMap<String, Job>,
    /// Guests that may have arrived while craned was not running, taken at
    /// the first tick, and when ([`crate::migrate::Migration::adopt_waiting`]);
    /// None before the first tick.
    pub(crate) unattended: Option<(std::time::Instant, BTreeMap<String, u32>)>,
}

/// How long after craned starts it waits for the agents of guests without a
/// GPU to say whether they wait for one (`adopt_waiting`).
const ADOPT_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// How many outcomes per guest `crane status` shows.
const RECENT: usize = 5;

/// Whether process `pid` still exists.
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

impl<S: XenStore, X: Xl> Service<S, X> {
    pub fn new(
        cfg: Config,
        store: S,
        xl: X,
        secret: Option<Vec<u8>>,
        check: Box<HealthCheck>,
    ) -> Self {
        let proxy = ProxySupervisor::new(&cfg, check);
        let transfers = Box::new(XlTransfers { xl: cfg.xl.clone() });
        Service {
            proxy_check: proxy.checker(),
            proxy_status: proxy.published(),
            cfg,
            store,
            xl,
            secret,
            proxy: Some(proxy),
            last: BTreeMap::new(),
            transfers,
            jobs: BTreeMap::new(),
            unattended: None,
        }
    }

    /// Takes the proxy supervisor out of the service's ticks, with what it
    /// needs, to tick it on a thread of its own ([`crate::server::serve`]):
    /// the service's ticks wait while a request runs (a migration waiting
    /// minutes for an agent), and the proxy domain must be looked after
    /// meanwhile. `status` and the check before a remote move keep working.
    pub fn take_proxy(&mut self) -> Option<(ProxySupervisor, Config, Option<Vec<u8>>)> {
        let p = self.proxy.take()?;
        Some((p, self.cfg.clone(), self.secret.clone()))
    }

    /// The proxy supervisor's status as each of its ticks leaves it.
    pub fn proxy_status(&self) -> Arc<Mutex<ProxyStatus>> {
        self.proxy_status.clone()
    }

    /// Replaces how XenStore-triggered transfers run (unit tests).
    pub fn set_transfers(&mut self, transfers: Box<dyn Transfers>) {
        self.transfers = transfers;
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The choreography over this service's XenStore, toolstack and secret,
    /// reporting to `progress`; with `proxy_check`, remote moves first check
    /// that crane-proxy answers.
    pub(crate) fn migration<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(&str, Option<String>),
        proxy_check: bool,
    ) -> Migration<'a, S, X> {
        let m = Migration::new(
            &self.store,
            &self.xl,
            &self.cfg,
            self.secret.as_deref(),
            progress,
        );
        if proxy_check {
            m.with_proxy_check(&*self.proxy_check)
        } else {
            m
        }
    }

    pub(crate) fn note(&mut self, guest: &str, what: String) {
        let recent = self.last.entry(guest.to_string()).or_default();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(what);
    }

    /// Carries out one control request. `owner` is the requesting process
    /// (from the socket's credentials); `progress` hears each phase.
    pub fn handle(
        &mut self,
        req: &Request,
        owner: Option<u32>,
        progress: &mut dyn FnMut(&str, Option<String>),
    ) -> Done {
        let (result, guest, stop) = {
            let mut m = self.migration(progress, true);
            let result = match req {
                Request::PreMigrate { guest, dest, mode } => (
                    m.pre_migrate(guest, dest, *mode, owner).map(|d| {
                        let mut done = Done::ok();
                        done.gpu = d.gpus.first().map(PciAddr::to_string);
                        (done, format!("detached for {} to {dest}", mode.as_str()))
                    }),
                    guest.clone(),
                ),
                Request::Migrated { guest } => (
                    m.migrated(guest).map(|dest| {
                        let to = dest.unwrap_or_else(|| "elsewhere".into());
                        (Done::ok(), format!("left for {to}"))
                    }),
                    guest.clone(),
                ),
                Request::PostMigrateFailed { guest } => {
                    (m.roll_back(guest).map(attached), guest.clone())
                }
                Request::Receive { guest } => (m.receive(guest).map(attached), guest.clone()),
                Request::CheckReceive => {
                    return match m.check_receive() {
                        Ok(()) => Done::ok(),
                        Err(e) => Done::failed(e.to_string()),
                    };
                }
                Request::Domains => {
                    return match self.xl.domains() {
                        Ok(list) => Done {
                            domains: Some(
                                list.into_iter()
                                    .map(|d| Domain {
                                        domid: d.domid,
                                        name: d.name,
                                    })
                                    .collect(),
                            ),
                            ..Done::ok()
                        },
                        Err(e) => Done::failed(e.to_string()),
                    };
                }
                Request::Status => {
                    return Done {
                        status: Some(self.status()),
                        ..Done::ok()
                    };
                }
            };
            let stop = m.answers.last().and_then(|a| a.longest_stop_ms());
            (result.0, result.1, stop)
        };
        let stop_note = stop.map_or(String::new(), |ms| format!(" (longest stop {ms:.0} ms)"));
        match result {
            Ok((mut done, what)) => {
                log::info!("{guest}: {} done: {what}{stop_note}", req.name());
                self.note(&guest, format!("{}: {what}{stop_note}", req.name()));
                done.stop_us = stop.map(|ms| (ms * 1000.0).round() as u64);
                done
            }
            Err(MigrateError::NotManaged(g)) => {
                log::debug!("{g} is not managed; {} ignored", req.name());
                Done {
                    managed: Some(false),
                    ..Done::ok()
                }
            }
            Err(e) => {
                log::warn!("{guest}: {} failed: {e}", req.name());
                self.note(&guest, format!("{} failed: {e}", req.name()));
                Done::failed(e.to_string())
            }
        }
    }

    /// One supervision period: the proxy, the keys of guests that started
    /// meanwhile, and unfinished journal entries.
    pub fn tick(&mut self, owner_alive: &dyn Fn(u32) -> bool) {
        if let Some(p) = self.proxy.as_mut() {
            p.tick(&self.store, &self.xl, &self.cfg, self.secret.as_deref());
        }
        self.set_up_guests();
        let taken = self.unattended.take();
        let mut quiet = |_: &str, _: Option<String>| {};
        let mut m = self.migration(&mut quiet, false);
        let recovered = match m.recover(owner_alive) {
            Ok(r) => r,
            Err(e) => {
                log::error!("cannot read the migration journal: {e}");
                self.unattended = taken;
                return;
            }
        };
        let mut unattended = match taken {
            Some(u) => u,
            None => (
                std::time::Instant::now(),
                m.unattended().unwrap_or_else(|e| {
                    log::error!("cannot look for guests waiting for a GPU: {e}");
                    BTreeMap::new()
                }),
            ),
        };
        let adopted = if unattended.1.is_empty() || unattended.0.elapsed() > ADOPT_FOR {
            unattended.1.clear();
            Vec::new()
        } else {
            m.adopt_waiting(&mut unattended.1).unwrap_or_else(|e| {
                log::error!("cannot look for guests waiting for a GPU: {e}");
                Vec::new()
            })
        };
        let answers = m.answers;
        self.unattended = Some(unattended);
        for (guest, r) in adopted {
            let what = match r {
                Ok(Attached::Waiting | Attached::OnCpu) => {
                    "arrived while craned was not running; waits for a GPU".to_string()
                }
                Ok(_) => "arrived while craned was not running; received".to_string(),
                Err(e) => format!("arrived while craned was not running; receiving failed: {e}"),
            };
            log::info!("{guest}: {what}");
            self.note(&guest, what);
        }
        for (guest, r) in recovered {
            let what = match r {
                Recovered::Left | Recovered::Received(Ok(Attached::Waiting | Attached::OnCpu)) => {
                    continue;
                }
                Recovered::Departed => "left this host".to_string(),
                Recovered::RolledBack(Ok(_)) => "rolled back after an interruption".to_string(),
                Recovered::Received(Ok(_)) => {
                    let stop = answers
                        .iter()
                        .rev()
                        .find(|a| a.guest == guest && a.op == "prepare-resume")
                        .and_then(|a| a.longest_stop_ms());
                    match stop {
                        Some(ms) => format!("received after waiting (longest stop {ms:.0} ms)"),
                        None => "received after waiting".to_string(),
                    }
                }
                Recovered::RolledBack(Err(e)) | Recovered::Received(Err(e)) => {
                    limited!(log::Level::Warn, "{guest}: recovery: {e}");
                    format!("recovery failed: {e}")
                }
            };
            log::info!("{guest}: {what}");
            self.note(&guest, what);
        }
        self.admin_tick();
    }

    /// Gives every running managed guest its crane keys (the agent waits for
    /// them), once per domain.
    fn set_up_guests(&mut self) {
        for g in self.cfg.guests.clone() {
            let Ok(Some(domid)) = self.xl.domid(&g) else {
                continue;
            };
            let Ok(domid) = u16::try_from(domid) else {
                continue;
            };
            if matches!(self.store.read(&absolute(domid, PROTOCOL)), Ok(Some(_))) {
                continue;
            }
            match GuestChannel::new(&self.store, domid).setup() {
                Ok(()) => log::info!("{g} (domain {domid}): crane keys set up"),
                Err(e) => limited!(log::Level::Warn, "{g}: cannot set up its keys: {e}"),
            }
        }
    }

    /// The modes the guest's agent reported for its processes in its latest
    /// answer (guest-written: a malformed set shows as none).
    fn app_modes(&self, domid: u32) -> Vec<AppMode> {
        let Ok(domid) = u16::try_from(domid) else {
            return Vec::new();
        };
        let chan = GuestChannel::new(&self.store, domid);
        let Ok(Some(resp)) = chan.response() else {
            return Vec::new();
        };
        chan.app_results(resp.seq)
            .unwrap_or_default()
            .into_iter()
            .map(|a| AppMode {
                pid: a.pid,
                mode: a.outcome.as_str().to_string(),
            })
            .collect()
    }

    pub fn status(&self) -> Status {
        let mut holders = BTreeMap::new();
        let domains = self.xl.domains().unwrap_or_default();
        for d in &domains {
            if d.domid != 0 {
                for gpu in self.xl.pci_list(d.domid).unwrap_or_default() {
                    holders.insert(gpu, d.name.clone());
                }
            }
        }
        let assignable = self.xl.pci_assignable_list().unwrap_or_default();
        let mut gpus: Vec<GpuStatus> = self
            .cfg
            .pool()
            .iter()
            .map(|g| (g, "pool"))
            .chain(self.cfg.proxy.gpu.iter().map(|g| (g, "proxy")))
            .map(|(g, role)| GpuStatus {
                bdf: g.to_string(),
                role: role.into(),
                holder: holders.get(g).cloned(),
                assignable: assignable.contains(g),
            })
            .collect();
        gpus.sort_by(|a, b| a.bdf.cmp(&b.bdf));
        let guests = self
            .cfg
            .guests
            .iter()
            .map(|g| {
                let domid = domains.iter().find(|d| &d.name == g).map(|d| d.domid);
                GuestStatus {
                    name: g.clone(),
                    domid,
                    gpus: holders
                        .iter()
                        .filter(|(_, h)| *h == g)
                        .map(|(b, _)| b.to_string())
                        .collect(),
                    migration: journal::load(&self.store, g)
                        .ok()
                        .flatten()
                        .map(|e| e.phase.as_str().to_string()),
                    last: self.last.get(g).and_then(|r| r.back().cloned()),
                    recent: self
                        .last
                        .get(g)
                        .map(|r| r.iter().cloned().collect())
                        .unwrap_or_default(),
                    apps: domid.map_or_else(Vec::new, |d| self.app_modes(d)),
                }
            })
            .collect();
        let proxy =
            (!self.cfg.proxy.address.is_empty() || !self.cfg.proxy.domain.is_empty()).then(|| {
                self.proxy_status
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            });
        Status {
            guests,
            gpus,
            proxy,
        }
    }
}

fn attached(a: Attached) -> (Done, String) {
    match a {
        Attached::Resumed(gpu) => (
            Done {
                gpu: gpu.map(|g| g.to_string()),
                ..Done::ok()
            },
            match gpu {
                Some(g) => format!("running on GPU {g}"),
                None => "resumed (no GPU to give back)".into(),
            },
        ),
        Attached::Waiting => (
            Done {
                waiting: Some(true),
                ..Done::ok()
            },
            "waiting for a free GPU (processes stay on the proxy)".into(),
        ),
        Attached::OnCpu => (
            Done {
                waiting: Some(true),
                on_cpu: Some(true),
                ..Done::ok()
            },
            "waiting for a free GPU (processes run on the guest's CPU)".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeAgent, FakeXl, OnMigrate, gpu};
    use crane_xs::XsData;
    use crane_xs::mem::{MemConn, MemStore};
    use crane_xs::message::GuestState;
    use craned_control::Mode;
    use std::time::Duration;

    fn service(store: &MemStore, xl: &FakeXl) -> Service<MemConn, FakeXl> {
        let mut cfg = Config {
            guests: vec!["g1".into()],
            ..Config::default()
        };
        cfg.gpus.pool = vec![gpu("0000:00:05.0")];
        cfg.agent_timeout_ms = 3_000;
        Service::new(
            cfg,
            store.connect(0),
            xl.clone(),
            None,
            Box::new(|_: &str, _| Ok(())),
        )
    }

    /// craned starting on a host where a guest arrived without it (detached,
    /// no GPU, no journal entry) receives it within its first ticks, once
    /// the agent has its keys and says it is detached; a guest that
    /// arrives in that state after craned started is left to the wrapper's
    /// receive.
    #[test]
    fn at_start_a_guest_that_arrived_without_craned_is_received() {
        use crane_xs::message::DetachKind;
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.add_domain("g1", 3, &[]);
        store.introduce(3);
        let agent = FakeAgent::start(
            &store,
            3,
            GuestState::Detached(DetachKind::Remote),
            OnMigrate::Detach,
        );
        let mut svc = service(&store, &xl);
        let start = std::time::Instant::now();
        while xl.gpus_of(3).is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "never received");
            svc.tick(&|_| false);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(xl.gpus_of(3), [gpu("0000:00:05.0")]);
        assert_eq!(agent.ops(), ["prepare-resume"]);
        let notes = svc.last.get("g1").cloned().unwrap_or_default();
        assert!(
            notes
                .iter()
                .any(|n| n == "arrived while craned was not running; received"),
            "{notes:?}"
        );
        // A guest arriving detached now, after the start: not craned's to take.
        xl.remove_domain(3);
        xl.add_domain("g1", 5, &[]);
        store.introduce(5);
        let later = FakeAgent::start(
            &store,
            5,
            GuestState::Detached(DetachKind::Remote),
            OnMigrate::Detach,
        );
        for _ in 0..20 {
            svc.tick(&|_| false);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(xl.gpus_of(5).is_empty());
        assert!(later.ops().is_empty());
    }

    #[test]
    fn requests_report_outcomes_and_status_shows_them() {
        let store = MemStore::new();
        let xl = FakeXl::default();
        xl.add_domain("g1", 3, &[gpu("0000:00:05.0")]);
        xl.add_domain("other", 4, &[]);
        store.introduce(3);
        let agent = FakeAgent::start(&store, 3, GuestState::Passthrough, OnMigrate::Detach);
        let mut svc = service(&store, &xl);
        // The tick gives the running guest its keys; the agent publishes.
        svc.tick(&|_| false);
        assert!(
            store
                .connect(0)
                .read("/local/domain/3/crane/protocol")
                .unwrap()
                .is_some()
        );

        let mut phases = Vec::new();
        let req = Request::PreMigrate {
            guest: "g1".into(),
            dest: "host1".into(),
            mode: Mode::StopAndCopy,
        };
        let done = svc.handle(&req, Some(std::process::id()), &mut |p, _| {
            phases.push(p.to_string())
        });
        assert!(done.ok, "{done:?}");
        assert_eq!(done.gpu.as_deref(), Some("0000:00:05.0"));
        assert!(phases.contains(&"detach".to_string()), "{phases:?}");
        let st = svc.status();
        assert_eq!(st.guests[0].migration.as_deref(), Some("detached"));
        assert!(st.gpus[0].holder.is_none() && st.gpus[0].assignable);
        // The requester is alive, so the tick leaves the migration alone.
        svc.tick(&|pid| pid == std::process::id());
        assert_eq!(
            svc.status().guests[0].migration.as_deref(),
            Some("detached")
        );

        let done = svc.handle(
            &Request::PostMigrateFailed { guest: "g1".into() },
            None,
            &mut |_, _| {},
        );
        assert!(done.ok, "{done:?}");
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
        let st = svc.status();
        assert_eq!(st.guests[0].gpus, ["0000:00:05.0"]);
        assert!(
            st.guests[0]
                .last
                .as_deref()
                .unwrap()
                .contains("running on GPU")
        );

        // An unmanaged domain passes through; domains are listed.
        let done = svc.handle(
            &Request::PreMigrate {
                guest: "other".into(),
                dest: "h".into(),
                mode: Mode::Remote,
            },
            None,
            &mut |_, _| {},
        );
        assert_eq!((done.ok, done.managed), (true, Some(false)));
        let done = svc.handle(&Request::Domains, None, &mut |_, _| {});
        let names: Vec<String> = done.domains.unwrap().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["Domain-0", "g1", "other"]);
        // Remote mode without a secret is refused with the reason.
        let done = svc.handle(
            &Request::PreMigrate {
                guest: "g1".into(),
                dest: "h".into(),
                mode: Mode::Remote,
            },
            None,
            &mut |_, _| {},
        );
        assert!(!done.ok);
        assert!(done.error.unwrap().contains("proxy.address"));
    }

    #[test]
    fn process_liveness() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
    }
}
