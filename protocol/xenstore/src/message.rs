//! The messages crane exchanges over XenStore and the guest's state machine:
//! dom0 posts a [`Request`] (with a sequence number), the agent answers with a
//! [`Response`] and per-process [`AppResult`]s, and publishes its
//! [`AgentState`]. [`check_seq`] and [`plan`] are the rules both sides follow.

use std::fmt;

use crate::layout::{MAX_APP_RESULT_LEN, MAX_REQUEST_LEN, MAX_RESPONSE_LEN, MAX_STATE_LEN};
use crate::value::{Fields, ValueError, bad_value, clip_error, format_ms, parse_ms, parse_u64};

/// Longest deadline a request may carry (one hour).
pub const MAX_DEADLINE_MS: u64 = 3_600_000;
/// Longest proxy session token.
pub const MAX_TOKEN_LEN: usize = 256;
/// Most timed phases in a response.
pub const MAX_PHASES: usize = 16;

/// How the interposed processes leave the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigrateMode {
    /// Live migration: processes carry on over RPC to crane-proxy.
    Remote {
        /// `tcp://HOST:PORT` or `unix:/PATH`.
        proxy: String,
        token: Option<String>,
    },
    /// Stop-and-copy: processes park their GPU state in RAM and wait.
    StopAndCopy,
}

/// What the processes were switched to, without the proxy details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetachKind {
    Remote,
    StopAndCopy,
}

impl DetachKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DetachKind::Remote => "remote",
            DetachKind::StopAndCopy => "stop-and-copy",
        }
    }
}

