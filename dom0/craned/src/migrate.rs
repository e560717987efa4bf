//! The migration choreography, the one place that knows its order. Both
//! triggers use it: the xl wrapper (through craned's control socket) and the
//! XenStore trigger (crate::admin, which runs `xl migrate` itself).
//!
//! Source host: [`Migration::pre_migrate`] asks the guest agent to move its
//! processes off the GPU (remote: to crane-proxy, with the proxy's address and
//! the guest's token; stop-and-copy: parked in RAM), waits for
//! `ready-for-detach`, detaches the GPU and leaves it assignable in the pool.
//! Then the caller runs `xl migrate` (or `xl save`) and reports:
//! [`Migration::migrated`] when the domain left, [`Migration::roll_back`]
//! when it is still here (GPU attached again, prepare-resume).
//!
//! Destination host: [`Migration::receive`] attaches a free GPU of the pool
//! and posts prepare-resume; with none free it waits (policy `wait`: the
//! supervision loop retries) or refuses.
//!
//! Every step is written to the journal (crate::journal) before it is taken
//! and is idempotent (a device already attached is not attached again, a
//! request already answered is answered again by the agent), so
//! [`Migration::recover`] can take up any entry after a restart: source
//! entries are rolled back unless the domain left (done) or the wrapper that
//! runs xl is still alive (its report decides); destination entries are
//! carried forward.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crane_libxl::{LibxlError, PciAddr, Xl};
use crane_xs::dom0::{Dom0Error, GuestChannel};
use crane_xs::message::{
    AppOutcome, AppResult, GuestState, MigrateMode, Op, Outcome, Response, ResumeTarget,
};
use crane_xs::{XenStore, XsError};
use craned_control::Mode;

use crate::config::{Config, NoFreeGpu};
use crate::journal::{self, Entry, JournalError, Phase};
use crate::proxy::HealthCheck;
use crate::ratelimit::limited;
use crate::tokens;

/// prepare-resume attempts on arrival, the first included, before the
/// journal entry is given up (the error stays in `crane status`).
pub const RESUME_TRIES: u32 = 10;

/// The wait before attempt `tries + 1`: 5 s, doubling, at most 5 minutes.
fn resume_backoff(tries: u32) -> Duration {
    Duration::from_secs((5u64 << tries.saturating_sub(1).min(6)).min(300))
}

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0} is not a guest crane manages (craned.toml, guests)")]
    NotManaged(String),
    #[error("no domain {0} runs on this host")]
    NoDomain(String),
    #[error("a migration of {guest} is already under way here (phase {phase})")]
    Busy { guest: String, phase: &'static str },
    #[error("remote mode is not available: {0}")]
    NoRemote(&'static str),
    #[error(
        "crane-proxy does not answer at {address} ({error}); the migration is \
         refused and nothing was changed"
    )]
    ProxyDown { address: String, error: String },
    #[error(
        "the guest agent of {guest} did not publish its state within {ms} ms \
         (is crane-agent running in the guest?)"
    )]
    NoAgent { guest: String, ms: u64 },
    #[error(
        "the guest agent of {guest} did not take {op} within {ms} ms \
         (crane-agent is not running, stopped or stuck in the guest)"
    )]
    NotTaken {
        guest: String,
        op: &'static str,
        ms: u64,
    },
    #[error("the guest agent of {guest} did not answer {op} within {ms} ms")]
    AgentTimeout {
        guest: String,
        op: &'static str,
        ms: u64,
    },
    #[error("the guest agent of {guest} answered {outcome} to {op}: {error}")]
    AgentFailed {
        guest: String,
        op: &'static str,
        outcome: &'static str,
        error: String,
    },
    #[error("detaching GPU {gpu} from {guest} failed: {source}")]
    Detach {
        guest: String,
        gpu: PciAddr,
        source: LibxlError,
    },
    #[error("attaching GPU {gpu} to {guest} failed: {source}")]
    Attach {
        guest: String,
        gpu: PciAddr,
        source: LibxlError,
    },
    #[error("no GPU of the pool is free for {0}")]
    NoFreeGpu(String),
    #[error(
        "{guest} (domain {domid}) still runs on this host, so it did not leave; \
         post-migrate-failed resumes it here"
    )]
    StillHere { guest: String, domid: u32 },
    #[error("{0} is no longer on this host; nothing to roll back")]
    Gone(String),
    #[error("{cause}; {rollback}")]
    RolledBack {
        cause: Box<MigrateError>,
        rollback: String,
    },
    #[error(transparent)]
    Xl(#[from] LibxlError),
    #[error(transparent)]
    Xs(#[from] XsError),
    #[error("XenStore: {0}")]
    Channel(#[from] Dom0Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// What pre-migrate did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    pub guest: String,
    pub domid: u32,
    /// The GPUs detached (now free in the pool).
    pub gpus: Vec<PciAddr>,
}

/// What receive (or a rollback) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// The guest runs on this GPU again (none: it had none to get back).
    Resumed(Option<PciAddr>),
    /// No GPU free: the guest stays on the proxy (or parked) and the
    /// supervision loop attaches one when it frees.
    Waiting,
    /// No GPU free: the guest's processes run on its own CPU OpenCL device
    /// (`no_free_gpu = "cpu"`); the supervision loop attaches a GPU when one
    /// frees and moves them back.
    OnCpu,
}

/// What [`Migration::recover`] did with one journal entry.
#[derive(Debug)]
pub enum Recovered {
    /// The domain left this host: the migration is over.
    Departed,
    /// The wrapper running xl is alive; its report will decide.
    Left,
    RolledBack(Result<Attached, MigrateError>),
    Received(Result<Attached, MigrateError>),
}

/// One operation's view of the world: XenStore, the toolstack, the
/// configuration and the token secret, and where progress goes.
pub struct Migration<'a, S, X> {
    pub store: &'a S,
    pub xl: &'a X,
    pub cfg: &'a Config,
    pub secret: Option<&'a [u8]>,
    /// Told each phase as it starts (phase, detail).
    pub progress: &'a mut dyn FnMut(&str, Option<String>),
    /// What the guest's processes did in each answer the agent gave, in
    /// order (their stoppage times).
    pub answers: Vec<Answered>,
    /// Asked before a remote pre-migrate: does crane-proxy answer?
    pub proxy_check: Option<&'a HealthCheck>,
}

/// One final answer of the agent and its per-process results.
#[derive(Debug, Clone)]
pub struct Answered {
    pub guest: String,
    pub op: &'static str,
    /// The agent's own time for the whole operation.
    pub ms: f64,
    pub apps: Vec<AppResult>,
}

impl Answered {
    /// The longest time one process was stopped by the operation: its switch
    /// (to remote, to RAM, or back), as the process measured it. `None` when
    /// no process moved.
    pub fn longest_stop_ms(&self) -> Option<f64> {
        self.apps
            .iter()
            .filter(|a| {
                matches!(
                    a.outcome,
                    AppOutcome::Remote | AppOutcome::Suspended | AppOutcome::Passthrough
                )
            })
            .map(|a| a.ms)
            .reduce(f64::max)
    }

