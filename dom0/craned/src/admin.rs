//! The XenStore trigger: migrations an administrator or a management stack
//! requests under `/local/domain/0/crane/requests/<guest>` (value format and
//! rules: `crane_xs::admin`), carried out with the same choreography as the
//! `xl` wrapper's (crate::migrate), with progress and the result written to
//! `/local/domain/0/crane/results/<guest>`.
//!
//! The supervision tick looks at the requests (a watch on the request tree
//! wakes it at once). Pre-migration runs in the tick, like a wrapper's
//! request; the transfer (`xl migrate`, crate::transfer) runs beside the
//! service and is polled by later ticks, which then finish the migration or
//! roll it back. The journal entry names craned itself as its owner, so a
//! craned that restarts mid-transfer (its xl dies with it) rolls the guest
//! back or, if the domain left, closes the entry; the request's result then
//! says which.

use std::time::Instant;

use crane_libxl::Xl;
use crane_xs::XenStore;
use crane_xs::admin::{
    AdminOp, AdminRequest, AdminResult, AdminState, MoveMode, request_key, result_key,
};
use crane_xs::layout::DOM0_REQUESTS;
use crane_xs::perms::check_dom0_only;
use craned_control::Mode;

use crate::migrate::{MigrateError, rollback_text};
use crate::ratelimit::limited;
use crate::service::Service;
use crate::transfer::Running;

/// Most requests looked at per tick (the tree is dom0's, but bounded all
/// the same).
const MAX_PER_TICK: usize = 256;

/// A XenStore-triggered migration whose transfer is under way.
pub(crate) struct Job {
    id: u64,
    started: Instant,
    dest: String,
    mode: Mode,
    pre_stop_ms: Option<f64>,
    /// Bytes sent, as of the last tick (the count is gone with the process).
    bytes: Option<u64>,
    running: Box<dyn Running>,
}

/// Errors that refuse a request before anything changed.
fn refused(e: &MigrateError) -> bool {
    matches!(
        e,
        MigrateError::NotManaged(_)
            | MigrateError::NoDomain(_)
            | MigrateError::Busy { .. }
            | MigrateError::NoRemote(_)
            | MigrateError::ProxyDown { .. }
    )
}

/// A request still under way, in `phase`.
fn working(id: u64, phase: &str, started: Instant, pre_stop_ms: Option<f64>) -> AdminResult {
    let mut r = AdminResult::new(id, AdminState::Working);
    r.phase = Some(phase.to_string());
    r.ms = started.elapsed().as_millis() as u64;
    r.pre_stop_ms = pre_stop_ms;
    r
}

impl<S: XenStore, X: Xl> Service<S, X> {
    fn write_result(&self, guest: &str, r: &AdminResult) {
        if let Err(e) = self.store.write(&result_key(guest), &r.format()) {
            limited!(
                log::Level::Warn,
                "{guest}: cannot write the request's result: {e}"
            );
        }
    }

    fn finish(
        &mut self,
        guest: &str,
        id: u64,
        started: Instant,
        state: AdminState,
        f: impl FnOnce(&mut AdminResult),
    ) {
        let mut r = AdminResult::new(id, state);
        r.ms = started.elapsed().as_millis() as u64;
        f(&mut r);
        let what = match &r.error {
            Some(e) => format!("XenStore request {id} {}: {e}", state.as_str()),
            None => format!("XenStore request {id} {}", state.as_str()),
        };
        log::info!("{guest}: {what}");
        self.note(guest, what);
        self.write_result(guest, &r);
    }

    /// One look at the XenStore trigger: transfers that ended, then new
    /// requests.
    pub(crate) fn admin_tick(&mut self) {
        self.poll_jobs();
        let names = match self.store.directory(DOM0_REQUESTS) {
            Ok(n) => n,
            Err(e) => {
                limited!(log::Level::Warn, "cannot list {DOM0_REQUESTS}: {e}");
                return;
            }
        };
        for guest in names.into_iter().take(MAX_PER_TICK) {
            if !self.jobs.contains_key(&guest) {
                self.admin_one(&guest);
            }
        }
    }

