//! Fakes for unit tests: a toolstack ([`FakeXl`]) and a guest agent
//! ([`FakeAgent`]) that answers over crane-xs's `MemStore` exactly as the
//! real agent's protocol side does (crane_xs::guest). The end-to-end tier
//! runs the real ones.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crane_libxl::{DomainInfo, DomainState, LibxlCode, LibxlError, PciAddr, Xl};
use crane_xs::guest::{Incoming, publish_answer, publish_state, read_request};
use crane_xs::mem::MemStore;
use crane_xs::message::{
    AgentState, AppOutcome, AppResult, GuestState, MigrateMode, Op, Outcome, Request, Response,
    Rollback,
};
use crane_xs::{XsData, XsWatch};

use crate::transfer::{Running, Transfers};

pub fn gpu(s: &str) -> PciAddr {
    s.parse().unwrap()
}

#[derive(Default)]
struct XlState {
    domains: BTreeMap<u32, (String, DomainState)>,
    pci: BTreeMap<u32, Vec<PciAddr>>,
    assignable: BTreeSet<PciAddr>,
    fail_detach: bool,
    fail_attach: bool,
    /// `create` makes a domain of this name.
    creates: Option<String>,
    created: Vec<PathBuf>,
    destroyed: Vec<u32>,
    next_domid: u32,
}

#[derive(Default, Clone)]
pub struct FakeXl {
    state: Arc<Mutex<XlState>>,
}

fn fail(op: &'static str, bdf: PciAddr) -> LibxlError {
    LibxlError::Pci {
        op,
        bdf,
        code: LibxlCode::Fail,
    }
}

impl FakeXl {
    fn lock(&self) -> std::sync::MutexGuard<'_, XlState> {
        self.state.lock().unwrap()
    }

    pub fn add_domain(&self, name: &str, domid: u32, gpus: &[PciAddr]) {
        let mut s = self.lock();
        s.domains
            .insert(domid, (name.to_string(), DomainState::Running));
        s.pci.insert(domid, gpus.to_vec());
        s.assignable.extend(gpus);
        s.next_domid = s.next_domid.max(domid + 1);
    }

    pub fn remove_domain(&self, domid: u32) {
        let mut s = self.lock();
        s.domains.remove(&domid);
        s.pci.remove(&domid);
    }

    pub fn set_state(&self, domid: u32, state: DomainState) {
        self.lock().domains.get_mut(&domid).unwrap().1 = state;
    }

    pub fn gpus_of(&self, domid: u32) -> Vec<PciAddr> {
        self.lock().pci.get(&domid).cloned().unwrap_or_default()
    }

    pub fn assignable(&self) -> BTreeSet<PciAddr> {
        self.lock().assignable.clone()
    }

    pub fn fail_detach(&self, on: bool) {
        self.lock().fail_detach = on;
    }

    pub fn fail_attach(&self, on: bool) {
        self.lock().fail_attach = on;
    }

    pub fn create_makes(&self, name: &str) {
        self.lock().creates = Some(name.to_string());
    }

    pub fn created(&self) -> Vec<PathBuf> {
        self.lock().created.clone()
    }

    pub fn destroyed(&self) -> Vec<u32> {
        self.lock().destroyed.clone()
    }
}

impl Xl for FakeXl {
    fn domid(&self, name: &str) -> Result<Option<u32>, LibxlError> {
        Ok(self
            .lock()
            .domains
            .iter()
            .find(|(_, (n, _))| n == name)
            .map(|(d, _)| *d))
    }

    fn domain_info(&self, domid: u32) -> Result<Option<DomainInfo>, LibxlError> {
        Ok(self.lock().domains.get(&domid).map(|(n, s)| DomainInfo {
            domid,
            name: n.clone(),
            state: *s,
            memory_kib: 262_144,
        }))
    }

    fn domains(&self) -> Result<Vec<DomainInfo>, LibxlError> {
        let mut out = vec![DomainInfo {
            domid: 0,
            name: "Domain-0".into(),
            state: DomainState::Running,
            memory_kib: 1 << 20,
        }];
        for (d, (n, s)) in &self.lock().domains {
            out.push(DomainInfo {
                domid: *d,
                name: n.clone(),
                state: *s,
                memory_kib: 262_144,
            });
        }
        Ok(out)
    }

    fn pci_assignable_list(&self) -> Result<Vec<PciAddr>, LibxlError> {
        Ok(self.lock().assignable.iter().copied().collect())
    }

    fn pci_assignable_add(&self, bdf: PciAddr, _rebind: bool) -> Result<(), LibxlError> {
        self.lock().assignable.insert(bdf);
        Ok(())
    }

    fn pci_assignable_remove(&self, bdf: PciAddr, _rebind: bool) -> Result<(), LibxlError> {
        self.lock().assignable.remove(&bdf);
        Ok(())
    }

    fn pci_list(&self, domid: u32) -> Result<Vec<PciAddr>, LibxlError> {
        Ok(self.gpus_of(domid))
    }