impl MigrateMode {
    pub fn kind(&self) -> DetachKind {
        match self {
            MigrateMode::Remote { .. } => DetachKind::Remote,
            MigrateMode::StopAndCopy => DetachKind::StopAndCopy,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Move every process off the GPU, unload the GPU driver, answer
    /// `ready-for-detach`.
    PrepareMigrate(MigrateMode),
    /// A GPU is attached (or, `no_gpu`, none is coming): load the driver,
    /// wait for the device, bring every process back to passthrough on the
    /// devices `device` names, answer `resumed`.
    PrepareResume(ResumeTarget),
}

/// Where a prepare-resume takes the processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeTarget {
    /// A device spec (`crane_control::DeviceSpec`: `home`, `cpu`, `gpu`,
    /// `accelerator`, or text from a device's name): the processes, also those
    /// already in passthrough, move onto those devices. None: each process
    /// goes back to the devices it was on.
    pub device: Option<String>,
    /// No GPU is attached: the agent loads no GPU driver and waits for no
    /// device (the processes go to the guest's own OpenCL devices, the CPU).
    pub no_gpu: bool,
}

/// Whether `v` is 1 to `max` bytes, each ASCII alphanumeric or in `extra`.
fn of_charset(v: &str, max: usize, extra: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= max
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

impl ResumeTarget {
    /// No GPU attached: the processes go to the guest's CPU device.
    pub fn cpu_without_gpu() -> ResumeTarget {
        ResumeTarget {
            device: Some("cpu".into()),
            no_gpu: true,
        }
    }

    /// A GPU again: the processes go back onto the devices they started on.
    pub fn home() -> ResumeTarget {
        ResumeTarget {
            device: Some("home".into()),
            no_gpu: false,
        }
    }
}

/// Longest device spec in a request.
pub const MAX_DEVICE_SPEC_LEN: usize = 64;

/// Checks a device spec: 1 to 64 characters of `[A-Za-z0-9._:+-]` (a
/// request's fields are separated by spaces).
pub fn validate_device(d: &str) -> Result<(), ValueError> {
    if of_charset(d, MAX_DEVICE_SPEC_LEN, b"._:+-") {
        Ok(())
    } else {
        Err(bad_value(
            "device",
            d,
            "want 1 to 64 characters of [A-Za-z0-9._:+-]",
        ))
    }
}

impl Op {
    /// prepare-resume back onto the devices the processes were on.
    pub const RESUME: Op = Op::PrepareResume(ResumeTarget {
        device: None,
        no_gpu: false,
    });

    pub fn name(&self) -> &'static str {
        match self {
            Op::PrepareMigrate(_) => "prepare-migrate",
            Op::PrepareResume(_) => "prepare-resume",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Strictly increasing; 1 or more.
    pub seq: u64,
    pub op: Op,
    /// The whole operation's deadline; the agent's configured default when
    /// absent.
    pub deadline_ms: Option<u64>,
}

/// Checks a proxy address: `tcp://HOST:PORT` or `unix:/PATH`.
pub fn validate_proxy(p: &str) -> Result<(), ValueError> {
    let bad = |why| bad_value("proxy", p, why);
    if let Some(rest) = p.strip_prefix("tcp://") {
        let (host, port) = rest.rsplit_once(':').ok_or(bad("no :PORT"))?;
        let port_ok = parse_u64("proxy", port).is_ok_and(|n| (1..=65535).contains(&n));
        if !port_ok {
            return Err(bad("port is not 1 to 65535"));
        }
        let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            !v6.is_empty()
                && v6
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        } else {
            !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        };
        if !host_ok {
            return Err(bad("not a host name or address"));
        }
        Ok(())
    } else if let Some(path) = p.strip_prefix("unix:") {
        if !path.starts_with('/') || path.len() > 107 {
            return Err(bad("not an absolute socket path of at most 107 bytes"));
        }
        Ok(())
    } else {
        Err(bad("want tcp://HOST:PORT or unix:/PATH"))
    }
}

/// Checks a session token: 1 to 256 characters of `[A-Za-z0-9._~+/=-]`.
pub fn validate_token(t: &str) -> Result<(), ValueError> {
    if of_charset(t, MAX_TOKEN_LEN, b"._~+/=-") {
        Ok(())
    } else {
        Err(bad_value(
            "token",
            "(hidden)",
            "want 1 to 256 characters of [A-Za-z0-9._~+/=-]",
        ))
    }
}

impl Request {
    pub fn parse(s: &str) -> Result<Request, ValueError> {
        let mut f = Fields::parse(s, MAX_REQUEST_LEN)?;
        let seq = f.required_u64("seq")?;
        if seq == 0 {
            return Err(bad_value("seq", "0", "sequence numbers start at 1"));
        }
        let op = f.required("op")?;
        let deadline_ms = f.u64("deadline-ms")?;
        if let Some(d) = deadline_ms
            && !(1..=MAX_DEADLINE_MS).contains(&d)
        {
            return Err(bad_value(
                "deadline-ms",
                &d.to_string(),
                "want 1 to 3600000",
            ));
        }
        let op = match op.as_str() {
            "prepare-migrate" => {
                let mode = f.required("mode")?;
                match mode.as_str() {
                    "remote" => {
                        let proxy = f.required("proxy")?;
                        validate_proxy(&proxy)?;
                        let token = f.take("token");
                        if let Some(t) = &token {
                            validate_token(t)?;
                        }
                        Op::PrepareMigrate(MigrateMode::Remote { proxy, token })
                    }
                    "stop-and-copy" => Op::PrepareMigrate(MigrateMode::StopAndCopy),
                    other => {
                        return Err(bad_value("mode", other, "want remote or stop-and-copy"));
                    }
                }
            }
            "prepare-resume" => {
                let device = f.take("device");
                if let Some(d) = &device {
                    validate_device(d)?;
                }
                let no_gpu = match f.take("gpu").as_deref() {
                    None => false,
                    Some("none") => true,
                    Some(other) => return Err(bad_value("gpu", other, "want none")),
                };
                Op::PrepareResume(ResumeTarget { device, no_gpu })
            }
            other => {
                return Err(bad_value(
                    "op",
                    other,
                    "want prepare-migrate or prepare-resume",
                ));
            }
        };
        f.finish()?;
        Ok(Request {
            seq,
            op,
            deadline_ms,
        })
    }

    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("seq", self.seq.to_string())
            .push("op", self.op.name());
        match &self.op {
            Op::PrepareMigrate(mode) => {
                f.push("mode", mode.kind().as_str());
                if let MigrateMode::Remote { proxy, token } = mode {
                    f.push("proxy", proxy.as_str());
                    if let Some(t) = token {
                        f.push("token", t.as_str());
                    }
                }
            }
            Op::PrepareResume(t) => {
                if let Some(d) = &t.device {
                    f.push("device", d.as_str());
                }
                if t.no_gpu {
                    f.push("gpu", "none");
                }
            }
        }
        if let Some(d) = self.deadline_ms {
            f.push("deadline-ms", d.to_string());
        }
        f.format()
    }

    /// Checks a request before posting it (what [`Request::parse`] would
    /// refuse on the other side).
    pub fn validate(&self) -> Result<(), ValueError> {
        let s = self.format();
        Request::parse(&s).map(|_| ())
    }
}

/// The sequence number of a request that did not parse, if one can be read
/// off it, so the rejection names it; 0 otherwise.
pub fn seq_hint(raw: &str) -> u64 {
    raw.split(' ')
        .find_map(|f| f.strip_prefix("seq="))
        .and_then(|v| parse_u64("seq", v).ok())
        .unwrap_or(0)
}

/// What a response says about its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted and under way (not final).
    Working,
    /// prepare-migrate done: no process uses the GPU, its driver is unloaded.
    ReadyForDetach,
    /// prepare-resume done: every process is back on the local GPU.
    Resumed,
    /// The operation failed and was rolled back (see `rollback`).
    Failed,
    /// The request was not acted upon (malformed, out of sequence, not
    /// written by dom0, or not allowed in the agent's state).
    Rejected,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Working => "working",
            Outcome::ReadyForDetach => "ready-for-detach",
            Outcome::Resumed => "resumed",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
        }
    }

    fn parse(v: &str) -> Result<Outcome, ValueError> {
        Ok(match v {
            "working" => Outcome::Working,
            "ready-for-detach" => Outcome::ReadyForDetach,
            "resumed" => Outcome::Resumed,
            "failed" => Outcome::Failed,
            "rejected" => Outcome::Rejected,
            _ => return Err(bad_value("outcome", v, "unknown outcome")),
        })
    }

    pub fn is_final(self) -> bool {
        self != Outcome::Working
    }
}

