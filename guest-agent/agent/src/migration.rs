//! The guest side of a migration, one request at a time: prepare-migrate
//! (every interposed process off the GPU, no holder left, GPU modules
//! unloaded) and prepare-resume (modules loaded, GPU usable, every process
//! back in passthrough), with a rollback that restores the state before a
//! failed prepare-migrate. It knows nothing of XenStore: [`crate::daemon`]
//! feeds it requests and publishes its answers.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crane_control::notice::{MigrationNotice, clear_notice, write_notice};
use crane_control::{Mode, Request as AppRequest, list_pids};
use crane_xs::message::{
    AgentState, AppOutcome, AppResult, GuestState, MigrateMode, Op, Outcome, PhaseTime, Plan,
    Request, Response, ResumeTarget, Rollback, plan,
};

use crate::apps::{self, AppReport};
use crate::config::Config;
use crate::device::DeviceProbe;
use crate::holders;
use crate::modules::ModuleBackend;

/// Rounds of looking for processes that started while others were switched.
const MAX_ROUNDS: usize = 5;

/// One request's answer: the response and the per-process results.
#[derive(Debug, Clone)]
pub struct Answer {
    pub response: Response,
    pub apps: Vec<AppResult>,
}

pub struct Agent<M, P> {
    cfg: Config,
    modules: M,
    probe: P,
    state: GuestState,
    last_seq: u64,
    /// Modules this agent unloaded, in unload order, to load back.
    unloaded: Vec<String>,
    /// Where `/proc` is (holders scan).
    proc_root: PathBuf,
}

struct Timer {
    phases: Vec<PhaseTime>,
    at: Instant,
}

impl Timer {
    fn new() -> Timer {
        Timer {
            phases: Vec::new(),
            at: Instant::now(),
        }
    }
    fn lap(&mut self, name: &str) {
        self.phases.push(PhaseTime {
            name: name.to_string(),
            ms: self.at.elapsed().as_secs_f64() * 1e3,
        });
        self.at = Instant::now();
    }
}