    fn poll_jobs(&mut self) {
        let guests: Vec<String> = self.jobs.keys().cloned().collect();
        for guest in guests {
            let Some(job) = self.jobs.get_mut(&guest) else {
                continue;
            };
            let Some(outcome) = job.running.poll() else {
                let mut r = working(job.id, "transfer", job.started, job.pre_stop_ms);
                job.bytes = job.running.bytes().or(job.bytes);
                r.bytes = job.bytes;
                self.write_result(&guest, &r);
                continue;
            };
            let Some(job) = self.jobs.remove(&guest) else {
                continue;
            };
            let mut quiet = |_: &str, _: Option<String>| {};
            let mut m = self.migration(&mut quiet, false);
            let (state, error) = match outcome {
                Ok(()) => match m.migrated(&guest) {
                    Ok(_) => (AdminState::Done, None),
                    Err(e @ MigrateError::StillHere { .. }) => {
                        let rb = rollback_text(m.roll_back(&guest));
                        (AdminState::Failed, Some(format!("{rb}; {e}")))
                    }
                    Err(e) => (AdminState::Failed, Some(e.to_string())),
                },
                Err(why) => {
                    let rb = rollback_text(m.roll_back(&guest));
                    (AdminState::Failed, Some(format!("{rb}; {why}")))
                }
            };
            let (pre, bytes) = (job.pre_stop_ms, job.bytes);
            log::info!(
                "{guest}: {} to {} ({}) ended: {}",
                job.id,
                job.dest,
                job.mode.as_str(),
                state.as_str()
            );
            self.finish(&guest, job.id, job.started, state, |r| {
                r.phase = Some("transfer".into());
                r.pre_stop_ms = pre;
                r.bytes = bytes;
                r.error = error;
            });
        }
    }

    fn admin_one(&mut self, guest: &str) {
        let key = request_key(guest);
        let raw = match self.store.read(&key) {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => {
                limited!(log::Level::Warn, "cannot read {key}: {e}");
                return;
            }
        };
        let parsed = AdminRequest::parse(&raw);
        let id = match &parsed {
            Ok(r) => r.id,
            Err(_) => AdminRequest::salvage_id(&raw),
        };
        let last = self
            .store
            .read(&result_key(guest))
            .ok()
            .flatten()
            .and_then(|v| AdminResult::parse(&v).ok());
        let now = Instant::now();
        if let Some(l) = &last {
            if l.id > id || (l.id == id && l.state.is_final()) {
                return; // handled (watches repeat; ids must grow)
            }
            if l.id == id {
                // Working, but no transfer here: craned restarted during it.
                // The journal's recovery (earlier in this tick) has rolled
                // the guest back, or closed the entry if the domain left.
                let gone = self.xl.domid(guest).ok().flatten().is_none();
                let (state, error) = if gone {
                    (AdminState::Done, None)
                } else {
                    (
                        AdminState::Failed,
                        Some(
                            "craned restarted during the migration; the guest was rolled \
                             back and runs here"
                                .to_string(),
                        ),
                    )
                };
                self.finish(guest, id, now, state, |r| {
                    r.phase = l.phase.clone();
                    r.pre_stop_ms = l.pre_stop_ms;
                    r.error = error;
                });
                return;
            }
        }
        let reject = |svc: &mut Self, why: String| {
            svc.finish(guest, id, now, AdminState::Rejected, |r| {
                r.error = Some(why)
            });
        };
        if !self.cfg.manages(guest) {
            return reject(self, format!("{guest} is not a guest crane manages"));
        }
        match self.store.get_perms(&key) {
            Ok(p) => {
                if let Err(e) = check_dom0_only(&p) {
                    return reject(self, format!("the request is not dom0's alone: {e}"));
                }
            }
            Err(e) => return reject(self, format!("cannot read the request's permissions: {e}")),
        }
        let req = match parsed {
            Ok(r) => r,
            Err(e) => return reject(self, format!("malformed request: {e}")),
        };
        match req.op {
            AdminOp::Migrate {
                dest,
                mode,
                ssh_command,
            } => self.admin_migrate(guest, id, &dest, mode, ssh_command.as_deref()),
        }
    }