/// Whether a failed operation's rollback restored the state before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rollback {
    /// Driver loaded, every process back in passthrough.
    Complete,
    /// Something could not be restored; the error says what. The agent is in
    /// [`GuestState::Degraded`] and a prepare-resume retries.
    Incomplete,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTime {
    pub name: String,
    pub ms: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub seq: u64,
    pub outcome: Outcome,
    /// Wall time from reading the request to this answer.
    pub ms: f64,
    /// How many per-app results go with this response.
    pub apps: u32,
    pub phases: Vec<PhaseTime>,
    pub rollback: Option<Rollback>,
    pub error: Option<String>,
}

fn valid_phase_name(n: &str) -> bool {
    (1..=24).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
}

impl Response {
    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("seq", self.seq.to_string())
            .push("outcome", self.outcome.as_str())
            .push("ms", format_ms(self.ms))
            .push("apps", self.apps.to_string());
        if !self.phases.is_empty() {
            let phases: Vec<String> = self
                .phases
                .iter()
                .take(MAX_PHASES)
                .map(|p| format!("{}:{}", p.name, format_ms(p.ms)))
                .collect();
            f.push("phases", phases.join(","));
        }
        if let Some(r) = self.rollback {
            f.push(
                "rollback",
                match r {
                    Rollback::Complete => "complete",
                    Rollback::Incomplete => "incomplete",
                },
            );
        }
        if let Some(e) = &self.error {
            f.push("error", clip_error(e));
        }
        f.format()
    }

    pub fn parse(s: &str) -> Result<Response, ValueError> {
        let mut f = Fields::parse(s, MAX_RESPONSE_LEN)?;
        let seq = f.required_u64("seq")?;
        let outcome = Outcome::parse(&f.required("outcome")?)?;
        let ms = parse_ms("ms", &f.required("ms")?)?;
        let apps = f.required_u64("apps")?;
        let apps = u32::try_from(apps).map_err(|_| bad_value("apps", "", "too many"))?;
        let mut phases = Vec::new();
        if let Some(p) = f.take("phases") {
            for part in p.split(',') {
                let (name, ms) =
                    part.split_once(':')
                        .ok_or(bad_value("phases", &p, "want NAME:MS,..."))?;
                if !valid_phase_name(name) {
                    return Err(bad_value("phases", &p, "invalid phase name"));
                }
                phases.push(PhaseTime {
                    name: name.to_string(),
                    ms: parse_ms("phases", ms)?,
                });
            }
            if phases.len() > MAX_PHASES {
                return Err(bad_value("phases", &p, "too many phases"));
            }
        }
        let rollback = match f.take("rollback").as_deref() {
            None => None,
            Some("complete") => Some(Rollback::Complete),
            Some("incomplete") => Some(Rollback::Incomplete),
            Some(v) => return Err(bad_value("rollback", v, "want complete or incomplete")),
        };
        let error = f.take("error");
        if error
            .as_ref()
            .is_some_and(|e| e.chars().count() > crate::layout::MAX_ERROR_CHARS)
        {
            return Err(bad_value("error", "", "error text too long"));
        }
        f.finish()?;
        Ok(Response {
            seq,
            outcome,
            ms,
            apps,
            phases,
            rollback,
            error,
        })
    }

    pub fn phase(&self, name: &str) -> Option<f64> {
        self.phases.iter().find(|p| p.name == name).map(|p| p.ms)
    }
}