    /// One line for the operator: what the processes did and how long the
    /// longest was stopped.
    pub fn summary(&self) -> String {
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        for a in &self.apps {
            *counts.entry(a.outcome.as_str()).or_default() += 1;
        }
        let what = if counts.is_empty() {
            "no OpenCL processes".to_string()
        } else {
            counts
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.longest_stop_ms() {
            Some(ms) => format!("{what}; longest stop {ms:.0} ms (agent {:.0} ms)", self.ms),
            None => format!("{what} (agent {:.0} ms)", self.ms),
        }
    }
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

/// How a rollback went, for the error or result that reports it.
pub(crate) fn rollback_text(r: Result<Attached, MigrateError>) -> String {
    match r {
        Ok(Attached::Resumed(_)) => "rolled back: the guest kept its GPU".to_string(),
        Ok(Attached::Waiting) => {
            "rolled back, but no GPU is free: the guest waits for one".to_string()
        }
        Ok(Attached::OnCpu) => {
            "rolled back, but no GPU is free: its programs run on its CPU until one frees"
                .to_string()
        }
        // The GPUs are attached again before prepare-resume is posted.
        Err(MigrateError::NotTaken {
            op: "prepare-resume",
            ms,
            ..
        }) => format!(
            "rolled back as far as dom0 can: the guest has its GPU; prepare-resume \
             waits for its agent, which did not take it within {ms} ms, and \
             will bring back whatever the agent had moved off the GPU once it runs"
        ),
        Err(e) => format!("the rollback failed too: {e}"),
    }
}

fn domid16(domid: u32) -> u16 {
    u16::try_from(domid).unwrap_or(u16::MAX)
}

/// The outcome of receiving one guest.
pub type Received = Result<Attached, MigrateError>;

impl<'a, S: XenStore, X: Xl> Migration<'a, S, X> {
    pub fn new(
        store: &'a S,
        xl: &'a X,
        cfg: &'a Config,
        secret: Option<&'a [u8]>,
        progress: &'a mut dyn FnMut(&str, Option<String>),
    ) -> Self {
        Migration {
            store,
            xl,
            cfg,
            secret,
            progress,
            answers: Vec::new(),
            proxy_check: None,
        }
    }

    /// Checks crane-proxy (at `cfg.proxy.address`) before every remote
    /// pre-migrate, so a migration that could not run remotely is refused
    /// before anything changes.
    pub fn with_proxy_check(mut self, check: &'a HealthCheck) -> Self {
        self.proxy_check = Some(check);
        self
    }

    /// The longest stop of the first answer to `op` in this run.
    pub fn stop_ms(&self, op: &str) -> Option<f64> {
        self.answers
            .iter()
            .find(|a| a.op == op)
            .and_then(Answered::longest_stop_ms)
    }

    fn step(&mut self, phase: &str, detail: Option<String>) {
        (self.progress)(phase, detail);
    }

    /// A guest named by name or domid → (name, domid); it must be managed
    /// and running here.
    pub fn resolve(&self, guest: &str) -> Result<(String, u32), MigrateError> {
        if !guest.is_empty() && guest.bytes().all(|b| b.is_ascii_digit()) {
            let domid: u32 = guest
                .parse()
                .map_err(|_| MigrateError::NoDomain(guest.to_string()))?;
            let info = self
                .xl
                .domain_info(domid)?
                .ok_or_else(|| MigrateError::NoDomain(guest.to_string()))?;
            if !self.cfg.manages(&info.name) {
                return Err(MigrateError::NotManaged(info.name));
            }
            return Ok((info.name, domid));
        }
        if !self.cfg.manages(guest) {
            return Err(MigrateError::NotManaged(guest.to_string()));
        }
        let domid = self
            .xl
            .domid(guest)?
            .ok_or_else(|| MigrateError::NoDomain(guest.to_string()))?;
        Ok((guest.to_string(), domid))
    }

    /// Pool GPUs passed through to `domid`.
    fn pool_gpus_of(&self, domid: u32) -> Result<Vec<PciAddr>, MigrateError> {
        let pool: BTreeSet<_> = self.cfg.pool().iter().collect();
        Ok(self
            .xl
            .pci_list(domid)?
            .into_iter()
            .filter(|g| pool.contains(g))
            .collect())
    }

    /// Which domain holds each passed-through device.
    pub fn holders(&self) -> Result<BTreeMap<PciAddr, (u32, String)>, MigrateError> {
        let mut out = BTreeMap::new();
        for d in self.xl.domains()? {
            if d.domid == 0 {
                continue;
            }
            for gpu in self.xl.pci_list(d.domid)? {
                out.insert(gpu, (d.domid, d.name.clone()));
            }
        }
        Ok(out)
    }

    /// Pool GPUs no domain holds and no journal entry is attaching.
    pub fn free_gpus(&self) -> Result<Vec<PciAddr>, MigrateError> {
        let held = self.holders()?;
        let mut reserved = BTreeSet::new();
        for g in journal::guests(self.store)? {
            if let Ok(Some(e)) = journal::load(self.store, &g)
                && matches!(e.phase, Phase::Attaching | Phase::RollingBack)
            {
                reserved.extend(e.gpus);
            }
        }
        Ok(self
            .cfg
            .pool()
            .iter()
            .filter(|g| !held.contains_key(g) && !reserved.contains(g))
            .copied()
            .collect())
    }

    fn channel(&self, domid: u32) -> GuestChannel<'_, S> {
        GuestChannel::new(self.store, domid16(domid))
    }

    fn wait_agent(&mut self, guest: &str, domid: u32) -> Result<(), MigrateError> {
        let chan = self.channel(domid);
        chan.setup()?;
        if chan.agent_state()?.is_some() {
            return Ok(());
        }
        self.step("agent", Some("waiting for the guest agent".into()));
        let chan = self.channel(domid);
        match chan.wait_agent(ms(self.cfg.agent_timeout_ms))? {
            Some(_) => Ok(()),
            None => Err(MigrateError::NoAgent {
                guest: guest.to_string(),
                ms: self.cfg.agent_timeout_ms,
            }),
        }
    }

    /// Posts `op` and waits for its final answer.
    fn ask(
        &mut self,
        guest: &str,
        domid: u32,
        entry: &mut Entry,
        op: Op,
        deadline_ms: u64,
    ) -> Result<Response, MigrateError> {
        let name = op.name();
        let chan = self.channel(domid);
        let req = chan.post(op, Some(deadline_ms))?;
        entry.seq = req.seq;
        journal::save(self.store, guest, entry)?;
        match chan.wait_taken(req.seq, ms(self.cfg.agent_ack_ms)) {
            Ok(()) => {}
            Err(Dom0Error::NotTaken { .. }) => {
                return Err(MigrateError::NotTaken {
                    guest: guest.to_string(),
                    op: name,
                    ms: self.cfg.agent_ack_ms,
                });
            }
            Err(e) => return Err(e.into()),
        }
        match chan.wait_answer(req.seq, ms(deadline_ms + self.cfg.answer_grace_ms)) {
            Ok(r) => {
                // The guest wrote these; a malformed set only costs the figures.
                let apps = chan.app_results(req.seq).unwrap_or_else(|e| {
                    limited!(log::Level::Warn, "{guest}: per-process results: {e}");
                    Vec::new()
                });
                let answered = Answered {
                    guest: guest.to_string(),
                    op: name,
                    ms: r.ms,
                    apps,
                };
                self.step(&format!("{name} answered"), Some(answered.summary()));
                self.answers.push(answered);
                Ok(r)
            }
            Err(Dom0Error::Timeout { .. }) => Err(MigrateError::AgentTimeout {
                guest: guest.to_string(),
                op: name,
                ms: deadline_ms + self.cfg.answer_grace_ms,
            }),
            Err(e) => Err(e.into()),
        }
    }

    fn agent_failed(guest: &str, op: &'static str, r: &Response) -> MigrateError {
        let error = r.error.clone().unwrap_or_else(|| "no reason given".into());
        limited!(
            log::Level::Warn,
            "{guest}: the agent answered {} to {op}: {error}",
            r.outcome.as_str()
        );
        MigrateError::AgentFailed {
            guest: guest.to_string(),
            op,
            outcome: r.outcome.as_str(),
            error,
        }
    }

    fn migrate_op(&self, guest: &str, mode: Mode) -> Result<Op, MigrateError> {
        Ok(Op::PrepareMigrate(match mode {
            Mode::StopAndCopy => MigrateMode::StopAndCopy,
            Mode::Remote => {
                if self.cfg.proxy.address.is_empty() {
                    return Err(MigrateError::NoRemote("proxy.address is not configured"));
                }
                let secret = self.secret.ok_or(MigrateError::NoRemote(
                    "no token secret (tokens.secret_file) to derive the guest's token",
                ))?;
                MigrateMode::Remote {
                    proxy: self.cfg.proxy.address.clone(),
                    token: Some(tokens::derive(secret, guest, self.cfg.tokens.epoch)),
                }
            }
        }))
    }

    /// Source, before `xl migrate`/`xl save`: processes off the GPU, GPU
    /// detached and back in the pool. A repeat of a completed pre-migrate
    /// with the same mode answers at once. On failure everything is rolled
    /// back and the error says both what failed and how the rollback went.
    pub fn pre_migrate(
        &mut self,
        guest: &str,
        dest: &str,
        mode: Mode,
        owner: Option<u32>,
    ) -> Result<Detached, MigrateError> {
        let (name, domid) = self.resolve(guest)?;
        if let Some(e) = journal::load(self.store, &name)? {
            if e.phase == Phase::Detached && e.mode == Some(mode) && e.domid == domid {
                let mut e = e;
                e.owner = owner.or(e.owner);
                journal::save(self.store, &name, &e)?;
                return Ok(Detached {
                    guest: name,
                    domid,
                    gpus: e.gpus,
                });
            }
            return Err(MigrateError::Busy {
                guest: name,
                phase: e.phase.as_str(),
            });
        }
        let op = self.migrate_op(&name, mode)?;
        if let (Mode::Remote, Some(check)) = (mode, self.proxy_check) {
            self.step("proxy", Some(self.cfg.proxy.address.clone()));
            check(
                &self.cfg.proxy.address,
                ms(self.cfg.proxy.health_timeout_ms),
            )
            .map_err(|e| MigrateError::ProxyDown {
                address: self.cfg.proxy.address.clone(),
                error: e,
            })?;
        }
        let mut entry = Entry::new(Phase::Preparing, domid);
        entry.mode = Some(mode);
        entry.dest = Some(dest.to_string());
        entry.owner = owner;
        entry.gpus = self.pool_gpus_of(domid)?;
        journal::save(self.store, &name, &entry)?;
        log::info!(
            "{name} (domain {domid}): pre-migrate to {dest}, {}, GPUs {:?}",
            mode.as_str(),
            entry.gpus
        );

        if let Err(cause) = self.prepare(&name, domid, &mut entry, op) {
            return Err(self.fail(&name, &mut entry, cause));
        }

        entry.phase = Phase::Detaching;
        journal::save(self.store, &name, &entry)?;
        for gpu in entry.gpus.clone() {
            self.step("detach", Some(gpu.to_string()));
            let attached = self.xl.pci_list(domid)?;
            if attached.contains(&gpu)
                && let Err(source) = self.xl.pci_detach(domid, gpu)
            {
                let cause = MigrateError::Detach {
                    guest: name.clone(),
                    gpu,
                    source,
                };
                return Err(self.fail(&name, &mut entry, cause));
            }
            // pci remove leaves the device on pciback; making sure keeps it
            // in the pool even if something unbound it meanwhile.
            if let Err(e) = self.xl.pci_assignable_add(gpu, false) {
                log::warn!("{name}: GPU {gpu} detached but not assignable again: {e}");
            }
        }
        entry.phase = Phase::Detached;
        journal::save(self.store, &name, &entry)?;
        log::info!("{name}: detached; xl may move the domain now");
        Ok(Detached {
            guest: name,
            domid,
            gpus: entry.gpus,
        })
    }

    fn prepare(
        &mut self,
        guest: &str,
        domid: u32,
        entry: &mut Entry,
        op: Op,
    ) -> Result<(), MigrateError> {
        self.wait_agent(guest, domid)?;
        self.step("prepare-migrate", None);
        let r = self.ask(guest, domid, entry, op, self.cfg.migrate_deadline_ms)?;
        match r.outcome {
            Outcome::ReadyForDetach => Ok(()),
            _ => Err(Self::agent_failed(guest, "prepare-migrate", &r)),
        }
    }

    /// Rolls back after `cause` and folds both into one error.
    fn fail(&mut self, guest: &str, entry: &mut Entry, cause: MigrateError) -> MigrateError {
        log::warn!("{guest}: {cause}; rolling back");
        let rollback = if matches!(cause, MigrateError::NotTaken { .. }) {
            self.withdraw(guest, entry)
        } else {
            rollback_text(self.roll_back_entry(guest, entry))
        };
        MigrateError::RolledBack {
            cause: Box::new(cause),
            rollback,
        }
    }

    /// After the agent did not take prepare-migrate (nothing was detached,
    /// nothing moved in the guest): puts prepare-resume in its place, so that
    /// the agent, once it runs again, keeps its programs on the GPU instead
    /// of moving them off it for a migration that was given up. Waits for
    /// nothing: the agent is known not to answer.
    fn withdraw(&mut self, guest: &str, entry: &mut Entry) -> String {
        let posted = self
            .channel(entry.domid)
            .post(Op::RESUME, Some(self.cfg.resume_deadline_ms));
        if let Err(e) = journal::remove(self.store, guest) {
            log::warn!("{guest}: cannot remove the journal entry: {e}");
        }
        match posted {
            Ok(req) => format!(
                "nothing was changed: the guest kept its GPU, and prepare-resume \
                 (request {}) replaces the request its agent never took",
                req.seq
            ),
            Err(e) => format!(
                "the guest kept its GPU, but the request could not be withdrawn ({e}): \
                 its agent may still act on it once it runs; post prepare-resume"
            ),
        }
    }

    /// Source, after a failed `xl migrate`/`xl save` (or `xl save -c`): GPU
    /// attached again, processes resumed on it.
    pub fn roll_back(&mut self, guest: &str) -> Result<Attached, MigrateError> {
        if !self.cfg.manages(guest) {
            return Err(MigrateError::NotManaged(guest.to_string()));
        }
        let Some(mut entry) = journal::load(self.store, guest)? else {
            // Nothing under way; the guest may still have been detached by
            // an earlier craned whose journal was lost: bring it back if so.
            let (name, domid) = self.resolve(guest)?;
            let mut entry = Entry::new(Phase::RollingBack, domid);
            entry.gpus = self.pool_gpus_of(domid)?;
            return self.roll_back_entry(&name, &mut entry);
        };
        if !entry.phase.is_source() {
            return Err(MigrateError::Busy {
                guest: guest.to_string(),
                phase: entry.phase.as_str(),
            });
        }
        self.roll_back_entry(guest, &mut entry)
    }

    fn roll_back_entry(
        &mut self,
        guest: &str,
        entry: &mut Entry,
    ) -> Result<Attached, MigrateError> {
        let domid = entry.domid;
        let alive = self
            .xl
            .domain_info(domid)?
            .is_some_and(|d| d.state.is_alive());
        if !alive {
            journal::remove(self.store, guest)?;
            return Err(MigrateError::Gone(guest.to_string()));
        }
        entry.phase = Phase::RollingBack;
        journal::save(self.store, guest, entry)?;
        let mut gpus = Vec::new();
        for gpu in entry.gpus.clone() {
            match self.attach_one(guest, domid, gpu, true)? {
                Some(g) => gpus.push(g),
                None => {
                    if self.cfg.no_free_gpu != NoFreeGpu::Refuse {
                        return self.without_gpu(guest, domid, entry);
                    }
                    journal::remove(self.store, guest)?;
                    return Err(MigrateError::NoFreeGpu(guest.to_string()));
                }
            }
        }
        entry.gpus = gpus.clone();
        let target = Self::back_on_gpu(entry);
        entry.phase = Phase::Resuming;
        journal::save(self.store, guest, entry)?;
        let result = self.resume(guest, domid, entry, target);
        journal::remove(self.store, guest)?;
        result.map(|()| Attached::Resumed(gpus.first().copied()))
    }

    /// Makes sure `gpu` (or, when another domain took it and `substitute`,
    /// another free one) is attached to `domid`. `None`: none available.
    fn attach_one(
        &mut self,
        guest: &str,
        domid: u32,
        gpu: PciAddr,
        substitute: bool,
    ) -> Result<Option<PciAddr>, MigrateError> {
        if self.xl.pci_list(domid)?.contains(&gpu) {
            return Ok(Some(gpu));
        }
        let holders = self.holders()?;
        let gpu = if holders.contains_key(&gpu) {
            if !substitute {
                return Ok(None);
            }
            match self.free_gpus()?.first() {
                Some(g) => *g,
                None => return Ok(None),
            }
        } else {
            gpu
        };
        self.step("attach", Some(gpu.to_string()));
        let attach = || -> Result<(), LibxlError> {
            self.xl.pci_assignable_add(gpu, false)?;
            self.xl.pci_attach(domid, gpu)
        };
        attach().map_err(|source| MigrateError::Attach {
            guest: guest.to_string(),
            gpu,
            source,
        })?;
        log::info!("{guest} (domain {domid}): GPU {gpu} attached");
        Ok(Some(gpu))
    }

    /// What a guest that gets a GPU asks its processes: back where they
    /// were, or (they ran on the CPU meanwhile) back onto the devices they
    /// started on.
    fn back_on_gpu(entry: &Entry) -> ResumeTarget {
        if entry.on_cpu {
            ResumeTarget::home()
        } else {
            ResumeTarget::default()
        }
    }

    /// No GPU for the guest now: it waits for one on the proxy (`wait`), or
    /// its processes go to its own CPU until one frees (`cpu`). The journal
    /// keeps it either way, for the supervision loop.
    fn without_gpu(
        &mut self,
        guest: &str,
        domid: u32,
        entry: &mut Entry,
    ) -> Result<Attached, MigrateError> {
        if self.cfg.no_free_gpu == NoFreeGpu::Cpu {
            // Tried once: from then on the resume that brings a GPU sends
            // every process home, also those that could not go to the CPU
            // (they wait parked, or on the proxy, as with `wait`).
            if !entry.on_cpu {
                entry.on_cpu = true;
                log::info!("{guest}: no GPU free; its programs go to its CPU until one frees");
                let target = ResumeTarget::cpu_without_gpu();
                entry.phase = match self.resume(guest, domid, entry, target) {
                    Ok(()) => Phase::OnCpu,
                    Err(e) => {
                        log::warn!(
                            "{guest}: not every program could go to its CPU ({e}); those wait for a GPU"
                        );
                        Phase::WaitingGpu
                    }
                };
                entry.gpus.clear();
                journal::save(self.store, guest, entry)?;
            }
            return Ok(if entry.phase == Phase::OnCpu {
                Attached::OnCpu
            } else {
                Attached::Waiting
            });
        }
        if entry.phase != Phase::WaitingGpu {
            log::info!("{guest}: no GPU free; it waits on the proxy until one frees");
        }
        entry.phase = Phase::WaitingGpu;
        entry.gpus.clear();
        journal::save(self.store, guest, entry)?;
        Ok(Attached::Waiting)
    }

    /// prepare-resume unless the agent is already in passthrough with no
    /// request pending and `target` moves nothing. A request the agent has
    /// not finished (or not even taken: a stopped agent) is superseded by
    /// prepare-resume, so that an agent that wakes up later finds that
    /// instead of a move nobody runs.
    fn resume(
        &mut self,
        guest: &str,
        domid: u32,
        entry: &mut Entry,
        target: ResumeTarget,
    ) -> Result<(), MigrateError> {
        self.wait_agent(guest, domid)?;
        let chan = self.channel(domid);
        if target == ResumeTarget::default()
            && let Some(s) = chan.agent_state()?
            && s.state == GuestState::Passthrough
            && !chan.outstanding()?
        {
            return Ok(());
        }
        self.step("prepare-resume", target.device.clone());
        let on_cpu = target.no_gpu;
        let r = self.ask(
            guest,
            domid,
            entry,
            Op::PrepareResume(target),
            self.cfg.resume_deadline_ms,
        )?;
        match r.outcome {
            Outcome::Resumed => {
                if on_cpu {
                    log::info!("{guest}: resumed on its CPU in {:.0} ms", r.ms);
                } else {
                    log::info!("{guest}: resumed on its GPU in {:.0} ms", r.ms);
                }
                Ok(())
            }
            _ => Err(Self::agent_failed(guest, "prepare-resume", &r)),
        }
    }

    /// Source, after `xl migrate`/`xl save` succeeded: the domain left.
    pub fn migrated(&mut self, guest: &str) -> Result<Option<String>, MigrateError> {
        if !self.cfg.manages(guest) {
            return Err(MigrateError::NotManaged(guest.to_string()));
        }
        let Some(entry) = journal::load(self.store, guest)? else {
            return Ok(None);
        };
        if let Some(d) = self.xl.domain_info(entry.domid)?
            && d.state.is_alive()
            && d.name == guest
        {
            return Err(MigrateError::StillHere {
                guest: guest.to_string(),
                domid: entry.domid,
            });
        }
        journal::remove(self.store, guest)?;
        log::info!(
            "{guest}: left this host for {}",
            entry.dest.as_deref().unwrap_or("?")
        );
        Ok(entry.dest)
    }

    /// Destination: may a guest arrive now?
    pub fn check_receive(&self) -> Result<(), MigrateError> {
        if self.cfg.no_free_gpu == NoFreeGpu::Refuse && self.free_gpus()?.is_empty() {
            return Err(MigrateError::NoFreeGpu("an arriving guest".into()));
        }
        Ok(())
    }

    /// Destination, once the domain arrived (also after `xl restore`): a
    /// free GPU attached, processes resumed on it. A prepare-resume the
    /// agent fails or does not answer leaves the GPU attached and the entry
    /// in the journal (phase `resuming`): later ticks ([`Self::recover`])
    /// try it again, 5 s after, then twice as long each time up to 5
    /// minutes, [`RESUME_TRIES`] attempts in all (a driver that takes long
    /// to come up, an agent restarted meanwhile).
    pub fn receive(&mut self, guest: &str) -> Result<Attached, MigrateError> {
        let (name, domid) = self.resolve(guest)?;
        let mut entry = match journal::load(self.store, &name)? {
            Some(e) if e.domid == domid && !e.phase.is_source() => e,
            Some(e) if e.domid == domid => {
                return Err(MigrateError::Busy {
                    guest: name,
                    phase: e.phase.as_str(),
                });
            }
            // No entry, or one about an earlier domain of that name.
            _ => Entry::new(Phase::Receiving, domid),
        };
        journal::save(self.store, &name, &entry)?;
        let result = self.receive_entry(&name, domid, &mut entry);
        match &result {
            Ok(Attached::Waiting | Attached::OnCpu) => {}
            // The GPU is attached and the processes wait for it: the resume
            // is tried again on later ticks, further and further apart, up
            // to RESUME_TRIES attempts in all.
            Err(
                e @ (MigrateError::AgentFailed { .. }
                | MigrateError::AgentTimeout { .. }
                | MigrateError::NotTaken { .. }
                | MigrateError::NoAgent { .. }),
            ) if entry.phase == Phase::Resuming && entry.tries + 1 < RESUME_TRIES => {
                entry.tries += 1;
                let wait = resume_backoff(entry.tries);
                entry.retry_ms = journal::now_ms() + wait.as_millis() as u64;
                journal::save(self.store, &name, &entry)?;
                log::warn!(
                    "{name}: {e}; trying prepare-resume again in {} s (attempt {} of {RESUME_TRIES})",
                    wait.as_secs(),
                    entry.tries + 1
                );
            }
            _ => journal::remove(self.store, &name)?,
        }
        result
    }

    fn receive_entry(
        &mut self,
        guest: &str,
        domid: u32,
        entry: &mut Entry,
    ) -> Result<Attached, MigrateError> {
        self.wait_agent(guest, domid)?;
        let have = self.pool_gpus_of(domid)?;
        let gpu = if let Some(g) = have.first() {
            *g
        } else {
            let wanted = entry.gpus.first().copied();
            let free = self.free_gpus()?;
            let pick = match wanted {
                Some(w) if free.contains(&w) || entry.phase == Phase::Attaching => Some(w),
                _ => free.first().copied(),
            };
            let Some(gpu) = pick else {
                if self.cfg.no_free_gpu == NoFreeGpu::Refuse {
                    return Err(MigrateError::NoFreeGpu(guest.to_string()));
                }
                return self.without_gpu(guest, domid, entry);
            };
            entry.phase = Phase::Attaching;
            entry.gpus = vec![gpu];
            journal::save(self.store, guest, entry)?;
            match self.attach_one(guest, domid, gpu, false)? {
                Some(g) => g,
                None => return Err(MigrateError::NoFreeGpu(guest.to_string())),
            }
        };
        entry.gpus = vec![gpu];
        let target = Self::back_on_gpu(entry);
        entry.phase = Phase::Resuming;
        journal::save(self.store, guest, entry)?;
        self.resume(guest, domid, entry, target)?;
        Ok(Attached::Resumed(Some(gpu)))
    }

    /// Managed guests running here that may wait for a GPU nobody will
    /// bring them: no pool GPU and no journal entry speaks for them, by name
    /// with their domain. Taken when craned starts: a guest received while
    /// craned was not running (the xl wrapper then lets it arrive without
    /// crane, its programs carrying on on crane-proxy or parked) is one.
    /// Their keys are set up so that their agents publish their state.
    pub fn unattended(&self) -> Result<BTreeMap<String, u32>, MigrateError> {
        let journaled: BTreeSet<String> = journal::guests(self.store)?.into_iter().collect();
        let mut out = BTreeMap::new();
        for guest in &self.cfg.guests {
            if journaled.contains(guest) {
                continue;
            }
            let Some(domid) = self.xl.domid(guest)? else {
                continue;
            };
            if self.pool_gpus_of(domid)?.is_empty() {
                self.channel(domid).setup()?;
                out.insert(guest.clone(), domid);
            }
        }
        Ok(out)
    }

    /// Of the [`unattended`](Self::unattended) guests, receives (as the
    /// wrapper would have) each whose agent says `detached`, and forgets it
    /// and those that need nothing (another state, gone, a GPU or a journal
    /// entry since); keeps those whose agent has said nothing yet.
    pub fn adopt_waiting(
        &mut self,
        candidates: &mut BTreeMap<String, u32>,
    ) -> Result<Vec<(String, Received)>, MigrateError> {
        let mut out = Vec::new();
        for (guest, domid) in std::mem::take(candidates) {
            let still = self.xl.domid(&guest)? == Some(domid)
                && journal::load(self.store, &guest)?.is_none()
                && self.pool_gpus_of(domid)?.is_empty();
            if !still {
                continue;
            }
            match self.channel(domid).agent_state()? {
                None => {
                    candidates.insert(guest, domid);
                }
                Some(s) if matches!(s.state, GuestState::Detached(_)) => {
                    log::warn!(
                        "{guest}: detached, without a GPU and without a journal entry (it \
                         arrived while craned was not running?): receiving it"
                    );
                    let r = self.receive(&guest);
                    out.push((guest, r));
                }
                Some(_) => {}
            }
        }
        Ok(out)
    }

    /// Takes up every journal entry: at start (after a restart) and on each
    /// supervision tick. `owner_alive` tells whether the wrapper process that
    /// asked for a pre-migrate still runs.
    pub fn recover(
        &mut self,
        owner_alive: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<(String, Recovered)>, MigrateError> {
        let mut out = Vec::new();
        for guest in journal::guests(self.store)? {
            let mut entry = match journal::load(self.store, &guest) {
                Ok(Some(e)) => e,
                Ok(None) => continue,
                Err(e) => {
                    log::error!("{e}; removing it");
                    journal::remove(self.store, &guest)?;
                    continue;
                }
            };
            let here = self
                .xl
                .domain_info(entry.domid)?
                .is_some_and(|d| d.state.is_alive() && d.name == guest);
            let outcome = match entry.phase {
                _ if !here => {
                    journal::remove(self.store, &guest)?;
                    Recovered::Departed
                }
                Phase::Detached if entry.owner.is_some_and(owner_alive) => Recovered::Left,
                Phase::Preparing | Phase::Detaching | Phase::Detached | Phase::RollingBack => {
                    log::warn!(
                        "{guest}: migration left in phase {}; rolling back",
                        entry.phase.as_str()
                    );
                    Recovered::RolledBack(self.roll_back_entry(&guest, &mut entry))
                }
                // A failed resume, not due again yet.
                Phase::Resuming if entry.retry_ms > journal::now_ms() => continue,
                Phase::Receiving
                | Phase::WaitingGpu
                | Phase::OnCpu
                | Phase::Attaching
                | Phase::Resuming => {
                    if !matches!(entry.phase, Phase::WaitingGpu | Phase::OnCpu) {
                        log::warn!(
                            "{guest}: receive left in phase {}; carrying it on",
                            entry.phase.as_str()
                        );
                    }
                    Recovered::Received(self.receive(&guest))
                }
            };
            out.push((guest, outcome));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeAgent, FakeXl, OnMigrate, OnResume, gpu};
    use crane_libxl::DomainState;
    use crane_xs::mem::{MemConn, MemStore};
    use crane_xs::message::DetachKind;
    use std::time::Instant;

    const SECRET: &[u8] = b"0123456789abcdef-shared";
    const GPU_A: &str = "0000:00:05.0";
    const GPU_B: &str = "0000:00:06.0";

    fn config() -> Config {
        let mut cfg = Config {
            guests: vec!["g1".into(), "g2".into()],
            ..Config::default()
        };
        cfg.gpus.pool = vec![gpu(GPU_A), gpu(GPU_B)];
        cfg.proxy.address = "tcp://10.77.0.2:7000".into();
        cfg.agent_timeout_ms = 3_000;
        cfg.migrate_deadline_ms = 3_000;
        cfg.resume_deadline_ms = 3_000;
        cfg.answer_grace_ms = 200;
        cfg
    }

    struct World {
        store: MemStore,
        dom0: MemConn,
        xl: FakeXl,
        cfg: Config,
        phases: Vec<String>,
        /// The detail of the latest "... answered" phase.
        last_answer: String,
    }

    impl World {
        fn new(cfg: Config) -> World {
            let store = MemStore::new();
            let dom0 = store.connect(0);
            World {
                store,
                dom0,
                xl: FakeXl::default(),
                cfg,
                phases: Vec::new(),
                last_answer: String::new(),
            }
        }

        /// A running guest domain with an agent.
        fn guest(&self, name: &str, domid: u32, gpus: &[&str], state: GuestState) -> FakeAgent {
            self.guest_with(name, domid, gpus, state, OnMigrate::Detach)
        }

        fn guest_with(
            &self,
            name: &str,
            domid: u32,
            gpus: &[&str],
            state: GuestState,
            on_migrate: OnMigrate,
        ) -> FakeAgent {
            let gpus: Vec<PciAddr> = gpus.iter().map(|g| gpu(g)).collect();
            self.xl.add_domain(name, domid, &gpus);
            self.store.introduce(domid as u16);
            FakeAgent::start(&self.store, domid as u16, state, on_migrate)
        }

        fn run<T>(&mut self, f: impl FnOnce(&mut Migration<'_, MemConn, FakeXl>) -> T) -> T {
            let (phases, last) = (&mut self.phases, &mut self.last_answer);
            let mut progress = |p: &str, d: Option<String>| {
                if p.ends_with(" answered") {
                    *last = d.unwrap_or_default();
                }
                phases.push(p.to_string());
            };
            let mut m =
                Migration::new(&self.dom0, &self.xl, &self.cfg, Some(SECRET), &mut progress);
            f(&mut m)
        }

        /// The phases reported, without the wait for an agent that had not
        /// published its state yet (a matter of thread timing here).
        fn steps(&self) -> Vec<&str> {
            self.phases
                .iter()
                .map(String::as_str)
                .filter(|p| *p != "agent")
                .collect()
        }

        fn journal(&self, guest: &str) -> Option<Entry> {
            journal::load(&self.dom0, guest).unwrap()
        }
    }

    #[test]
    fn remote_migration_detaches_the_gpu_and_hands_out_proxy_and_token() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        let d = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::Remote, Some(77)))
            .unwrap();
        assert_eq!(d.gpus, [gpu(GPU_A)]);
        assert!(w.xl.gpus_of(3).is_empty(), "GPU detached");
        assert!(
            w.xl.assignable().contains(&gpu(GPU_A)),
            "GPU back in the pool"
        );
        let req = &agent.seen()[0];
        assert_eq!(
            req.op,
            Op::PrepareMigrate(MigrateMode::Remote {
                proxy: "tcp://10.77.0.2:7000".into(),
                token: Some(tokens::derive(SECRET, "g1", 1)),
            })
        );
        assert_eq!(req.deadline_ms, Some(3_000));
        let e = w.journal("g1").unwrap();
        assert_eq!(
            (e.phase, e.owner, e.seq),
            (Phase::Detached, Some(77), req.seq)
        );
        assert_eq!(
            w.steps(),
            ["prepare-migrate", "prepare-migrate answered", "detach"]
        );
        assert_eq!(w.last_answer, "1 remote; longest stop 12 ms (agent 1 ms)");

        // A repeat (the wrapper retrying) answers at once; another mode is busy.
        let again = w.run(|m| m.pre_migrate("3", "host1", Mode::Remote, Some(78)));
        assert_eq!(again.unwrap().gpus, [gpu(GPU_A)]);
        assert_eq!(agent.seen().len(), 1);
        let busy = w.run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None));
        assert!(matches!(busy, Err(MigrateError::Busy { .. })), "{busy:?}");
        // Reporting success while the domain is still here is refused.
        let still = w.run(|m| m.migrated("g1"));
        assert!(
            matches!(still, Err(MigrateError::StillHere { .. })),
            "{still:?}"
        );