    fn admin_migrate(
        &mut self,
        guest: &str,
        id: u64,
        dest: &str,
        mode: MoveMode,
        ssh_command: Option<&str>,
    ) {
        let started = Instant::now();
        let mode = match mode {
            MoveMode::Remote => Mode::Remote,
            MoveMode::StopAndCopy => Mode::StopAndCopy,
        };
        log::info!(
            "{guest}: XenStore request {id}: migrate to {dest} ({})",
            mode.as_str()
        );
        let this = &*self;
        let mut progress = |phase: &str, _: Option<String>| {
            this.write_result(guest, &working(id, phase, started, None));
        };
        progress("accepted", None);
        let mut m = self.migration(&mut progress, true);
        let pre = m.pre_migrate(guest, dest, mode, Some(std::process::id()));
        let pre_stop_ms = m.stop_ms("prepare-migrate");
        if let Err(e) = pre {
            let state = if refused(&e) {
                AdminState::Rejected
            } else {
                AdminState::Failed
            };
            return self.finish(guest, id, started, state, |r| {
                r.phase = Some("prepare-migrate".into());
                r.pre_stop_ms = pre_stop_ms;
                r.error = Some(e.to_string());
            });
        }
        match self.transfers.start(guest, dest, ssh_command) {
            Ok(running) => {
                self.write_result(guest, &working(id, "transfer", started, pre_stop_ms));
                self.jobs.insert(
                    guest.to_string(),
                    Job {
                        id,
                        started,
                        dest: dest.to_string(),
                        mode,
                        pre_stop_ms,
                        bytes: None,
                        running,
                    },
                );
            }
            Err(why) => {
                let mut quiet = |_: &str, _: Option<String>| {};
                let mut m = self.migration(&mut quiet, false);
                let rb = rollback_text(m.roll_back(guest));
                self.finish(guest, id, started, AdminState::Failed, |r| {
                    r.phase = Some("transfer".into());
                    r.pre_stop_ms = pre_stop_ms;
                    r.error = Some(format!("{rb}; {why}"));
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::journal;
    use crate::testing::{FAKE_BYTES, FAKE_PID, FakeAgent, FakeTransfers, FakeXl, OnMigrate, gpu};
    use crane_xs::mem::{MemConn, MemStore};
    use crane_xs::message::GuestState;
    use crane_xs::{Access, Perm, XsData, XsPerms};
    use std::sync::{Arc, Mutex};

    const GPU: &str = "0000:00:05.0";

    struct World {
        store: MemStore,
        dom0: MemConn,
        xl: FakeXl,
        transfers: FakeTransfers,
        proxy_up: Arc<Mutex<bool>>,
        _agent: FakeAgent,
    }

    impl World {
        fn new() -> World {
            let store = MemStore::new();
            let xl = FakeXl::default();
            xl.add_domain("g1", 3, &[gpu(GPU)]);
            store.introduce(3);
            let agent = FakeAgent::start(&store, 3, GuestState::Passthrough, OnMigrate::Detach);
            World {
                dom0: store.connect(0),
                transfers: FakeTransfers::new(&xl),
                store,
                xl,
                proxy_up: Arc::new(Mutex::new(true)),
                _agent: agent,
            }
        }

        fn service(&self) -> Service<MemConn, FakeXl> {
            let mut cfg = Config {
                guests: vec!["g1".into()],
                ..Config::default()
            };
            cfg.gpus.pool = vec![gpu(GPU)];
            cfg.agent_timeout_ms = 3_000;
            cfg.proxy.address = "tcp://10.77.0.2:7000".into();
            let up = self.proxy_up.clone();
            let mut svc = Service::new(
                cfg,
                self.store.connect(0),
                self.xl.clone(),
                Some(b"0123456789abcdef-secret".to_vec()),
                Box::new(move |_: &str, _| {
                    if *up.lock().unwrap() {
                        Ok(())
                    } else {
                        Err("connection timed out".into())
                    }
                }),
            );
            svc.set_transfers(Box::new(self.transfers.clone()));
            svc
        }

        fn request(&self, value: &str) {
            self.dom0.write(&request_key("g1"), value).unwrap();
        }

        fn result(&self) -> AdminResult {
            let v = self
                .dom0
                .read(&result_key("g1"))
                .unwrap()
                .expect("a result");
            AdminResult::parse(&v).unwrap()
        }
    }

    #[test]
    fn a_request_migrates_the_guest_and_reports_progress_and_stoppage() {
        let w = World::new();
        let mut svc = w.service();
        svc.tick(&|_| false);
        w.request("id=1 op=migrate dest=host1 mode=remote ssh-command=");
        svc.tick(&|pid| pid == std::process::id());
        let r = w.result();
        assert_eq!((r.id, r.state), (1, AdminState::Working), "{r:?}");
        assert_eq!(r.phase.as_deref(), Some("transfer"));
        assert_eq!(r.pre_stop_ms, Some(12.5));
        assert!(w.xl.gpus_of(3).is_empty(), "the GPU is detached first");
        assert_eq!(
            w.transfers.started(),
            [("g1".into(), "host1".into(), Some(String::new()))]
        );
        // The transfer runs on; the journal's owner (craned) lives.
        svc.tick(&|pid| pid == std::process::id());
        let r = w.result();
        assert_eq!((r.state, r.bytes), (AdminState::Working, Some(FAKE_BYTES)));
        svc.tick(&|pid| pid == std::process::id());
        let r = w.result();
        assert_eq!((r.id, r.state, r.error), (1, AdminState::Done, None));
        assert_eq!(r.bytes, Some(FAKE_BYTES));
        assert!(journal::load(&w.dom0, "g1").unwrap().is_none());
        let st = svc.status();
        assert!(
            st.guests[0]
                .last
                .as_deref()
                .unwrap()
                .contains("request 1 done"),
            "{st:?}"
        );
        // Watches repeat: a handled request is not carried out again.
        svc.tick(&|_| true);
        assert_eq!(w.transfers.started().len(), 1);
    }

    #[test]
    fn a_failed_transfer_rolls_back_and_says_why() {
        let w = World::new();
        let mut svc = w.service();
        w.transfers.fail(true);
        w.request("id=4 op=migrate dest=host1 mode=stop-and-copy");
        for _ in 0..3 {
            svc.tick(&|pid| pid == std::process::id());
        }
        let r = w.result();
        assert_eq!((r.id, r.state), (4, AdminState::Failed), "{r:?}");
        let e = r.error.unwrap();
        assert!(
            e.contains("exit status: 1") && e.contains("kept its GPU"),
            "{e}"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU)]);
        assert_eq!(w._agent.ops(), ["prepare-migrate", "prepare-resume"]);
        let st = svc.status();
        assert_eq!(st.guests[0].apps.len(), 1);
        assert_eq!(st.guests[0].apps[0].pid, FAKE_PID);
        assert_eq!(st.guests[0].apps[0].mode, "passthrough");
    }

    #[test]
    fn a_proxy_that_does_not_answer_refuses_the_move_and_changes_nothing() {
        let w = World::new();
        let mut svc = w.service();
        *w.proxy_up.lock().unwrap() = false;
        w.request("id=2 op=migrate dest=host1");
        svc.tick(&|_| true);
        let r = w.result();
        assert_eq!((r.id, r.state), (2, AdminState::Rejected), "{r:?}");
        assert!(r.error.unwrap().contains("crane-proxy does not answer"));
        assert!(w._agent.ops().is_empty());
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU)]);
        assert!(journal::load(&w.dom0, "g1").unwrap().is_none());
        assert!(w.transfers.started().is_empty());
        // A later request (a larger id) runs once the proxy is back.
        *w.proxy_up.lock().unwrap() = true;
        w.request("id=3 op=migrate dest=host1");
        svc.tick(&|pid| pid == std::process::id());
        assert_eq!(w.result().id, 3);
        assert_eq!(w.transfers.started().len(), 1);
    }