/// What happened to one interposed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppOutcome {
    /// Now forwarding to crane-proxy.
    Remote,
    /// GPU state in RAM, waiting for resume.
    Suspended,
    /// Back on (or still on) the local GPU.
    Passthrough,
    /// The process exited during the operation.
    Gone,
    /// The process answered with an error (it carries on as before).
    Failed,
    /// The process did not answer before the deadline.
    TimedOut,
}

impl AppOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            AppOutcome::Remote => "remote",
            AppOutcome::Suspended => "suspended",
            AppOutcome::Passthrough => "passthrough",
            AppOutcome::Gone => "gone",
            AppOutcome::Failed => "failed",
            AppOutcome::TimedOut => "timed-out",
        }
    }

    fn parse(v: &str) -> Result<AppOutcome, ValueError> {
        Ok(match v {
            "remote" => AppOutcome::Remote,
            "suspended" => AppOutcome::Suspended,
            "passthrough" => AppOutcome::Passthrough,
            "gone" => AppOutcome::Gone,
            "failed" => AppOutcome::Failed,
            "timed-out" => AppOutcome::TimedOut,
            _ => return Err(bad_value("result", v, "unknown result")),
        })
    }

    /// Whether the process is in a state the operation can build on.
    pub fn is_success(self) -> bool {
        !matches!(self, AppOutcome::Failed | AppOutcome::TimedOut)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AppResult {
    pub seq: u64,
    pub pid: u32,
    pub outcome: AppOutcome,
    pub ms: f64,
    pub error: Option<String>,
}

impl AppResult {
    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("seq", self.seq.to_string())
            .push("pid", self.pid.to_string())
            .push("result", self.outcome.as_str())
            .push("ms", format_ms(self.ms));
        if let Some(e) = &self.error {
            f.push("error", clip_error(e));
        }
        f.format()
    }

    pub fn parse(s: &str) -> Result<AppResult, ValueError> {
        let mut f = Fields::parse(s, MAX_APP_RESULT_LEN)?;
        let seq = f.required_u64("seq")?;
        let pid = f.required_u64("pid")?;
        let pid = u32::try_from(pid).map_err(|_| bad_value("pid", "", "out of range"))?;
        let outcome = AppOutcome::parse(&f.required("result")?)?;
        let ms = parse_ms("ms", &f.required("ms")?)?;
        let error = f.take("error");
        f.finish()?;
        Ok(AppResult {
            seq,
            pid,
            outcome,
            ms,
            error,
        })
    }
}