    fn pci_attach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError> {
        let mut s = self.lock();
        if s.fail_attach || !s.assignable.contains(&bdf) {
            return Err(fail("device_pci_add", bdf));
        }
        if s.pci.values().any(|v| v.contains(&bdf)) {
            return Err(LibxlError::Pci {
                op: "device_pci_add",
                bdf,
                code: LibxlCode::DeviceExists,
            });
        }
        s.pci.entry(domid).or_default().push(bdf);
        Ok(())
    }

    fn pci_detach(&self, domid: u32, bdf: PciAddr) -> Result<(), LibxlError> {
        let mut s = self.lock();
        if s.fail_detach {
            return Err(fail("device_pci_remove", bdf));
        }
        let list = s.pci.entry(domid).or_default();
        let before = list.len();
        list.retain(|g| *g != bdf);
        if list.len() == before {
            return Err(fail("device_pci_remove", bdf));
        }
        Ok(())
    }

    fn create(&self, config: &Path, paused: bool) -> Result<(), LibxlError> {
        let mut s = self.lock();
        s.created.push(config.to_path_buf());
        if let Some(name) = s.creates.clone() {
            let domid = s.next_domid.max(1);
            s.next_domid = domid + 1;
            let state = if paused {
                DomainState::Paused
            } else {
                DomainState::Running
            };
            s.domains.insert(domid, (name, state));
        }
        Ok(())
    }

    fn unpause(&self, domid: u32) -> Result<(), LibxlError> {
        match self.lock().domains.get_mut(&domid) {
            Some((_, state)) => {
                *state = DomainState::Running;
                Ok(())
            }
            None => Err(LibxlError::Domain {
                op: "domain_unpause",
                domid,
                code: LibxlCode::DomainNotFound,
            }),
        }
    }

    fn destroy(&self, domid: u32) -> Result<(), LibxlError> {
        let mut s = self.lock();
        s.destroyed.push(domid);
        s.domains.remove(&domid);
        s.pci.remove(&domid);
        Ok(())
    }
}

/// How the fake agent answers prepare-migrate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnMigrate {
    /// ready-for-detach.
    Detach,
    /// Publishes `migrating` and never answers (a hung process, say).
    Hang,
    /// Publishes `migrating`, then reads nothing more until let go with
    /// [`FakeAgent::pause`]`(false)` (an agent stuck inside the request).
    Freeze,
    /// failed, rolled back completely.
    Fail,
}

/// How the fake agent answers prepare-resume ([`FakeAgent::on_resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnResume {
    /// resumed.
    Resume,
    /// failed (the device not usable yet, say).
    Fail,
    /// Never answers.
    Hang,
}

/// The pid of the one OpenCL process a [`FakeAgent`] reports.
pub const FAKE_PID: u32 = 4242;

