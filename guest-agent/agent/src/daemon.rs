//! The agent's XenStore loop: a watch on `crane` (relative, so it follows the
//! guest to its new domid after a migration), and on every event: make sure
//! the agent's state is published (dom0 recreates the keys on a migration's
//! destination), read the request with all its checks, act on a new one and
//! publish the answer. Events only mean "look again": the request key is
//! re-read, so spurious and repeated events are harmless.

use std::time::Duration;

use crane_xs::XenStore;
use crane_xs::error::XsError;
use crane_xs::guest::{
    Incoming, publish_answer, publish_progress, publish_state, published_state, read_request,
};
use crane_xs::layout::{AGENT_STATE, CRANE};
use crane_xs::message::{AgentState, Outcome, Response};

use crate::device::DeviceProbe;
use crate::migration::Agent;
use crate::modules::ModuleBackend;

pub const WATCH_TOKEN: &str = "crane-agent";
/// Look again this often even without an event.
pub const POLL: Duration = Duration::from_secs(30);

pub struct Daemon<'s, S, M, P> {
    store: &'s S,
    agent: Agent<M, P>,
    last_rejection: Option<(u64, String)>,
}

fn bare_response(seq: u64, outcome: Outcome, error: Option<String>) -> Response {
    Response {
        seq,
        outcome,
        ms: 0.0,
        apps: 0,
        phases: Vec::new(),
        rollback: None,
        error,
    }
}

impl<'s, S: XenStore, M: ModuleBackend, P: DeviceProbe> Daemon<'s, S, M, P> {
    /// Takes over the state a previous run published.
    pub fn new(store: &'s S, mut agent: Agent<M, P>) -> Self {
        agent.restore(published_state(store));
        Daemon {
            store,
            agent,
            last_rejection: None,
        }
    }

    pub fn agent(&self) -> &Agent<M, P> {
        &self.agent
    }

    pub fn start(&self) -> Result<(), XsError> {
        self.store.watch(CRANE, WATCH_TOKEN)
    }

    fn publish_state(&self, st: &AgentState) {
        if let Err(e) = publish_state(self.store, st) {
            log::debug!("cannot publish the agent state yet: {e}");
        }
    }

    /// One look at the keys.
    pub fn step(&mut self) -> Result<(), XsError> {
        let current = self.agent.state();
        if self.store.read(AGENT_STATE).ok().flatten() != Some(current.format()) {
            self.publish_state(&current);
        }
        match read_request(self.store, current.last_seq)? {
            Incoming::Nothing | Incoming::Repeat => {}
            Incoming::Rejected { seq, reason } => {
                if self.last_rejection.as_ref() != Some(&(seq, reason.clone())) {
                    log::warn!("request {seq} rejected: {reason}");
                    let r = bare_response(seq, Outcome::Rejected, Some(reason.clone()));
                    if let Err(e) = publish_progress(self.store, &r) {
                        log::warn!("cannot publish the rejection: {e}");
                    }
                    self.last_rejection = Some((seq, reason));
                }
            }
            Incoming::New(req) => {
                log::info!("request {}: {}", req.seq, req.op.name());
                let store = self.store;
                let seq = req.seq;
                let answer = self.agent.handle(&req, |st| {
                    let _ = publish_state(store, &st);
                    let _ = publish_progress(store, &bare_response(seq, Outcome::Working, None));
                });
                let state = self.agent.state();
                if let Err(e) = publish_answer(self.store, &state, &answer.response, &answer.apps) {
                    log::error!("cannot publish the answer to request {seq}: {e}");
                }
            }
        }
        Ok(())
    }

    /// Runs until XenStore fails.
    pub fn run(&mut self) -> Result<(), XsError> {
        self.start()?;
        loop {
            self.store.wait_event(POLL)?;
            self.step()?;
        }
    }
}

#[cfg(test)]
mod tests {
    //! The state machine end to end against the in-process XenStore: dom0
    //! posts through `GuestChannel`, the daemon takes one step, dom0 reads the
    //! answer. Processes are fake control sockets on live pids (`sleep`
    //! children), modules and the GPU probe are fakes.