/// Where the guest stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestState {
    /// GPU attached, driver loaded, processes on the local GPU.
    Passthrough,
    /// prepare-migrate under way.
    Migrating,
    /// No process uses the GPU and its driver is unloaded: dom0 may detach.
    Detached(DetachKind),
    /// prepare-resume under way.
    Resuming,
    /// A rollback did not complete; prepare-resume retries it.
    Degraded,
}

impl GuestState {
    fn name(self) -> &'static str {
        match self {
            GuestState::Passthrough => "passthrough",
            GuestState::Migrating => "migrating",
            GuestState::Detached(_) => "detached",
            GuestState::Resuming => "resuming",
            GuestState::Degraded => "degraded",
        }
    }
}

impl fmt::Display for GuestState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GuestState::Detached(k) => write!(f, "detached ({})", k.as_str()),
            s => f.write_str(s.name()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentState {
    pub state: GuestState,
    /// The last request sequence number the agent acted upon (0: none yet).
    pub last_seq: u64,
}

impl AgentState {
    pub fn format(&self) -> String {
        let mut f = Fields::new();
        f.push("state", self.state.name());
        if let GuestState::Detached(k) = self.state {
            f.push("mode", k.as_str());
        }
        f.push("last-seq", self.last_seq.to_string());
        f.format()
    }

    pub fn parse(s: &str) -> Result<AgentState, ValueError> {
        let mut f = Fields::parse(s, MAX_STATE_LEN)?;
        let name = f.required("state")?;
        let state = match name.as_str() {
            "passthrough" => GuestState::Passthrough,
            "migrating" => GuestState::Migrating,
            "resuming" => GuestState::Resuming,
            "degraded" => GuestState::Degraded,
            "detached" => match f.required("mode")?.as_str() {
                "remote" => GuestState::Detached(DetachKind::Remote),
                "stop-and-copy" => GuestState::Detached(DetachKind::StopAndCopy),
                v => return Err(bad_value("mode", v, "want remote or stop-and-copy")),
            },
            v => return Err(bad_value("state", v, "unknown state")),
        };
        let last_seq = f.required_u64("last-seq")?;
        f.finish()?;
        Ok(AgentState { state, last_seq })
    }
}

/// How a request's sequence number relates to the last one handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqCheck {
    /// Greater: act on it.
    New,
    /// Equal: already answered (watches fire again; nothing to do).
    Repeat,
    /// Smaller: out of sequence, rejected.
    Stale,
}

pub fn check_seq(last_seq: u64, seq: u64) -> SeqCheck {
    use std::cmp::Ordering::*;
    match seq.cmp(&last_seq) {
        Greater => SeqCheck::New,
        Equal => SeqCheck::Repeat,
        Less => SeqCheck::Stale,
    }
}

/// What the agent does with a new request in a given state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Run,
    /// Nothing to do: answer with this outcome at once.
    AlreadyDone(Outcome),
    /// Not allowed now; the reason is the rejection's error.
    Refuse(String),
}