/// A guest agent playing domain `domid` in a `MemStore`.
pub struct FakeAgent {
    stop: Arc<AtomicBool>,
    /// Held by the agent's thread for each whole turn of its loop, so that
    /// [`FakeAgent::pause`] returns only once no turn is under way.
    paused: Arc<Mutex<bool>>,
    seen: Arc<Mutex<Vec<Request>>>,
    on_resume: Arc<Mutex<OnResume>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeAgent {
    pub fn start(store: &MemStore, domid: u16, initial: GuestState, on_migrate: OnMigrate) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(Mutex::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let on_resume = Arc::new(Mutex::new(OnResume::Resume));
        let conn = store.connect(domid);
        let (stop2, paused2, seen2) = (stop.clone(), paused.clone(), seen.clone());
        let on_resume2 = on_resume.clone();
        let thread = std::thread::spawn(move || {
            conn.watch("crane", "agent").unwrap();
            let mut state = AgentState {
                state: initial,
                last_seq: 0,
            };
            while !stop2.load(Ordering::SeqCst) {
                let _ = conn.wait_event(Duration::from_millis(20));
                let mut paused = paused2.lock().unwrap();
                if *paused {
                    continue;
                }
                // The real agent republishes its state whenever its watch
                // fires, e.g. when dom0 sets up the keys on arrival.
                if conn.read("crane/agent").ok().flatten().is_some()
                    && conn.read("crane/agent/state").ok().flatten().is_none()
                {
                    let _ = publish_state(&conn, &state);
                }
                let Ok(Incoming::New(req)) = read_request(&conn, state.last_seq) else {
                    continue;
                };
                seen2.lock().unwrap().push(req.clone());
                state.last_seq = req.seq;
                let answer = |outcome, state: &AgentState, rollback| {
                    // One process, stopped 12.5 ms by each switch.
                    let app = match (&req.op, outcome) {
                        (
                            Op::PrepareMigrate(MigrateMode::Remote { .. }),
                            Outcome::ReadyForDetach,
                        ) => Some(AppOutcome::Remote),
                        (Op::PrepareMigrate(_), Outcome::ReadyForDetach) => {
                            Some(AppOutcome::Suspended)
                        }
                        (Op::PrepareResume(_), Outcome::Resumed) => Some(AppOutcome::Passthrough),
                        _ => None,
                    };
                    let apps: Vec<AppResult> = app
                        .map(|outcome| AppResult {
                            seq: req.seq,
                            pid: FAKE_PID,
                            outcome,
                            ms: 12.5,
                            error: None,
                        })
                        .into_iter()
                        .collect();
                    let r = Response {
                        seq: req.seq,
                        outcome,
                        ms: 1.0,
                        apps: apps.len() as u32,
                        phases: Vec::new(),
                        rollback,
                        error: (outcome == Outcome::Failed)
                            .then(|| "1 of 1 processes refused".into()),
                    };
                    publish_answer(&conn, state, &r, &apps).unwrap();
                };
                match (&req.op, on_migrate) {
                    (Op::PrepareMigrate(m), OnMigrate::Detach) => {
                        state.state = GuestState::Detached(m.kind());
                        answer(Outcome::ReadyForDetach, &state, None);
                    }
                    (Op::PrepareMigrate(_), OnMigrate::Hang) => {
                        state.state = GuestState::Migrating;
                        publish_state(&conn, &state).unwrap();
                    }
                    (Op::PrepareMigrate(_), OnMigrate::Freeze) => {
                        state.state = GuestState::Migrating;
                        publish_state(&conn, &state).unwrap();
                        *paused = true;
                    }
                    (Op::PrepareMigrate(_), OnMigrate::Fail) => {
                        answer(Outcome::Failed, &state, Some(Rollback::Complete));
                    }
                    (Op::PrepareResume(_), _) => match *on_resume2.lock().unwrap() {
                        OnResume::Resume => {
                            state.state = GuestState::Passthrough;
                            answer(Outcome::Resumed, &state, None);
                        }
                        OnResume::Fail => answer(Outcome::Failed, &state, None),
                        OnResume::Hang => {}
                    },
                }
            }
        });
        FakeAgent {
            stop,
            paused,
            seen,
            on_resume,
            thread: Some(thread),
        }
    }

    /// How it answers the prepare-resume requests from now on.
    pub fn on_resume(&self, how: OnResume) {
        *self.on_resume.lock().unwrap() = how;
    }

    /// Stops it reading anything (`on`), like a SIGSTOPped agent, or lets it
    /// go on. Once it returns, a request written is not taken while paused
    /// (a turn of the agent's loop that began before has ended).
    pub fn pause(&self, on: bool) {
        *self.paused.lock().unwrap() = on;
    }

    /// The requests it acted upon, in order.
    pub fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }

    /// The operations it acted upon, by name.
    pub fn ops(&self) -> Vec<&'static str> {
        self.seen().iter().map(|r| r.op.name()).collect()
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Transfers for the XenStore trigger's tests: each runs for one poll, then
/// either fails or "moves" the domain (removes it from the [`FakeXl`]).
/// (guest, dest, ssh command) of one started transfer.
pub type Started = (String, String, Option<String>);

#[derive(Clone, Default)]
pub struct FakeTransfers {
    xl: FakeXl,
    fail: Arc<AtomicBool>,
    started: Arc<Mutex<Vec<Started>>>,
}

impl FakeTransfers {
    pub fn new(xl: &FakeXl) -> Self {
        FakeTransfers {
            xl: xl.clone(),
            ..FakeTransfers::default()
        }
    }

    pub fn fail(&self, on: bool) {
        self.fail.store(on, Ordering::SeqCst);
    }

    /// (guest, dest, ssh command) of every transfer started.
    pub fn started(&self) -> Vec<Started> {
        self.started.lock().unwrap().clone()
    }
}

struct FakeRunning {
    xl: FakeXl,
    guest: String,
    fail: bool,
    polls: u32,
}

impl Transfers for FakeTransfers {
    fn start(
        &self,
        guest: &str,
        dest: &str,
        ssh_command: Option<&str>,
    ) -> Result<Box<dyn Running>, String> {
        self.started.lock().unwrap().push((
            guest.to_string(),
            dest.to_string(),
            ssh_command.map(str::to_string),
        ));
        Ok(Box::new(FakeRunning {
            xl: self.xl.clone(),
            guest: guest.to_string(),
            fail: self.fail.load(Ordering::SeqCst),
            polls: 0,
        }))
    }
}

/// What a [`FakeTransfers`] transfer says it has sent.
pub const FAKE_BYTES: u64 = 400 << 20;

impl Running for FakeRunning {
    fn bytes(&self) -> Option<u64> {
        Some(FAKE_BYTES)
    }

    fn poll(&mut self) -> Option<Result<(), String>> {
        self.polls += 1;
        if self.polls < 2 {
            return None;
        }
        if self.fail {
            return Some(Err("xl migrate ended with exit status: 1".into()));
        }
        if let Ok(Some(domid)) = self.xl.domid(&self.guest) {
            self.xl.remove_domain(domid);
        }
        Some(Ok(()))
    }
}