    #[test]
    fn hostile_requests_are_rejected_once_and_change_nothing() {
        let w = World::new();
        let mut svc = w.service();
        for (value, want) in [
            ("id=5 op=migrate", "dest is missing"),
            ("garbage", "malformed request"),
            ("id=6 op=migrate dest=--help", "option"),
        ] {
            w.request(value);
            svc.tick(&|_| true);
            let r = w.result();
            assert_eq!(r.state, AdminState::Rejected, "{value}: {r:?}");
            assert!(r.error.as_deref().unwrap().contains(want), "{value}: {r:?}");
        }
        // Looked at again (watches repeat), it is not rewritten.
        let before = w.dom0.read(&result_key("g1")).unwrap();
        let notes = svc.status().guests[0].recent.len();
        svc.tick(&|_| true);
        assert_eq!(w.dom0.read(&result_key("g1")).unwrap(), before);
        assert_eq!(svc.status().guests[0].recent.len(), notes);
        // A guest crane does not manage.
        w.dom0
            .write(&request_key("stranger"), "id=1 op=migrate dest=h")
            .unwrap();
        svc.tick(&|_| true);
        let v = w.dom0.read(&result_key("stranger")).unwrap().unwrap();
        assert!(v.contains("not%20a%20guest%20crane%20manages"), "{v}");
        // A request another domain may write is not dom0's alone.
        w.request("id=9 op=migrate dest=host1");
        w.dom0
            .set_perms(
                &request_key("g1"),
                &[Perm::new(0, Access::None), Perm::new(3, Access::Write)],
            )
            .unwrap();
        svc.tick(&|_| true);
        let r = w.result();
        assert_eq!((r.id, r.state), (9, AdminState::Rejected));
        assert!(r.error.unwrap().contains("not dom0's alone"));
        assert!(w._agent.ops().is_empty());
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU)]);
    }

    #[test]
    fn a_restart_during_the_transfer_rolls_back_and_closes_the_request() {
        let w = World::new();
        let mut svc = w.service();
        w.request("id=7 op=migrate dest=host1");
        svc.tick(&|pid| pid == std::process::id());
        assert_eq!(w.result().state, AdminState::Working);
        drop(svc); // craned dies; its xl dies with it
        let mut svc = w.service();
        // The old craned (the journal's owner) is gone.
        svc.tick(&|_| false);
        let r = w.result();
        assert_eq!((r.id, r.state), (7, AdminState::Failed), "{r:?}");
        assert!(r.error.unwrap().contains("craned restarted"));
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU)]);
        assert!(journal::load(&w.dom0, "g1").unwrap().is_none());
    }
}