/// The transition table. prepare-resume is always allowed, so dom0 can bring a
/// guest back to passthrough from anywhere (after a failed migration or an
/// incomplete rollback too); prepare-migrate needs passthrough.
pub fn plan(state: GuestState, op: &Op) -> Plan {
    match (state, op) {
        (GuestState::Migrating | GuestState::Resuming, _) => {
            Plan::Refuse(format!("the agent is busy ({state})"))
        }
        (GuestState::Passthrough, Op::PrepareMigrate(_)) => Plan::Run,
        (GuestState::Detached(k), Op::PrepareMigrate(m)) if k == m.kind() => {
            Plan::AlreadyDone(Outcome::ReadyForDetach)
        }
        (GuestState::Detached(k), Op::PrepareMigrate(_)) => Plan::Refuse(format!(
            "already detached for {}; send prepare-resume first",
            k.as_str()
        )),
        (GuestState::Degraded, Op::PrepareMigrate(_)) => {
            Plan::Refuse("a rollback did not complete; send prepare-resume first".into())
        }
        (_, Op::PrepareResume(_)) => Plan::Run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Op {
        Op::PrepareMigrate(MigrateMode::Remote {
            proxy: "tcp://10.77.0.2:7000".into(),
            token: Some("s3cr3t-T0ken".into()),
        })
    }

    #[test]
    fn requests_round_trip() {
        for (op, deadline_ms) in [
            (remote(), Some(30_000)),
            (Op::PrepareMigrate(MigrateMode::StopAndCopy), None),
            (Op::RESUME, Some(5)),
            (
                Op::PrepareResume(ResumeTarget {
                    device: Some("cpu".into()),
                    no_gpu: true,
                }),
                None,
            ),
            (
                Op::PrepareResume(ResumeTarget {
                    device: Some("H100".into()),
                    no_gpu: false,
                }),
                Some(9),
            ),
        ] {
            let r = Request {
                seq: 42,
                op,
                deadline_ms,
            };
            assert_eq!(Request::parse(&r.format()).unwrap(), r);
        }
        assert_eq!(
            Request {
                seq: 3,
                op: remote(),
                deadline_ms: Some(100)
            }
            .format(),
            "seq=3 op=prepare-migrate mode=remote proxy=tcp://10.77.0.2:7000 token=s3cr3t-T0ken deadline-ms=100"
        );
        assert_eq!(
            Request::parse("seq=4 op=prepare-resume device=cpu gpu=none")
                .unwrap()
                .op,
            Op::PrepareResume(ResumeTarget {
                device: Some("cpu".into()),
                no_gpu: true
            })
        );
    }

    #[test]
    fn malformed_requests_say_why() {
        let cases: &[(&str, &str)] = &[
            ("op=prepare-resume", "seq is missing"),
            ("seq=0 op=prepare-resume", "start at 1"),
            ("seq=1 op=explode", "want prepare-migrate"),
            ("seq=1 op=prepare-migrate", "mode is missing"),
            ("seq=1 op=prepare-migrate mode=remote", "proxy is missing"),
            (
                "seq=1 op=prepare-migrate mode=remote proxy=http://x",
                "want tcp://",
            ),
            (
                "seq=1 op=prepare-migrate mode=remote proxy=tcp://x:0",
                "port",
            ),
            (
                "seq=1 op=prepare-migrate mode=remote proxy=tcp://a%20b:1",
                "host",
            ),
            (
                "seq=1 op=prepare-migrate mode=remote proxy=unix:rel",
                "absolute",
            ),
            (
                "seq=1 op=prepare-migrate mode=remote proxy=tcp://h:1 token=%00",
                "token",
            ),
            (
                "seq=1 op=prepare-migrate mode=stop-and-copy proxy=tcp://h:1",
                "unknown key proxy",
            ),
            ("seq=1 op=prepare-resume deadline-ms=0", "1 to 3600000"),
            ("seq=1 op=prepare-resume extra=1", "unknown key extra"),
            ("seq=-1 op=prepare-resume", "decimal"),
            ("seq=1 op=prepare-resume gpu=some", "want none"),
            ("seq=1 op=prepare-resume device=", "device"),
            ("seq=1 op=prepare-resume device=a%2Fb", "[A-Za-z0-9._:+-]"),
            (
                "seq=1 op=prepare-migrate mode=stop-and-copy device=cpu",
                "unknown key device",
            ),
        ];
        for (raw, want) in cases {
            let e = Request::parse(raw).unwrap_err().to_string();
            assert!(e.contains(want), "{raw:?}: {e}");
        }
        assert_eq!(seq_hint("seq=9 op=nope"), 9);
        assert_eq!(seq_hint("garbage"), 0);
    }

    #[test]
    fn token_never_appears_in_errors() {
        let e =
            Request::parse("seq=1 op=prepare-migrate mode=remote proxy=tcp://h:1 token=ab%20cd")
                .unwrap_err()
                .to_string();
        assert!(!e.contains("ab cd"), "{e}");
    }

    #[test]
    fn responses_and_app_results_round_trip() {
        let r = Response {
            seq: 9,
            outcome: Outcome::Failed,
            ms: 1234.5,
            apps: 2,
            phases: vec![
                PhaseTime {
                    name: "apps".into(),
                    ms: 12.25,
                },
                PhaseTime {
                    name: "modules".into(),
                    ms: 3.0,
                },
            ],
            rollback: Some(Rollback::Complete),
            error: Some("module nvidia: in use (EBUSY)".into()),
        };
        assert_eq!(Response::parse(&r.format()).unwrap(), r);
        assert_eq!(r.phase("apps"), Some(12.25));
        let a = AppResult {
            seq: 9,
            pid: 4242,
            outcome: AppOutcome::TimedOut,
            ms: 5000.0,
            error: Some("no answer".into()),
        };
        assert_eq!(AppResult::parse(&a.format()).unwrap(), a);
        for bad in [
            "seq=1 outcome=maybe ms=1 apps=0",
            "seq=1 outcome=resumed ms=1",
            "seq=1 outcome=resumed ms=1 apps=0 phases=a",
            "seq=1 outcome=resumed ms=1 apps=0 phases=A:1",
            "seq=1 outcome=resumed ms=1 apps=99999999999",
        ] {
            assert!(Response::parse(bad).is_err(), "{bad}");
        }
        let many = (0..17)
            .map(|i| format!("p:{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(
            Response::parse(&format!("seq=1 outcome=resumed ms=1 apps=0 phases={many}")).is_err()
        );
    }

    #[test]
    fn agent_state_round_trip() {
        for state in [
            GuestState::Passthrough,
            GuestState::Detached(DetachKind::Remote),
            GuestState::Detached(DetachKind::StopAndCopy),
            GuestState::Degraded,
        ] {
            let s = AgentState { state, last_seq: 5 };
            assert_eq!(AgentState::parse(&s.format()).unwrap(), s);
        }
        assert!(AgentState::parse("state=detached last-seq=1").is_err());
    }

    #[test]
    fn sequence_and_transitions() {
        assert_eq!(check_seq(4, 5), SeqCheck::New);
        assert_eq!(check_seq(4, 4), SeqCheck::Repeat);
        assert_eq!(check_seq(4, 3), SeqCheck::Stale);
        let sc = Op::PrepareMigrate(MigrateMode::StopAndCopy);
        assert_eq!(plan(GuestState::Passthrough, &sc), Plan::Run);
        assert_eq!(
            plan(GuestState::Detached(DetachKind::StopAndCopy), &sc),
            Plan::AlreadyDone(Outcome::ReadyForDetach)
        );
        assert!(matches!(
            plan(GuestState::Detached(DetachKind::StopAndCopy), &remote()),
            Plan::Refuse(_)
        ));
        assert!(matches!(plan(GuestState::Degraded, &sc), Plan::Refuse(_)));
        for s in [
            GuestState::Passthrough,
            GuestState::Degraded,
            GuestState::Detached(DetachKind::Remote),
        ] {
            assert_eq!(plan(s, &Op::RESUME), Plan::Run);
        }
    }
}