    use std::collections::BTreeSet;
    use std::path::PathBuf;
    use std::process::{Child, Command};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use crane_control::Mode;
    use crane_control::notice::{MigrationNotice, read_notice};
    use crane_xs::dom0::GuestChannel;
    use crane_xs::layout::{REQUEST, absolute};
    use crane_xs::mem::{MemConn, MemStore};
    use crane_xs::message::{
        AppOutcome, DetachKind, GuestState, MigrateMode, Op, Outcome, ResumeTarget, Rollback,
    };
    use crane_xs::{Access, Perm, XsData, XsPerms};

    use super::Daemon;
    use crate::apps::fake::{Behaviour, FakeApp, spawn};
    use crate::config::Config;
    use crate::device::{DeviceProbe, ProbeError};
    use crate::migration::Agent;
    use crate::modules::{ModuleBackend, ModuleError};

    const DOMID: u16 = 7;

    #[derive(Clone, Default)]
    struct FakeModules {
        loaded: Arc<Mutex<BTreeSet<String>>>,
        refuse_unload: Option<String>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl ModuleBackend for FakeModules {
        fn is_loaded(&self, name: &str) -> Result<bool, ModuleError> {
            Ok(self.loaded.lock().unwrap().contains(name))
        }
        fn unload(&self, name: &str) -> Result<(), ModuleError> {
            if self.refuse_unload.as_deref() == Some(name) {
                return Err(ModuleError::InUse(name.into()));
            }
            self.log.lock().unwrap().push(format!("unload {name}"));
            self.loaded.lock().unwrap().remove(name);
            Ok(())
        }
        fn load(&self, name: &str) -> Result<(), ModuleError> {
            self.log.lock().unwrap().push(format!("load {name}"));
            self.loaded.lock().unwrap().insert(name.into());
            Ok(())
        }
    }

    struct FakeProbe(bool);
    impl DeviceProbe for FakeProbe {
        fn wait_ready(&self, _: Instant) -> Result<u32, ProbeError> {
            if self.0 {
                Ok(1)
            } else {
                Err(ProbeError::NotReady {
                    waited_ms: 0,
                    attempts: 1,
                    last: "/dev/nvidiactl does not exist".into(),
                })
            }
        }
    }

    struct Rig {
        store: MemStore,
        dom0: MemConn,
        guest: MemConn,
        run: PathBuf,
        modules: FakeModules,
        children: Vec<Child>,
        apps: Vec<FakeApp>,
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(&self.run);
        }
    }

    fn rig(name: &str) -> Rig {
        let store = MemStore::new();
        store.introduce(DOMID);
        let dom0 = store.connect(0);
        GuestChannel::new(&dom0, DOMID).setup().unwrap();
        let guest = store.connect(DOMID);
        let run = std::env::temp_dir().join(format!("crane-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        let modules = FakeModules::default();
        for m in ["nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm"] {
            modules.loaded.lock().unwrap().insert(m.into());
        }
        Rig {
            store,
            dom0,
            guest,
            run,
            modules,
            children: Vec::new(),
            apps: Vec::new(),
        }
    }

    impl Rig {
        fn app(&mut self, b: Behaviour) -> u32 {
            let c = Command::new("sleep").arg("120").spawn().unwrap();
            let pid = c.id();
            self.children.push(c);
            self.apps.push(spawn(&self.run, pid, b));
            pid
        }

        fn config(&self) -> Config {
            Config {
                run_dir: self.run.clone(),
                default_deadline_ms: 2_000,
                answer_grace_ms: 200,
                rollback_timeout_ms: 5_000,
                device: crate::config::DeviceConfig {
                    holders: vec![self.run.join("gpu").to_string_lossy().into_owned()],
                    ..Default::default()
                },
                ..Config::default()
            }
        }

        fn daemon(
            &self,
            modules: FakeModules,
            probe: bool,
        ) -> Daemon<'_, MemConn, FakeModules, FakeProbe> {
            let d = Daemon::new(
                &self.guest,
                Agent::new(self.config(), modules, FakeProbe(probe)),
            );
            d.start().unwrap();
            d
        }

        fn ch(&self) -> GuestChannel<'_, MemConn> {
            GuestChannel::new(&self.dom0, DOMID)
        }

        fn mode(&self, pid: u32) -> Mode {
            *self
                .apps
                .iter()
                .find(|a| a.pid == pid)
                .unwrap()
                .mode
                .lock()
                .unwrap()
        }
    }