        // xl migrate moved it away.
        w.xl.remove_domain(3);
        assert_eq!(
            w.run(|m| m.migrated("g1")).unwrap().as_deref(),
            Some("host1")
        );
        assert!(w.journal("g1").is_none());
        assert_eq!(w.run(|m| m.free_gpus()).unwrap(), [gpu(GPU_A), gpu(GPU_B)]);
    }

    #[test]
    fn destination_receive_attaches_a_free_gpu_and_resumes() {
        let mut w = World::new(config());
        // GPU A is held by another guest; the arriving one gets B.
        let _other = w.guest("g2", 2, &[GPU_A], GuestState::Passthrough);
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        w.run(|m| m.check_receive()).unwrap();
        let r = w.run(|m| m.receive("g1")).unwrap();
        assert_eq!(r, Attached::Resumed(Some(gpu(GPU_B))));
        assert_eq!(w.xl.gpus_of(9), [gpu(GPU_B)]);
        assert_eq!(agent.ops(), ["prepare-resume"]);
        assert!(w.journal("g1").is_none());
        assert_eq!(
            w.steps(),
            ["attach", "prepare-resume", "prepare-resume answered"]
        );
        // Receiving again is harmless: GPU kept, agent already in passthrough.
        assert_eq!(
            w.run(|m| m.receive("g1")).unwrap(),
            Attached::Resumed(Some(gpu(GPU_B)))
        );
        assert_eq!(agent.ops(), ["prepare-resume"]);
    }

    #[test]
    fn agent_timeout_rolls_back() {
        let mut cfg = config();
        cfg.migrate_deadline_ms = 300;
        let mut w = World::new(cfg);
        let agent = w.guest_with("g1", 3, &[GPU_A], GuestState::Passthrough, OnMigrate::Hang);
        let e = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not answer prepare-migrate within 500 ms"),
            "{e}"
        );
        assert!(e.contains("rolled back: the guest kept its GPU"), "{e}");
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)], "the GPU never left");
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
        assert!(w.journal("g1").is_none());
    }

    /// Waits until the agent, let go, has answered dom0's latest request, and
    /// checks that it is back in passthrough.
    fn wait_back_in_passthrough(ch: &GuestChannel<'_, MemConn>) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while ch.outstanding().unwrap() {
            assert!(
                Instant::now() < deadline,
                "the agent did not answer after waking"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    #[test]
    fn an_agent_that_does_not_take_the_request_is_given_up_on_quickly() {
        let mut cfg = config();
        cfg.agent_ack_ms = 200;
        cfg.migrate_deadline_ms = 60_000;
        cfg.resume_deadline_ms = 60_000;
        let mut w = World::new(cfg);
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        // It published its state, then stopped (SIGSTOP, say).
        let dom0 = w.store.connect(0);
        let ch = GuestChannel::new(&dom0, 3);
        ch.setup().unwrap();
        ch.wait_agent(Duration::from_secs(5))
            .unwrap()
            .expect("the fake agent did not start");
        agent.pause(true);
        let started = Instant::now();
        let e = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap_err()
            .to_string();
        // One acknowledgement wait, not the minute-long deadline.
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        assert!(
            e.contains("the guest agent of g1 did not take prepare-migrate within 200 ms"),
            "{e}"
        );
        assert!(
            e.contains(
                "nothing was changed: the guest kept its GPU, and prepare-resume (request 2) \
                 replaces the request its agent never took"
            ),
            "{e}"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)], "the GPU never left");
        assert!(w.journal("g1").is_none());
        assert!(agent.ops().is_empty());
        // The pending request is prepare-resume now: woken up, the agent
        // never runs the move nobody waits for any more.
        assert!(ch.outstanding().unwrap());
        agent.pause(false);
        wait_back_in_passthrough(&ch);
        assert_eq!(agent.ops(), ["prepare-resume"]);
        // With the agent running again the next migration goes through.
        w.run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap();
        assert_eq!(agent.ops(), ["prepare-resume", "prepare-migrate"]);
    }

    #[test]
    fn an_agent_stuck_in_prepare_migrate_gets_prepare_resume_for_later() {
        let mut cfg = config();
        cfg.migrate_deadline_ms = 300;
        cfg.agent_ack_ms = 200;
        let mut w = World::new(cfg);
        let agent = w.guest_with(
            "g1",
            3,
            &[GPU_A],
            GuestState::Passthrough,
            OnMigrate::Freeze,
        );
        let e = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not answer prepare-migrate within 500 ms"),
            "{e}"
        );
        assert!(
            e.contains(
                "rolled back as far as dom0 can: the guest has its GPU; prepare-resume waits \
                 for its agent, which did not take it within 200 ms"
            ),
            "{e}"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)], "the GPU never left");
        assert!(w.journal("g1").is_none());
        // Unstuck, the agent finds prepare-resume and comes back.
        let dom0 = w.store.connect(0);
        let ch = GuestChannel::new(&dom0, 3);
        assert!(ch.outstanding().unwrap());
        agent.pause(false);
        wait_back_in_passthrough(&ch);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
    }

    #[test]
    fn agent_failure_is_reported_without_a_needless_resume() {
        let mut w = World::new(config());
        let agent = w.guest_with("g1", 3, &[GPU_A], GuestState::Passthrough, OnMigrate::Fail);
        let e = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("answered failed to prepare-migrate: 1 of 1 processes refused"),
            "{e}"
        );
        assert_eq!(
            agent.ops(),
            ["prepare-migrate"],
            "the agent rolled back itself"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)]);
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn detach_failure_rolls_back() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        w.xl.fail_detach(true);
        let e = w
            .run(|m| m.pre_migrate("g1", "host1", Mode::Remote, None))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, MigrateError::RolledBack { cause, .. }
                if matches!(**cause, MigrateError::Detach { .. })),
            "{text}"
        );
        assert!(text.contains("ERROR_FAIL"), "{text}");
        assert!(text.contains("rolled back"), "{text}");
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)]);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn restart_after_detach_rolls_back_once_the_wrapper_is_gone() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        w.run(|m| m.pre_migrate("g1", "host1", Mode::Remote, Some(4242)))
            .unwrap();
        // A new craned: while the wrapper (pid 4242) lives, its report decides.
        let left = w.run(|m| m.recover(&|pid| pid == 4242)).unwrap();
        assert!(matches!(left[..], [(_, Recovered::Left)]), "{left:?}");
        assert_eq!(w.journal("g1").unwrap().phase, Phase::Detached);
        // The wrapper died without reporting and the domain is still here.
        let back = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(
            matches!(&back[..], [(g, Recovered::RolledBack(Ok(Attached::Resumed(Some(_)))))] if g == "g1"),
            "{back:?}"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)]);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn restart_mid_preparation_rolls_back() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        // craned died after the agent answered, before detaching.
        let mut e = Entry::new(Phase::Detaching, 3);
        e.mode = Some(Mode::StopAndCopy);
        e.gpus = vec![gpu(GPU_A)];
        journal::save(&w.dom0, "g1", &e).unwrap();
        w.run(|m| m.pre_migrate("g1", "h", Mode::StopAndCopy, None))
            .unwrap_err();
        let out = w.run(|m| m.recover(&|_| true)).unwrap();
        assert!(
            matches!(&out[..], [(_, Recovered::RolledBack(Ok(_)))]),
            "{out:?}"
        );
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)]);
        // The agent was in passthrough: nothing to resume.
        assert!(agent.ops().is_empty(), "{:?}", agent.ops());
    }

    /// craned killed while the agent works on prepare-migrate (journal
    /// `preparing`: the agent has moved the processes off the GPU, the GPU
    /// is still attached), and killed in the middle of a rollback (journal
    /// `rolling-back`: the GPU detached, not yet given back): the restarted
    /// craned rolls both back, the guest keeps (or gets back) its GPU and
    /// its processes are sent home.
    #[test]
    fn restart_while_preparing_or_rolling_back_rolls_back() {
        for (phase, attached) in [(Phase::Preparing, true), (Phase::RollingBack, false)] {
            let mut w = World::new(config());
            let gpus: &[&str] = if attached { &[GPU_A] } else { &[] };
            let agent = w.guest("g1", 3, gpus, GuestState::Detached(DetachKind::Remote));
            let mut e = Entry::new(phase, 3);
            e.mode = Some(Mode::Remote);
            e.gpus = vec![gpu(GPU_A)];
            e.seq = 1;
            journal::save(&w.dom0, "g1", &e).unwrap();
            let out = w.run(|m| m.recover(&|_| false)).unwrap();
            assert!(
                matches!(&out[..], [(_, Recovered::RolledBack(Ok(_)))]),
                "{phase:?}: {out:?}"
            );
            assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)], "{phase:?}");
            assert_eq!(agent.ops(), ["prepare-resume"], "{phase:?}");
            assert!(w.journal("g1").is_none(), "{phase:?}");
        }
    }

    #[test]
    fn restart_mid_receive_carries_it_forward() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::StopAndCopy));
        // craned died right after choosing GPU B, before attaching it.
        let mut e = Entry::new(Phase::Attaching, 9);
        e.gpus = vec![gpu(GPU_B)];
        journal::save(&w.dom0, "g1", &e).unwrap();
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(
            matches!(&out[..], [(_, Recovered::Received(Ok(Attached::Resumed(Some(g)))))] if *g == gpu(GPU_B)),
            "{out:?}"
        );
        assert_eq!(w.xl.gpus_of(9), [gpu(GPU_B)]);
        assert_eq!(agent.ops(), ["prepare-resume"]);
        assert!(w.journal("g1").is_none());
    }

    /// The one guest of `out` was received and resumed on a GPU.
    fn resumed(out: &[(String, Recovered)]) -> bool {
        matches!(
            out,
            [(_, Recovered::Received(Ok(Attached::Resumed(Some(_)))))]
        )
    }

    /// Makes a journal entry waiting for a resume attempt due now.
    fn due_now(w: &World, guest: &str) {
        let mut e = w.journal(guest).unwrap();
        e.retry_ms = 0;
        journal::save(&w.dom0, guest, &e).unwrap();
    }

    /// The guest arrives, its GPU is attached, and the agent fails
    /// prepare-resume (a driver not ready yet), then does not answer it (past
    /// the resume deadline): the GPU stays attached, the journal keeps the
    /// entry with the next attempt's time, ticks before it do nothing, and
    /// once the agent resumes the guest the entry is gone. An agent that
    /// never resumes is given up on after RESUME_TRIES attempts.
    #[test]
    fn a_failed_resume_on_arrival_is_tried_again_until_it_works() {
        let mut cfg = config();
        cfg.resume_deadline_ms = 300;
        cfg.agent_ack_ms = 300;
        let mut w = World::new(cfg);
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::StopAndCopy));
        agent.on_resume(OnResume::Fail);
        let e = w.run(|m| m.receive("g1")).unwrap_err();
        assert!(
            matches!(
                e,
                MigrateError::AgentFailed {
                    op: "prepare-resume",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(w.xl.gpus_of(9).len(), 1, "the GPU stays attached");
        let j = w.journal("g1").unwrap();
        assert_eq!((j.phase, j.tries), (Phase::Resuming, 1));
        let wait = j.retry_ms.saturating_sub(journal::now_ms());
        assert!((4_000..=5_000).contains(&wait), "{wait} ms");
        // Not due yet: a tick leaves it alone.
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(agent.ops(), ["prepare-resume"]);
        // Due, the agent silent: tried, timed out, kept for later, longer.
        agent.on_resume(OnResume::Hang);
        due_now(&w, "g1");
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(
            matches!(
                &out[..],
                [(
                    _,
                    Recovered::Received(Err(
                        MigrateError::AgentTimeout { .. } | MigrateError::NotTaken { .. }
                    ))
                )]
            ),
            "{out:?}"
        );
        let j = w.journal("g1").unwrap();
        assert_eq!(j.tries, 2);
        assert!(j.retry_ms.saturating_sub(journal::now_ms()) > 9_000);
        // Due again, the agent well: resumed on the GPU it has, done.
        agent.on_resume(OnResume::Resume);
        due_now(&w, "g1");
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(resumed(&out), "{out:?}");
        assert!(w.journal("g1").is_none());
        assert_eq!(agent.ops().len(), 3);
        assert_eq!(w.xl.gpus_of(9).len(), 1);
        // Another arrival whose agent never resumes: given up after the
        // last attempt, the entry removed, the GPU left attached.
        let agent2 = w.guest("g2", 10, &[], GuestState::Detached(DetachKind::StopAndCopy));
        agent2.on_resume(OnResume::Fail);
        assert!(w.run(|m| m.receive("g2")).is_err());
        for _ in 1..RESUME_TRIES {
            assert!(w.journal("g2").is_some());
            due_now(&w, "g2");
            let out = w.run(|m| m.recover(&|_| false)).unwrap();
            assert!(
                matches!(&out[..], [(_, Recovered::Received(Err(_)))]),
                "{out:?}"
            );
        }
        assert!(
            w.journal("g2").is_none(),
            "given up after {RESUME_TRIES} attempts"
        );
        assert_eq!(agent2.ops().len(), RESUME_TRIES as usize);
        assert_eq!(w.xl.gpus_of(10).len(), 1);
    }

    #[test]
    fn resume_attempts_wait_longer_each_time_up_to_five_minutes() {
        let waits: Vec<u64> = (1..=9).map(|t| resume_backoff(t).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    /// The destination's craned killed as the guest arrived (journal
    /// `receiving`: no GPU chosen yet) and after attaching the GPU, during
    /// prepare-resume (journal `resuming`): the restarted craned carries
    /// each forward, the guest ends with a GPU and resumed.
    #[test]
    fn restart_while_receiving_or_resuming_carries_it_forward() {
        for phase in [Phase::Receiving, Phase::Resuming] {
            let mut w = World::new(config());
            let has = if phase == Phase::Resuming {
                &[GPU_A][..]
            } else {
                &[]
            };
            let agent = w.guest("g1", 9, has, GuestState::Detached(DetachKind::Remote));
            let mut e = Entry::new(phase, 9);
            if phase == Phase::Resuming {
                e.gpus = vec![gpu(GPU_A)];
            }
            journal::save(&w.dom0, "g1", &e).unwrap();
            let out = w.run(|m| m.recover(&|_| false)).unwrap();
            assert!(resumed(&out), "{phase:?}: {out:?}");
            assert_eq!(w.xl.gpus_of(9).len(), 1, "{phase:?}");
            assert_eq!(agent.ops(), ["prepare-resume"], "{phase:?}");
            assert!(w.journal("g1").is_none(), "{phase:?}");
        }
    }

    /// The destination's craned killed during the move back: the agent has
    /// taken prepare-resume and is bringing its processes home from
    /// crane-proxy (no answer written yet) when craned dies. The restarted
    /// craned (journal `resuming`, the GPU attached) asks again; the agent,
    /// done with the first request, takes the second: resumed, the GPU
    /// attached once, nothing left in the journal.
    #[test]
    fn restart_during_the_move_back_carries_it_forward() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 9, &[GPU_A], GuestState::Detached(DetachKind::Remote));
        agent.on_resume(OnResume::Hang);
        let mut e = Entry::new(Phase::Resuming, 9);
        e.gpus = vec![gpu(GPU_A)];
        journal::save(&w.dom0, "g1", &e).unwrap();
        // The craned that died had posted prepare-resume; the agent took it.
        let first = GuestChannel::new(&w.dom0, 9)
            .post(Op::RESUME, None)
            .unwrap();
        let start = Instant::now();
        while agent.seen().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(5), "not taken");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Its processes home, the agent answers what comes next.
        agent.on_resume(OnResume::Resume);
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(resumed(&out), "{out:?}");
        let seen = agent.seen();
        assert_eq!(agent.ops(), ["prepare-resume", "prepare-resume"]);
        assert!(seen[1].seq > first.seq);
        assert_eq!(w.xl.gpus_of(9).len(), 1);
        assert!(w.journal("g1").is_none());
    }

    /// A guest that arrived while craned was not running (detached, on
    /// crane-proxy, no GPU, no journal entry) is received when craned
    /// starts: a free GPU attached, prepare-resume, nothing left in the
    /// journal. Guests in passthrough, or detached with a journal entry
    /// (a migration under way), are left alone.
    #[test]
    fn a_guest_that_arrived_without_craned_is_received_when_it_starts() {
        // Until the agents have published their state (after their keys).
        fn adopt(w: &mut World, c: &mut BTreeMap<String, u32>) -> Vec<(String, Received)> {
            let start = Instant::now();
            loop {
                let out = w.run(|m| m.adopt_waiting(c)).unwrap();
                if !out.is_empty() || c.is_empty() || start.elapsed() > Duration::from_secs(5) {
                    return out;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let mut w = World::new(config());
        let arrived = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        let fine = w.guest("g2", 4, &[GPU_B], GuestState::Passthrough);
        let mut c = w.run(|m| m.unattended()).unwrap();
        assert_eq!(c.keys().collect::<Vec<_>>(), ["g1"]);
        let out = adopt(&mut w, &mut c);
        assert!(
            matches!(&out[..], [(g, Ok(Attached::Resumed(Some(_))))] if g == "g1"),
            "{out:?}"
        );
        assert!(c.is_empty());
        assert_eq!(w.xl.gpus_of(9).len(), 1);
        assert_eq!(arrived.ops(), ["prepare-resume"]);
        assert!(fine.ops().is_empty());
        assert!(w.journal("g1").is_none());
        // Without a GPU but in passthrough (a guest that never had one):
        // forgotten, not received.
        let mut w = World::new(config());
        let plain = w.guest("g1", 9, &[], GuestState::Passthrough);
        let mut c = w.run(|m| m.unattended()).unwrap();
        let start = Instant::now();
        while !c.is_empty() && start.elapsed() < Duration::from_secs(5) {
            assert!(w.run(|m| m.adopt_waiting(&mut c)).unwrap().is_empty());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(c.is_empty());
        assert!(plain.ops().is_empty());
        // Detached with a journal entry: a migration craned runs; not touched.
        let mut w = World::new(config());
        let leaving = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        journal::save(&w.dom0, "g1", &Entry::new(Phase::Detached, 9)).unwrap();
        assert!(w.run(|m| m.unattended()).unwrap().is_empty());
        assert!(leaving.ops().is_empty());
    }

    #[test]
    fn restart_after_the_domain_left_finishes() {
        let mut w = World::new(config());
        let _agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        w.run(|m| m.pre_migrate("g1", "host1", Mode::Remote, Some(1)))
            .unwrap();
        w.xl.remove_domain(3);
        let out = w.run(|m| m.recover(&|_| true)).unwrap();
        assert!(matches!(out[..], [(_, Recovered::Departed)]), "{out:?}");
        assert!(w.journal("g1").is_none());
        // A rollback asked for afterwards says there is nothing to do.
        let e = w.run(|m| m.roll_back("g1")).unwrap_err();
        assert!(matches!(e, MigrateError::NoDomain(_)), "{e}");
    }

    #[test]
    fn no_free_gpu_waits_on_the_proxy_until_one_frees() {
        let mut cfg = config();
        cfg.gpus.pool = vec![gpu(GPU_A)];
        let mut w = World::new(cfg);
        let _holder = w.guest("g2", 2, &[GPU_A], GuestState::Passthrough);
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        w.run(|m| m.check_receive()).unwrap();
        assert_eq!(w.run(|m| m.receive("g1")).unwrap(), Attached::Waiting);
        assert_eq!(w.journal("g1").unwrap().phase, Phase::WaitingGpu);
        assert!(agent.ops().is_empty(), "the guest stays remote");
        // Still none on the next tick.
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(matches!(
            out[..],
            [(_, Recovered::Received(Ok(Attached::Waiting)))]
        ));
        // g2 goes away; the next tick gives its GPU to g1.
        w.xl.remove_domain(2);
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(resumed(&out), "{out:?}");
        assert_eq!(w.xl.gpus_of(9), [gpu(GPU_A)]);
        assert_eq!(agent.ops(), ["prepare-resume"]);
        assert!(w.journal("g1").is_none());
    }

    /// `no_free_gpu = "cpu"`: the arriving guest's processes go to its CPU
    /// (prepare-resume device=cpu gpu=none, no GPU attached); the journal
    /// keeps it, across a craned restart too; once a GPU frees, it is
    /// attached and the processes go home (device=home).
    #[test]
    fn no_free_gpu_runs_on_the_cpu_until_one_frees() {
        let mut cfg = config();
        cfg.gpus.pool = vec![gpu(GPU_A)];
        cfg.no_free_gpu = NoFreeGpu::Cpu;
        let mut w = World::new(cfg);
        let _holder = w.guest("g2", 2, &[GPU_A], GuestState::Passthrough);
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        w.run(|m| m.check_receive()).unwrap();
        assert_eq!(w.run(|m| m.receive("g1")).unwrap(), Attached::OnCpu);
        let e = w.journal("g1").unwrap();
        assert_eq!((e.phase, e.on_cpu), (Phase::OnCpu, true));
        assert!(w.xl.gpus_of(9).is_empty());
        let targets = |agent: &FakeAgent| -> Vec<ResumeTarget> {
            agent
                .seen()
                .iter()
                .filter_map(|r| match &r.op {
                    Op::PrepareResume(t) => Some(t.clone()),
                    Op::PrepareMigrate(_) => None,
                })
                .collect()
        };
        let cpu = ResumeTarget {
            device: Some("cpu".into()),
            no_gpu: true,
        };
        assert_eq!(targets(&agent), std::slice::from_ref(&cpu));
        // Still none on the next tick: nothing more is asked of the guest.
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(
            matches!(out[..], [(_, Recovered::Received(Ok(Attached::OnCpu)))]),
            "{out:?}"
        );
        assert_eq!(targets(&agent).len(), 1);
        // g2 goes away; the next tick gives its GPU to g1 and its processes
        // go back to the devices they started on.
        w.xl.remove_domain(2);
        let out = w.run(|m| m.recover(&|_| false)).unwrap();
        assert!(resumed(&out), "{out:?}");
        assert_eq!(w.xl.gpus_of(9), [gpu(GPU_A)]);
        let home = ResumeTarget {
            device: Some("home".into()),
            no_gpu: false,
        };
        assert_eq!(targets(&agent), [cpu, home]);
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn a_failed_attach_on_arrival_is_reported_and_the_guest_stays_detached() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        w.xl.fail_attach(true);
        let e = w.run(|m| m.receive("g1")).unwrap_err().to_string();
        assert!(e.contains("attaching GPU 0000:00:05.0 to g1 failed"), "{e}");
        assert!(agent.ops().is_empty(), "no prepare-resume without a GPU");
        assert!(w.journal("g1").is_none());
        w.xl.fail_attach(false);
        assert_eq!(
            w.run(|m| m.receive("g1")).unwrap(),
            Attached::Resumed(Some(gpu(GPU_A)))
        );
    }

    #[test]
    fn no_free_gpu_refuses_before_starting() {
        let mut cfg = config();
        cfg.gpus.pool = vec![gpu(GPU_A)];
        cfg.no_free_gpu = NoFreeGpu::Refuse;
        let mut w = World::new(cfg);
        let _holder = w.guest("g2", 2, &[GPU_A], GuestState::Passthrough);
        let e = w.run(|m| m.check_receive()).unwrap_err();
        assert!(e.to_string().contains("no GPU of the pool is free"), "{e}");
        let agent = w.guest("g1", 9, &[], GuestState::Detached(DetachKind::Remote));
        assert!(matches!(
            w.run(|m| m.receive("g1")),
            Err(MigrateError::NoFreeGpu(_))
        ));
        assert!(agent.ops().is_empty());
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn a_failed_transfer_gives_the_gpu_back_and_a_good_one_finishes() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        // xl failed: the caller rolls back.
        w.run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap();
        let text = rollback_text(w.run(|m| m.roll_back("g1")));
        assert!(text.contains("rolled back"), "{text}");
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_A)]);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);

        // xl moved the domain: the caller reports it, the entry is closed.
        w.run(|m| m.pre_migrate("g1", "host1", Mode::StopAndCopy, None))
            .unwrap();
        w.xl.remove_domain(3);
        assert_eq!(
            w.run(|m| m.migrated("g1")).unwrap().as_deref(),
            Some("host1")
        );
        assert!(w.journal("g1").is_none());
    }

    #[test]
    fn a_rollback_whose_gpu_was_taken_gets_another() {
        let mut w = World::new(config());
        let agent = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        w.run(|m| m.pre_migrate("g1", "host1", Mode::Remote, None))
            .unwrap();
        // Meanwhile another guest arrived and got GPU A.
        let _g2 = w.guest("g2", 4, &[GPU_A], GuestState::Passthrough);
        let r = w.run(|m| m.roll_back("g1")).unwrap();
        assert_eq!(r, Attached::Resumed(Some(gpu(GPU_B))));
        assert_eq!(w.xl.gpus_of(3), [gpu(GPU_B)]);
        assert_eq!(agent.ops(), ["prepare-migrate", "prepare-resume"]);
    }

    #[test]
    fn what_is_refused_and_why() {
        let mut w = World::new(config());
        let _a = w.guest("g1", 3, &[GPU_A], GuestState::Passthrough);
        w.xl.add_domain("other", 5, &[]);
        for (guest, want) in [
            ("other", "not a guest crane manages"),
            ("5", "not a guest"),
            ("g2", "no domain g2"),
            ("99", "no domain 99"),
        ] {
            let e = w
                .run(|m| m.pre_migrate(guest, "h", Mode::StopAndCopy, None))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{guest}: {e}");
        }
        // Remote mode needs a secret and an address.
        let phases = &mut w.phases;
        let mut progress = |p: &str, _d: Option<String>| phases.push(p.to_string());
        let mut m = Migration::new(&w.dom0, &w.xl, &w.cfg, None, &mut progress);
        let e = m
            .pre_migrate("g1", "h", Mode::Remote, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no token secret"), "{e}");
        assert!(journal::load(&w.dom0, "g1").unwrap().is_none());
        // A guest that shut down cannot be rolled back into.
        w.xl.set_state(3, DomainState::Shutdown);
        let mut e = Entry::new(Phase::Detached, 3);
        e.gpus = vec![gpu(GPU_A)];
        journal::save(&w.dom0, "g1", &e).unwrap();
        let mut progress = |_: &str, _: Option<String>| {};
        let mut m = Migration::new(&w.dom0, &w.xl, &w.cfg, None, &mut progress);
        assert!(matches!(m.roll_back("g1"), Err(MigrateError::Gone(_))));
    }
}