fn describe(reports: &[&AppReport]) -> String {
    reports
        .iter()
        .map(|r| {
            format!(
                "pid {} {}: {}",
                r.pid,
                r.outcome.as_str(),
                r.error.as_deref().unwrap_or("no reason given")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl<M: ModuleBackend, P: DeviceProbe> Agent<M, P> {
    pub fn new(cfg: Config, modules: M, probe: P) -> Self {
        Agent {
            cfg,
            modules,
            probe,
            state: GuestState::Passthrough,
            last_seq: 0,
            unloaded: Vec::new(),
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Takes over what a previous run of the agent published: its sequence
    /// number, and its state (an operation that was under way when it stopped
    /// counts as degraded; a detached guest must be resumed, loading every
    /// configured module).
    pub fn restore(&mut self, published: Option<AgentState>) {
        let Some(p) = published else { return };
        self.last_seq = p.last_seq;
        self.state = match p.state {
            GuestState::Migrating | GuestState::Resuming => GuestState::Degraded,
            s => s,
        };
        if matches!(self.state, GuestState::Detached(_) | GuestState::Degraded) {
            self.unloaded = self.cfg.modules.unload.clone();
        }
    }

    pub fn state(&self) -> AgentState {
        AgentState {
            state: self.state,
            last_seq: self.last_seq,
        }
    }

    fn answer(
        seq: u64,
        outcome: Outcome,
        started: Instant,
        timer: Timer,
        reports: Vec<AppReport>,
        error: Option<String>,
        rollback: Option<Rollback>,
    ) -> Answer {
        let apps: Vec<AppResult> = reports
            .into_iter()
            .map(|r| AppResult {
                seq,
                pid: r.pid,
                outcome: r.outcome,
                ms: r.ms,
                error: r.error,
            })
            .collect();
        Answer {
            response: Response {
                seq,
                outcome,
                ms: started.elapsed().as_secs_f64() * 1e3,
                apps: apps.len() as u32,
                phases: timer.phases,
                rollback,
                error,
            },
            apps,
        }
    }

    /// Acts on a new request (its sequence number already checked to be
    /// new). `progress` is told the state as soon as work starts, so the
    /// caller can publish it.
    pub fn handle(&mut self, req: &Request, mut progress: impl FnMut(AgentState)) -> Answer {
        let started = Instant::now();
        self.last_seq = req.seq;
        match plan(self.state, &req.op) {
            Plan::Refuse(why) => Self::answer(
                req.seq,
                Outcome::Rejected,
                started,
                Timer::new(),
                Vec::new(),
                Some(why),
                None,
            ),
            Plan::AlreadyDone(o) => {
                Self::answer(req.seq, o, started, Timer::new(), Vec::new(), None, None)
            }
            Plan::Run => {
                let ms = req.deadline_ms.unwrap_or(self.cfg.default_deadline_ms);
                let deadline = started + Duration::from_millis(ms);
                match &req.op {
                    Op::PrepareMigrate(mode) => {
                        self.state = GuestState::Migrating;
                        progress(self.state());
                        self.migrate(req.seq, mode, started, deadline)
                    }
                    Op::PrepareResume(target) => {
                        let before = self.state;
                        self.state = GuestState::Resuming;
                        progress(self.state());
                        self.resume(req.seq, target, before, started, deadline)
                    }
                }
            }
        }
    }

    fn grace(&self) -> Duration {
        Duration::from_millis(self.cfg.answer_grace_ms)
    }

    fn migrate(
        &mut self,
        seq: u64,
        mode: &MigrateMode,
        started: Instant,
        deadline: Instant,
    ) -> Answer {
        let mut timer = Timer::new();
        let run_dir = self.cfg.run_dir.clone();
        let notice = match mode {
            MigrateMode::Remote { proxy, token } => MigrationNotice::Remote {
                proxy: proxy.clone(),
                token: token.clone(),
            },
            MigrateMode::StopAndCopy => MigrationNotice::Suspended,
        };
        if let Err(e) = write_notice(&run_dir, &notice) {
            self.state = GuestState::Passthrough;
            let error = format!(
                "cannot write the migration notice in {}: {e}",
                run_dir.display()
            );
            return Self::answer(
                seq,
                Outcome::Failed,
                started,
                timer,
                Vec::new(),
                Some(error),
                Some(Rollback::Complete),
            );
        }
        let request = |left: Duration| {
            let deadline_ms = left.as_millis().max(1) as u64;
            match mode {
                MigrateMode::Remote { proxy, token } => AppRequest::Remote {
                    proxy: proxy.clone(),
                    token: token.clone(),
                    deadline_ms,
                    device: None,
                    precopy: if self.cfg.precopy {
                        self.cfg.precopy_rounds
                    } else {
                        0
                    },
                },
                MigrateMode::StopAndCopy => AppRequest::Suspend { deadline_ms },
            }
        };
        // Pre-copy: each process's device memory read into RAM while it runs
        // on, so that the stop below reads only what changed since. A process
        // that cannot is stopped as it is (nothing is lost either way); one
        // found gone is reported so. A move to crane-proxy pre-copies there
        // itself (the request's `precopy`), sending ahead too.
        let mut reports: Vec<AppReport> = Vec::new();
        let mut seen = BTreeSet::new();
        if self.cfg.precopy && matches!(mode, MigrateMode::StopAndCopy) {
            let pids = list_pids(&run_dir);
            let left = deadline.saturating_duration_since(Instant::now());
            let req = AppRequest::Precopy {
                deadline_ms: (left / 2).as_millis().max(1) as u64,
            };
            for r in apps::send_all(&run_dir, &pids, |_| Some(req.clone()), left / 2) {
                if r.outcome == AppOutcome::Gone {
                    seen.insert(r.pid);
                    reports.push(r);
                } else if let Some(e) = &r.error {
                    log::info!("request {seq}: pid {}: no pre-copy: {e}", r.pid);
                }
            }
            timer.lap("precopy");
        }
        // Every process, then any that started meanwhile (the notice covers
        // those that start from now on).
        for _ in 0..MAX_ROUNDS {
            let new: Vec<u32> = list_pids(&run_dir)
                .into_iter()
                .filter(|p| !seen.contains(p))
                .collect();
            if new.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let req = request(left);
            reports.extend(apps::send_all(
                &run_dir,
                &new,
                |_| Some(req.clone()),
                left + self.grace(),
            ));
            seen.extend(new);
        }
        timer.lap("apps");
        let failed: Vec<&AppReport> = reports.iter().filter(|r| !r.outcome.is_success()).collect();
        if !failed.is_empty() {
            let error = format!(
                "{} of {} processes did not leave the GPU: {}",
                failed.len(),
                reports.len(),
                describe(&failed)
            );
            return self.roll_back(seq, mode, started, timer, reports, error);
        }
        let held = holders::scan(
            &self.proc_root,
            &self.cfg.device.holders,
            std::process::id(),
        );
        timer.lap("holders");
        if !held.is_empty() {
            let list: Vec<String> = held.iter().take(8).map(|h| h.to_string()).collect();
            let error = format!("the GPU is still in use: {}", list.join("; "));
            return self.roll_back(seq, mode, started, timer, reports, error);
        }
        for m in self.cfg.modules.unload.clone() {
            let r = match self.modules.is_loaded(&m) {
                Ok(false) => continue,
                Ok(true) => self.modules.unload(&m),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => self.unloaded.push(m),
                Err(e) => {
                    timer.lap("modules");
                    let error = format!("cannot unload the GPU driver: {e}");
                    return self.roll_back(seq, mode, started, timer, reports, error);
                }
            }
        }
        timer.lap("modules");
        self.state = GuestState::Detached(mode.kind());
        log::info!(
            "request {seq}: ready for detach ({} processes, {} modules unloaded)",
            reports.len(),
            self.unloaded.len()
        );
        Self::answer(
            seq,
            Outcome::ReadyForDetach,
            started,
            timer,
            reports,
            None,
            None,
        )
    }

    /// Undoes a failed prepare-migrate: modules loaded again, every process
    /// that left (or may have) brought back, the notice removed.
    fn roll_back(
        &mut self,
        seq: u64,
        mode: &MigrateMode,
        started: Instant,
        mut timer: Timer,
        mut reports: Vec<AppReport>,
        error: String,
    ) -> Answer {
        log::warn!("request {seq} failed, rolling back: {error}");
        let mut problems = Vec::new();
        while let Some(m) = self.unloaded.pop() {
            if let Err(e) = self.modules.load(&m) {
                problems.push(format!("reloading {m}: {e}"));
                self.unloaded.push(m);
                break;
            }
        }
        let run_dir = self.cfg.run_dir.clone();
        let wait = Duration::from_millis(self.cfg.rollback_timeout_ms);
        let back_req = match mode {
            MigrateMode::Remote { .. } => AppRequest::Local {
                deadline_ms: self.cfg.rollback_timeout_ms,
                device: None,
                precopy: 0,
            },
            MigrateMode::StopAndCopy => AppRequest::RESUME,
        };
        let to_restore: Vec<u32> = reports
            .iter()
            .filter(|r| {
                matches!(
                    r.outcome,
                    AppOutcome::Remote | AppOutcome::Suspended | AppOutcome::TimedOut
                )
            })
            .map(|r| r.pid)
            .collect();
        let back = apps::send_all(&run_dir, &to_restore, |_| Some(back_req.clone()), wait);
        for b in back {
            // A process whose own switch failed late is already back.
            let ok = b.outcome == AppOutcome::Passthrough
                || b.outcome == AppOutcome::Gone
                || apps::mode_of(&run_dir, b.pid, wait) == Some(Mode::Passthrough);
            if let Some(r) = reports.iter_mut().find(|r| r.pid == b.pid) {
                if !ok {
                    problems.push(format!(
                        "pid {} not back in passthrough: {}",
                        b.pid,
                        b.error.as_deref().unwrap_or("no reason given")
                    ));
                } else if r.outcome.is_success() {
                    r.outcome = AppOutcome::Passthrough;
                } else {
                    r.error = Some(format!(
                        "{}; rolled back",
                        r.error.as_deref().unwrap_or("no reason given")
                    ));
                }
            }
        }
        if let Err(e) = clear_notice(&run_dir) {
            problems.push(format!("removing the migration notice: {e}"));
        }
        timer.lap("rollback");
        let (rollback, error) = if problems.is_empty() {
            self.state = GuestState::Passthrough;
            (Rollback::Complete, error)
        } else {
            self.state = GuestState::Degraded;
            (
                Rollback::Incomplete,
                format!("{error}; rollback incomplete: {}", problems.join("; ")),
            )
        };
        Self::answer(
            seq,
            Outcome::Failed,
            started,
            timer,
            reports,
            Some(error),
            Some(rollback),
        )
    }

    /// Loads the GPU driver and waits for the device (unless `target.no_gpu`),
    /// then brings every process to passthrough on the devices `target`
    /// names.
    fn resume(
        &mut self,
        seq: u64,
        target: &ResumeTarget,
        before: GuestState,
        started: Instant,
        deadline: Instant,
    ) -> Answer {
        let mut timer = Timer::new();
        let run_dir = self.cfg.run_dir.clone();
        // A resume that fails before touching any process leaves them parked
        // where they were; dom0 may retry.
        let stay = |s: &mut Self, timer: Timer, error: String| {
            s.state = match before {
                GuestState::Passthrough => GuestState::Passthrough,
                GuestState::Detached(k) => GuestState::Detached(k),
                _ => GuestState::Degraded,
            };
            log::warn!("request {seq} failed: {error}");
            Self::answer(
                seq,
                Outcome::Failed,
                started,
                timer,
                Vec::new(),
                Some(error),
                None,
            )
        };
        // Without a GPU the driver stays unloaded (a later prepare-resume
        // with one loads it).
        if !target.no_gpu {
            for m in self.unloaded.clone().iter().rev() {
                if let Err(e) = self.modules.load(m) {
                    timer.lap("modules");
                    return stay(self, timer, format!("cannot load the GPU driver: {e}"));
                }
                self.unloaded.retain(|u| u != m);
            }
            timer.lap("modules");
            if let Err(e) = self.probe.wait_ready(deadline) {
                timer.lap("device");
                return stay(self, timer, e.to_string());
            }
            timer.lap("device");
        }
        let device = target.device.as_deref();
        // New processes may use the GPU from now on.
        if let Err(e) = clear_notice(&run_dir) {
            log::warn!("cannot remove the migration notice: {e}");
        }
        let mut reports = Vec::new();
        let mut seen = BTreeSet::new();
        for _ in 0..MAX_ROUNDS {
            let new: Vec<u32> = list_pids(&run_dir)
                .into_iter()
                .filter(|p| !seen.contains(p))
                .collect();
            if new.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left + self.grace();
            let precopy = if self.cfg.precopy {
                self.cfg.precopy_rounds
            } else {
                0
            };
            reports.extend(std::thread::scope(|s| {
                let hs: Vec<_> = new
                    .iter()
                    .map(|&pid| {
                        let run_dir = &run_dir;
                        s.spawn(move || {
                            back_to_passthrough(run_dir, pid, device, left, wait, precopy)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .filter_map(|h| h.join().ok())
                    .collect::<Vec<_>>()
            }));
            seen.extend(new);
        }
        timer.lap("apps");
        let failed: Vec<&AppReport> = reports.iter().filter(|r| !r.outcome.is_success()).collect();
        if !failed.is_empty() {
            let error = format!(
                "{} of {} processes are not back in passthrough{}: {}",
                failed.len(),
                reports.len(),
                device.map_or(String::new(), |d| format!(" on device {d}")),
                describe(&failed)
            );
            log::warn!("request {seq} failed: {error}");
            self.state = GuestState::Degraded;
            return Self::answer(
                seq,
                Outcome::Failed,
                started,
                timer,
                reports,
                Some(error),
                None,
            );
        }
        self.state = GuestState::Passthrough;
        log::info!(
            "request {seq}: resumed ({} processes{}{})",
            reports.len(),
            device.map_or(String::new(), |d| format!(", device {d}")),
            if target.no_gpu { ", no GPU" } else { "" }
        );
        Self::answer(seq, Outcome::Resumed, started, timer, reports, None, None)
    }
}

/// Brings one process to passthrough from whatever mode it reports, on the
/// devices `device` names (a process already in passthrough moves there);
/// one on crane-proxy with a pre-copy of `precopy` rounds first (0: none).
fn back_to_passthrough(
    run_dir: &std::path::Path,
    pid: u32,
    device: Option<&str>,
    left: Duration,
    wait: Duration,
    precopy: u32,
) -> AppReport {
    let t = Instant::now();
    let device = device.map(str::to_owned);
    let local = AppRequest::Local {
        deadline_ms: left.as_millis().max(1) as u64,
        device: device.clone(),
        precopy,
    };
    let resume = AppRequest::Resume {
        device: device.clone(),
    };
    match apps::mode_of(run_dir, pid, wait) {
        Some(Mode::Passthrough) if device.is_some() => apps::send(run_dir, pid, &local, wait),
        Some(Mode::Passthrough) => AppReport {
            pid,
            outcome: AppOutcome::Passthrough,
            ms: t.elapsed().as_secs_f64() * 1e3,
            error: None,
        },
        Some(Mode::Suspended) => apps::send(run_dir, pid, &resume, wait),
        Some(Mode::Remote) => apps::send(run_dir, pid, &local, wait),
        // Did not say: the same request tells gone from failing.
        None => {
            let mut r = apps::send(run_dir, pid, &resume, wait);
            if r.outcome == AppOutcome::Failed {
                r.error = Some(format!(
                    "did not report its mode; resume: {}",
                    r.error.unwrap_or_default()
                ));
            }
            r
        }
    }
}