    /// dom0 posts `op` and the agent takes it: the request and its answer.
    fn ask(
        ch: &GuestChannel<'_, MemConn>,
        d: &mut Daemon<'_, MemConn, FakeModules, FakeProbe>,
        op: Op,
    ) -> (crane_xs::message::Request, crane_xs::message::Response) {
        let req = ch.post(op, None).unwrap();
        d.step().unwrap();
        (req, ch.response().unwrap().unwrap())
    }

    fn remote() -> Op {
        Op::PrepareMigrate(MigrateMode::Remote {
            proxy: "tcp://10.77.0.2:7000".into(),
            token: Some("tok".into()),
        })
    }

    #[test]
    fn full_remote_migration_and_resume() {
        let mut r = rig("full");
        let a = r.app(Behaviour::Obedient);
        let b = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), true);
        d.step().unwrap();
        let ch = r.ch();
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );

        let req = ch.post(remote(), None).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.seq, req.seq);
        assert_eq!(resp.outcome, Outcome::ReadyForDetach, "{resp:?}");
        assert_eq!(resp.apps, 2);
        for p in ["apps", "holders", "modules"] {
            assert!(resp.phase(p).is_some(), "phase {p} missing: {resp:?}");
        }
        let apps = ch.app_results(req.seq).unwrap();
        assert_eq!(apps.len(), 2);
        assert!(apps.iter().all(|x| x.outcome == AppOutcome::Remote));
        assert_eq!((r.mode(a), r.mode(b)), (Mode::Remote, Mode::Remote));
        assert!(r.modules.loaded.lock().unwrap().is_empty());
        assert_eq!(
            r.modules.log.lock().unwrap()[..4],
            [
                "unload nvidia_uvm",
                "unload nvidia_drm",
                "unload nvidia_modeset",
                "unload nvidia"
            ]
        );
        assert_eq!(
            read_notice(&r.run),
            Some(MigrationNotice::Remote {
                proxy: "tcp://10.77.0.2:7000".into(),
                token: Some("tok".into())
            })
        );
        let st = ch.agent_state().unwrap().unwrap();
        assert_eq!(st.state, GuestState::Detached(DetachKind::Remote));
        assert_eq!(st.last_seq, req.seq);
        // A repeated event changes nothing.
        d.step().unwrap();
        assert_eq!(ch.response().unwrap().unwrap(), resp);

        let req = ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(
            (resp.seq, resp.outcome),
            (req.seq, Outcome::Resumed),
            "{resp:?}"
        );
        assert!(resp.phase("device").is_some());
        assert_eq!(
            (r.mode(a), r.mode(b)),
            (Mode::Passthrough, Mode::Passthrough)
        );
        assert_eq!(r.modules.loaded.lock().unwrap().len(), 4);
        assert_eq!(
            r.modules.log.lock().unwrap()[4..],
            [
                "load nvidia",
                "load nvidia_modeset",
                "load nvidia_drm",
                "load nvidia_uvm"
            ]
        );
        assert_eq!(read_notice(&r.run), None);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    /// craned's `no_free_gpu = "cpu"`: prepare-resume with `gpu=none` loads no
    /// driver and waits for no device; the processes go to the devices the
    /// spec names (from remote, and from passthrough). A later prepare-resume
    /// with a GPU loads the driver and sends them home.
    #[test]
    fn a_resume_without_a_gpu_loads_no_driver_and_moves_the_processes() {
        let mut r = rig("nogpu");
        let a = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        ch.post(remote(), None).unwrap();
        d.step().unwrap();
        assert_eq!(r.mode(a), Mode::Remote);
        assert!(r.modules.loaded.lock().unwrap().is_empty());
        let devices = |r: &Rig| r.apps[0].devices.lock().unwrap().clone();
        ch.post(
            Op::PrepareResume(ResumeTarget {
                device: Some("cpu".into()),
                no_gpu: true,
            }),
            None,
        )
        .unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
        assert!(resp.phase("modules").is_none() && resp.phase("device").is_none());
        assert!(
            r.modules.loaded.lock().unwrap().is_empty(),
            "no driver loaded"
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(devices(&r), ["cpu"]);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
        // A GPU is attached: the driver comes back, the process goes home.
        ch.post(
            Op::PrepareResume(ResumeTarget {
                device: Some("home".into()),
                no_gpu: false,
            }),
            None,
        )
        .unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
        assert_eq!(r.modules.loaded.lock().unwrap().len(), 4);
        assert_eq!(devices(&r), ["cpu", "home"]);
        // A plain resume of a process in passthrough asks it nothing.
        ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        assert_eq!(ch.response().unwrap().unwrap().outcome, Outcome::Resumed);
        assert_eq!(devices(&r), ["cpu", "home"]);
    }

    #[test]
    fn stop_and_copy_suspends_and_resumes() {
        let mut r = rig("sac");
        let a = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), Some(3000))
            .unwrap();
        d.step().unwrap();
        assert_eq!(
            ch.response().unwrap().unwrap().outcome,
            Outcome::ReadyForDetach
        );
        assert_eq!(r.mode(a), Mode::Suspended);
        assert_eq!(read_notice(&r.run), Some(MigrationNotice::Suspended));
        // The same request kind again, with a new seq: already done.
        ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
            .unwrap();
        d.step().unwrap();
        assert_eq!(
            ch.response().unwrap().unwrap().outcome,
            Outcome::ReadyForDetach
        );
        // The other kind is refused until a resume.
        ch.post(remote(), None).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Rejected);
        assert!(resp.error.unwrap().contains("prepare-resume first"));
        ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        assert_eq!(ch.response().unwrap().unwrap().outcome, Outcome::Resumed);
        assert_eq!(r.mode(a), Mode::Passthrough);
    }

    #[test]
    fn an_app_that_does_not_answer_in_time_is_rolled_back() {
        let mut r = rig("slow");
        let fast = r.app(Behaviour::Obedient);
        let slow = r.app(Behaviour::Slow(Duration::from_millis(1500)));
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        let req = ch.post(remote(), Some(300)).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Failed, "{resp:?}");
        assert_eq!(resp.rollback, Some(Rollback::Complete));
        let err = resp.error.unwrap();
        assert!(err.contains(&format!("pid {slow} timed-out")), "{err}");
        let apps = ch.app_results(req.seq).unwrap();
        let get = |pid| apps.iter().find(|x| x.pid == pid).unwrap();
        assert_eq!(get(slow).outcome, AppOutcome::TimedOut);
        assert!(get(slow).error.as_deref().unwrap().contains("rolled back"));
        assert_eq!(get(fast).outcome, AppOutcome::Passthrough);
        // Both back on the GPU, the driver never touched, no notice left.
        assert_eq!(
            (r.mode(fast), r.mode(slow)),
            (Mode::Passthrough, Mode::Passthrough)
        );
        assert_eq!(r.modules.loaded.lock().unwrap().len(), 4);
        assert!(r.modules.log.lock().unwrap().is_empty());
        assert_eq!(read_notice(&r.run), None);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
        // And the guest can still migrate.
        ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), Some(5000))
            .unwrap();
        d.step().unwrap();
        assert_eq!(
            ch.response().unwrap().unwrap().outcome,
            Outcome::ReadyForDetach
        );
    }

    #[test]
    fn a_refusing_app_fails_the_migration_and_the_others_come_back() {
        let mut r = rig("refuse");
        let ok = r.app(Behaviour::Obedient);
        let bad = r.app(Behaviour::Refusing);
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
            .unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Failed);
        assert!(resp.error.unwrap().contains("the process refuses"));
        assert_eq!(
            (r.mode(ok), r.mode(bad)),
            (Mode::Passthrough, Mode::Passthrough)
        );
    }

    #[test]
    fn a_module_that_refuses_to_unload_rolls_everything_back() {
        let mut r = rig("module");
        let a = r.app(Behaviour::Obedient);
        let modules = FakeModules {
            refuse_unload: Some("nvidia_modeset".into()),
            ..r.modules.clone()
        };
        let mut d = r.daemon(modules, true);
        let ch = r.ch();
        ch.post(remote(), None).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Failed);
        assert_eq!(resp.rollback, Some(Rollback::Complete));
        assert!(
            resp.error
                .as_deref()
                .unwrap()
                .contains("module nvidia_modeset is in use"),
            "{resp:?}"
        );
        // The two unloaded before it were loaded again, in reverse.
        assert_eq!(
            *r.modules.log.lock().unwrap(),
            [
                "unload nvidia_uvm",
                "unload nvidia_drm",
                "load nvidia_drm",
                "load nvidia_uvm"
            ]
        );
        assert_eq!(r.modules.loaded.lock().unwrap().len(), 4);
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    #[test]
    fn a_process_holding_the_gpu_fails_the_migration() {
        let mut r = rig("holder");
        let a = r.app(Behaviour::Obedient);
        std::fs::write(r.run.join("gpu0"), b"").unwrap();
        let mut holder = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec 3<'{}'; exec sleep 60",
                r.run.join("gpu0").display()
            ))
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        ch.post(remote(), None).unwrap();
        d.step().unwrap();
        let _ = holder.kill();
        let _ = holder.wait();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Failed);
        let err = resp.error.unwrap();
        assert!(
            err.contains(&format!("pid {} (sleep) has open", holder.id())),
            "{err}"
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert!(r.modules.log.lock().unwrap().is_empty());
    }

    #[test]
    fn exited_processes_are_dropped_without_blocking_the_others() {
        let mut r = rig("gone");
        let a = r.app(Behaviour::Obedient);
        // A socket left by a process that exited.
        let mut c = Command::new("true").spawn().unwrap();
        let dead = c.id();
        c.wait().unwrap();
        std::fs::write(crane_control::socket_path(&r.run, dead), b"").unwrap();
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        let req = ch
            .post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
            .unwrap();
        d.step().unwrap();
        assert_eq!(
            ch.response().unwrap().unwrap().outcome,
            Outcome::ReadyForDetach
        );
        let apps = ch.app_results(req.seq).unwrap();
        assert_eq!(
            apps.iter().find(|x| x.pid == dead).unwrap().outcome,
            AppOutcome::Gone
        );
        assert_eq!(r.mode(a), Mode::Suspended);
    }

    /// At prepare-resume after a remote migration, a process killed while
    /// its guest migrated is dropped (gone); the others are back in
    /// passthrough and the resume succeeds.
    #[test]
    fn a_process_killed_during_the_migration_is_dropped_at_the_resume() {
        let mut r = rig("resume-killed");
        let a = r.app(Behaviour::Obedient);
        let mut victim = Command::new("sleep").arg("120").spawn().unwrap();
        let killed = victim.id();
        r.apps.push(spawn(&r.run, killed, Behaviour::Obedient));
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        assert_eq!(
            ask(&ch, &mut d, remote()).1.outcome,
            Outcome::ReadyForDetach
        );
        // Killed: its socket is left behind, nobody listening.
        victim.kill().unwrap();
        victim.wait().unwrap();
        let sock = crane_control::socket_path(&r.run, killed);
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, b"").unwrap();
        let (req, resp) = ask(&ch, &mut d, Op::RESUME);
        assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
        let apps = ch.app_results(req.seq).unwrap();
        let of = |pid| apps.iter().find(|x| x.pid == pid).unwrap().outcome;
        assert_eq!(
            (of(a), of(killed)),
            (AppOutcome::Passthrough, AppOutcome::Gone)
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
    }

    /// At prepare-resume, a process killed on its way back from crane-proxy
    /// (its request never answered, its socket closed, the process a zombie
    /// its parent has not reaped yet) is gone: the resume completes for the
    /// others and the guest is not left degraded.
    #[test]
    fn a_process_killed_on_its_way_back_is_gone_and_the_resume_completes() {
        let mut r = rig("resume-dies");
        let a = r.app(Behaviour::Obedient);
        let mut victim = Command::new("sleep").arg("120").spawn().unwrap();
        let killed = victim.id();
        r.apps
            .push(spawn(&r.run, killed, Behaviour::DiesComingBack));
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        assert_eq!(
            ask(&ch, &mut d, remote()).1.outcome,
            Outcome::ReadyForDetach
        );
        let (req, resp) = ask(&ch, &mut d, Op::RESUME);
        assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
        let apps = ch.app_results(req.seq).unwrap();
        let of = |pid| apps.iter().find(|x| x.pid == pid).unwrap().outcome;
        assert_eq!(
            (of(a), of(killed)),
            (AppOutcome::Passthrough, AppOutcome::Gone)
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
        // Reaped only now: the agent saw a zombie.
        assert!(victim.try_wait().unwrap().is_some());
    }

    /// At prepare-resume, a process that will not come back (its rebuild
    /// fails) stays on crane-proxy and fails the resume: the guest is
    /// degraded (dom0 tries the resume again later), the others are back in
    /// passthrough.
    #[test]
    fn a_process_that_stays_away_fails_the_resume_and_the_others_come_back() {
        let mut r = rig("resume-away");
        let a = r.app(Behaviour::Obedient);
        let away = r.app(Behaviour::StaysAway);
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        assert_eq!(
            ask(&ch, &mut d, remote()).1.outcome,
            Outcome::ReadyForDetach
        );
        let (req, resp) = ask(&ch, &mut d, Op::RESUME);
        assert_eq!(resp.outcome, Outcome::Failed, "{resp:?}");
        assert!(
            resp.error
                .as_deref()
                .unwrap_or("")
                .contains("1 of 2 processes"),
            "{resp:?}"
        );
        let apps = ch.app_results(req.seq).unwrap();
        let of = |pid| apps.iter().find(|x| x.pid == pid).unwrap().outcome;
        assert_eq!(of(a), AppOutcome::Passthrough);
        assert_eq!(of(away), AppOutcome::Failed);
        assert_eq!((r.mode(a), r.mode(away)), (Mode::Passthrough, Mode::Remote));
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Degraded
        );
    }

    /// A process stalled on its way back (its move back answers only after
    /// the resume's deadline) fails that resume: the guest is degraded, the
    /// others are home. It finishes coming back on its own, and dom0's next
    /// attempt finds it home: resumed.
    #[test]
    fn a_process_stalled_on_its_way_back_fails_the_resume_until_it_is_home() {
        let mut r = rig("resume-stalled");
        let a = r.app(Behaviour::Obedient);
        let stalled = r.app(Behaviour::StallsComingBack(Duration::from_millis(1500)));
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        assert_eq!(
            ask(&ch, &mut d, remote()).1.outcome,
            Outcome::ReadyForDetach
        );
        let started = Instant::now();
        let req = ch.post(Op::RESUME, Some(300)).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(1400),
            "the resume waited for the stalled process"
        );
        assert_eq!(resp.outcome, Outcome::Failed, "{resp:?}");
        assert!(
            resp.error
                .as_deref()
                .unwrap_or("")
                .contains("1 of 2 processes"),
            "{resp:?}"
        );
        let apps = ch.app_results(req.seq).unwrap();
        let of = |pid| apps.iter().find(|x| x.pid == pid).unwrap().outcome;
        assert_eq!(of(a), AppOutcome::Passthrough);
        assert!(!of(stalled).is_success(), "{apps:?}");
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Degraded
        );
        // Home on its own; the next attempt resumes the guest.
        while r.mode(stalled) != Mode::Passthrough {
            assert!(started.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, resp) = ask(&ch, &mut d, Op::RESUME);
        assert_eq!(resp.outcome, Outcome::Resumed, "{resp:?}");
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    #[test]
    fn a_device_that_never_becomes_usable_leaves_processes_parked() {
        let mut r = rig("probe");
        let a = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), false);
        let ch = r.ch();
        ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
            .unwrap();
        d.step().unwrap();
        ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Failed);
        assert!(
            resp.error
                .unwrap()
                .contains("/dev/nvidiactl does not exist")
        );
        // Still safely suspended; dom0 may retry.
        assert_eq!(r.mode(a), Mode::Suspended);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Detached(DetachKind::StopAndCopy)
        );
    }

    #[test]
    fn malformed_and_out_of_sequence_requests_are_rejected() {
        let mut r = rig("reject");
        let a = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), true);
        let ch = r.ch();
        let key = absolute(DOMID, REQUEST);
        r.dom0
            .write(&key, "seq=5 op=prepare-migrate mode=teleport")
            .unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!((resp.seq, resp.outcome), (5, Outcome::Rejected));
        assert!(
            resp.error
                .unwrap()
                .contains("malformed request: mode=\"teleport\"")
        );
        r.dom0.write(&key, "\u{1}\u{2}garbage").unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!((resp.seq, resp.outcome), (0, Outcome::Rejected));
        assert!(resp.error.unwrap().contains("not printable"));
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(ch.agent_state().unwrap().unwrap().last_seq, 0);

        let done = ch
            .post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
            .unwrap();
        d.step().unwrap();
        ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        // An old request replayed.
        r.dom0
            .write(
                &key,
                &crane_xs::message::Request {
                    seq: done.seq,
                    op: remote(),
                    deadline_ms: None,
                }
                .format(),
            )
            .unwrap();
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Rejected);
        assert!(
            resp.error.as_deref().unwrap().contains("out of sequence"),
            "{resp:?}"
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    #[test]
    fn a_request_the_guest_wrote_itself_is_ignored() {
        let mut r = rig("forged");
        let a = r.app(Behaviour::Obedient);
        let mut d = r.daemon(r.modules.clone(), true);
        // dom0 wrongly made crane/ writable by the guest; the guest (say, a
        // compromised process) writes a request: xenstored makes it the owner.
        let crane = absolute(DOMID, "crane");
        r.dom0
            .set_perms(
                &crane,
                &[Perm::new(0, Access::None), Perm::new(DOMID, Access::Both)],
            )
            .unwrap();
        r.guest
            .write(REQUEST, "seq=1 op=prepare-migrate mode=stop-and-copy")
            .unwrap();
        assert_eq!(r.guest.get_perms(REQUEST).unwrap()[0].domid, DOMID);
        d.step().unwrap();
        let ch = r.ch();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!(resp.outcome, Outcome::Rejected);
        assert!(
            resp.error
                .as_deref()
                .unwrap()
                .contains("owned by domain 7, not by dom0"),
            "{resp:?}"
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert!(r.modules.log.lock().unwrap().is_empty());
        // A dom0-owned request the guest may write is not trusted either.
        r.dom0.rm(&absolute(DOMID, REQUEST)).unwrap();
        r.dom0
            .write(
                &absolute(DOMID, REQUEST),
                "seq=1 op=prepare-migrate mode=stop-and-copy",
            )
            .unwrap();
        d.step().unwrap();
        assert!(
            ch.response()
                .unwrap()
                .unwrap()
                .error
                .unwrap()
                .contains("domain 7 may write")
        );
        assert_eq!(r.mode(a), Mode::Passthrough);
        // Without the mistake the guest cannot write the request at all.
        r.dom0
            .set_perms(
                &crane,
                &[Perm::new(0, Access::None), Perm::new(DOMID, Access::Read)],
            )
            .unwrap();
        r.dom0.rm(&absolute(DOMID, REQUEST)).unwrap();
        assert!(
            r.guest
                .write(REQUEST, "seq=9 op=prepare-resume")
                .unwrap_err()
                .is_access_denied()
        );
    }

    #[test]
    fn a_restarted_agent_keeps_its_sequence_and_state() {
        let mut r = rig("restart");
        let a = r.app(Behaviour::Obedient);
        let ch = r.ch();
        {
            let mut d = r.daemon(r.modules.clone(), true);
            ch.post(Op::PrepareMigrate(MigrateMode::StopAndCopy), None)
                .unwrap();
            d.step().unwrap();
        }
        let mut d = r.daemon(r.modules.clone(), true);
        d.step().unwrap();
        assert_eq!(d.agent().state().last_seq, 1);
        assert_eq!(
            d.agent().state().state,
            GuestState::Detached(DetachKind::StopAndCopy)
        );
        assert_eq!(ch.next_seq().unwrap(), 2);
        ch.post(Op::RESUME, None).unwrap();
        d.step().unwrap();
        assert_eq!(ch.response().unwrap().unwrap().outcome, Outcome::Resumed);
        assert_eq!(r.mode(a), Mode::Passthrough);
        drop(r.store.clone());
    }

    /// crane-agent dead (or not started yet) when dom0 posts prepare-resume
    /// on arrival: the agent started again takes the request waiting there
    /// at its first step and resumes the processes (one it had taken and
    /// died in is posted again by craned with a new sequence number, which
    /// a restarted agent takes the same way).
    #[test]
    fn a_restarted_agent_takes_the_resume_posted_while_it_was_down() {
        let mut r = rig("restart-resume");
        let a = r.app(Behaviour::Obedient);
        let ch = r.ch();
        {
            let mut d = r.daemon(r.modules.clone(), true);
            assert_eq!(
                ask(&ch, &mut d, remote()).1.outcome,
                Outcome::ReadyForDetach
            );
        }
        // Down: the request waits in XenStore.
        let req = ch.post(Op::RESUME, None).unwrap();
        let mut d = r.daemon(r.modules.clone(), true);
        d.step().unwrap();
        let resp = ch.response().unwrap().unwrap();
        assert_eq!((resp.seq, resp.outcome), (req.seq, Outcome::Resumed));
        assert_eq!(r.mode(a), Mode::Passthrough);
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }

    /// crane-agent killed during the move back: some processes were back in
    /// passthrough when it died (a move back runs in the process and ends
    /// there whatever happens to the agent), others still on crane-proxy;
    /// craned's prepare-resume goes untaken and is posted again. The agent
    /// started again takes it, leaves the processes already home as they
    /// are and brings the others back: `Resumed`, every process in
    /// passthrough.
    #[test]
    fn an_agent_killed_during_the_move_back_finishes_it_when_restarted() {
        let mut r = rig("killed-moving-back");
        let home = r.app(Behaviour::Obedient);
        let away = r.app(Behaviour::Obedient);
        let ch = r.ch();
        {
            let mut d = r.daemon(r.modules.clone(), true);
            assert_eq!(
                ask(&ch, &mut d, remote()).1.outcome,
                Outcome::ReadyForDetach
            );
            assert_eq!((r.mode(home), r.mode(away)), (Mode::Remote, Mode::Remote));
        }
        // The agent died after the first process was back, its request
        // unanswered; craned posts prepare-resume again.
        *r.apps
            .iter()
            .find(|a| a.pid == home)
            .unwrap()
            .mode
            .lock()
            .unwrap() = Mode::Passthrough;
        let mut d = r.daemon(r.modules.clone(), true);
        let (req, resp) = ask(&ch, &mut d, Op::RESUME);
        assert_eq!((resp.seq, resp.outcome), (req.seq, Outcome::Resumed));
        assert_eq!(
            (r.mode(home), r.mode(away)),
            (Mode::Passthrough, Mode::Passthrough)
        );
        assert_eq!(
            ch.agent_state().unwrap().unwrap().state,
            GuestState::Passthrough
        );
    }
}
