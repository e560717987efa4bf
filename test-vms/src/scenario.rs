//! crane on the emulated Xen hosts, the way an operator runs it:
//!
//! 1. dom0 of every host runs `craned` (its configuration written here: the GPU pool
//!    is the host's stand-in GPU, an e1000 passed through, whose driver stands in for
//!    the GPU driver) and has the xl wrapper at `/usr/local/sbin/xl`. craned on host 0
//!    creates and supervises the proxy domain (PV) and gives it its own stand-in GPU;
//!    crane-proxy there follows the tokens craned publishes in XenStore. The other
//!    host's craned uses that proxy across the linked bridges;
//! 2. the GPU guest (HVM) runs `crane-agent`; it gets host 0's GPU. An OpenCL program
//!    runs natively in the guest (ICD loader, PoCL), then again under crane (the
//!    guest's drop-in `libOpenCL.so.1`), and holds halfway: it keeps checking its
//!    device buffer against its host mirror with small blocking reads;
//! 3. meanwhile, through the wrapper: `xl migrate` to the same host and then to host 1
//!    (live, xl's own transport): craned asks the agent to prepare, the agent moves
//!    the program to crane-proxy (remote mode), unloads the GPU driver, craned
//!    detaches the GPU, xl migrates, the destination's craned attaches its GPU, the
//!    agent loads the driver, waits until the device is bound and brings the program
//!    back onto it; then `xl save` and `xl restore` on host 1 (stop-and-copy: the
//!    program is parked, not remoted). A monitor in the guest samples crane's view of
//!    the program all along;
//! 4. the program is released, must end with exit status 0 and the same result as
//!    the native run, and must have been seen running remote.
//!
//! The end-to-end tier (tests/xen_host.rs) runs this with two hosts; `cargo xtask
//! demo` runs it as the demo (one host: the same-host migration and stop-and-copy).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use crane_control::{AppStatus, Mode};
use crane_xs::layout::{AGENT_RESPONSE, REQUEST, absolute};
use crane_xs::message::{Op, Outcome, Request, Response};

use crate::CommandOutput;
use crate::domus::{GUEST_TESTAPPS_DIR, PROXY_PORT, PROXY_TOKEN_FILE};
use crate::host::{GUEST_STANDIN_BDF, PROXY_STANDIN_BDF, dom0_address, shell_quote};
use crate::session::Session;
use crate::xl::{DomainKind, DomuConfig, find_domain, parse_xl_list, standin_slot};

/// The HVM domain that runs OpenCL programs under crane.
pub const GUEST: &str = "gpuguest";
/// The PV domain that runs crane-proxy.
pub const PROXY: &str = "proxy";
pub const PROXY_IP: &str = "10.77.0.2";
pub const GUEST_IP: &str = "10.77.0.3";
/// The plain PV domain of the tier's stop-and-copy check.
pub const PV_GUEST: &str = "pvguest";
pub const PV_GUEST_IP: &str = "10.77.0.4";
/// The GPU guest's twin on host 1 (two-host runs): the same image on the same
/// emulated CPU, where the program's native run goes while host 0 carries on
/// with crane.
pub const TWIN: &str = "nativeguest";
pub const TWIN_IP: &str = "10.77.0.5";
/// Where the native run in the twin keeps its output, exit status and times.
const NATIVE_DIR: &str = "/tmp/crane-native";
/// How often the held program checks its device (`TESTAPP_HOLD_MS`): every
/// check of a program on the proxy is a round trip over the emulated network,
/// work for the one CPU of host 0 that the moves' memory copies need more.
const HOLD_CHECK_MS: u32 = 100;
/// Memory of the GPU guest. A live migration copies all of it, so it is kept small:
/// the OpenCL runtime comes from a disk, its pages are only cached. PoCL compiling a
/// program caches about 150 MB of LLVM; with 256 MB the guest thrashed (every evicted
/// page is decompressed again from squashfs) and, after minutes, triple-faulted.
pub const GUEST_MEMORY_MIB: u32 = 384;
/// Memory of the proxy domain (PV, never live-migrated). PoCL compiling a program
/// takes about 150 MB of LLVM: with 256 MB, crane-proxy died rebuilding the guest's
/// program.
pub const PROXY_MEMORY_MIB: u32 = 384;
const MIGRATION_PORT: u16 = 8002;
/// Where the program under crane runs in the guest: its pid, output, exit status, the
/// file that releases it from its hold, and the monitor's samples.
const APP_DIR: &str = "/tmp/crane-app";
/// The xl wrapper in dom0; `/usr/sbin/xl` is Debian's.
pub const WRAPPER: &str = "/usr/local/sbin/xl";
/// The secret every host's craned derives the guests' proxy tokens from.
const TOKEN_SECRET: &str = "e2e-secret-0123456789abcdef0123456789abcdef\n";
/// The deadline craned gives the guest agent to prepare a move and to resume. Under
/// software emulation PoCL compiles a program in 40 s or more (pingpong: 40 s in the
/// guest; the proxy compiles it again when the program first goes remote), where a
/// GPU driver takes a tenth of a second; the defaults (30 s, 60 s) are for GPUs.
const MOVE_DEADLINE_MS: u64 = 300_000;
/// How long craned lets the guest agent take to pick up a request (`agent_ack_ms`).
/// A running agent takes one within a second here too; the default (10 s) has room
/// for a guest whose only emulated CPU is busy.
const AGENT_ACK_MS: u64 = 15_000;
/// Failed health checks (one per 1 s tick) before craned recreates the proxy domain:
/// the scenario pauses the proxy domain for a few seconds to show a refused
/// migration, and recreating it (a boot and PoCL's compiler under emulation) is not
/// what that step is about.
const PROXY_PATIENCE: u32 = 120;
/// The paused domain that holds the destination's GPU so that a guest arrives to no
/// free GPU (PV, never started: it only holds the device).
const HOLDER: &str = "gpu-holder";
/// Where a stop-and-copy keeps the guest: dom0's tmpfs (its root file system, which
/// carries the domU images, has no room for the guest's memory).
const SAVE_FILE: &str = "/run/xen-save/gpuguest.chk";

/// The OpenCL program the scenario runs: one of the test programs in the guest, which
/// honours `TESTAPP_HOLD` (testapps/c/pingpong.c does), or any program of the build
/// machine (`host_path`, copied into the guest image with the libraries it needs),
/// which is migrated while it runs, however far it has got.
#[derive(Debug, Clone)]
pub struct App {
    pub program: String,
    pub args: Vec<String>,
    /// A program built on this machine (`cargo xtask demo --app PATH`); `None`: the
    /// guest's test program `program`.
    pub host_path: Option<std::path::PathBuf>,
}

impl Default for App {
    /// `pingpong`: its kernel arguments are re-set every iteration and its buffers
    /// rotate, so any state crane failed to rebuild shows in the result. The
    /// moves happen while it holds halfway (checking its buffer against its
    /// host mirror), so more iterations add no coverage, only emulated time:
    /// 1000 (4000 until session 16, when the 2000 before the hold took
    /// minutes under crane in the emulated guest).
    fn default() -> Self {
        Self {
            program: "pingpong".into(),
            args: vec!["--iters".into(), "1000".into()],
            host_path: None,
        }
    }
}

/// Where a program of the build machine lands in the guest.
pub const GUEST_APP_DIR: &str = "/opt/crane-app";

impl App {
    /// `cargo xtask demo --app PATH -- ARGS`.
    pub fn from_host(path: &std::path::Path, args: Vec<String>) -> anyhow::Result<Self> {
        ensure!(path.is_file(), "{} is not a file", path.display());
        let program = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| crane_xs::layout::valid_element(n))
            .with_context(|| {
                format!(
                    "{}: name the program [A-Za-z0-9_-] for the guest",
                    path.display()
                )
            })?
            .to_owned();
        Ok(Self {
            program,
            args,
            host_path: Some(path.to_path_buf()),
        })
    }

    /// Whether the program holds halfway until released (the guest's test programs).
    pub fn holds(&self) -> bool {
        self.host_path.is_none()
    }

    /// The program's path in the guest.
    pub fn guest_path(&self) -> String {
        match self.host_path {
            Some(_) => format!("{GUEST_APP_DIR}/{}", self.program),
            None => format!("{GUEST_TESTAPPS_DIR}/{}", self.program),
        }
    }

    /// (file on this machine, its path in the guest) to add to the guest's image.
    pub fn guest_files(&self) -> Vec<(std::path::PathBuf, String)> {
        self.host_path
            .iter()
            .map(|p| (p.clone(), self.guest_path()))
            .collect()
    }

    fn command_line(&self) -> String {
        let mut line = shell_quote(&self.guest_path());
        for arg in &self.args {
            line.push(' ');
            line.push_str(&shell_quote(arg));
        }
        line
    }

    /// What two runs must agree on: the `RESULT` line of a test program, the whole
    /// standard output of any other program.
    fn outcome(&self, stdout: &str) -> String {
        if self.holds() {
            stdout
                .lines()
                .rev()
                .find(|l| l.starts_with("RESULT "))
                .unwrap_or_default()
                .to_owned()
        } else {
            stdout.trim_end().to_owned()
        }
    }
}

/// One run of the program: its `RESULT` line, exit status and output.
#[derive(Debug, Clone)]
pub struct AppRun {
    pub result: String,
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    pub seconds: f64,
}

impl AppRun {
    fn new(app: &App, stdout: String, stderr: String, status: i32, seconds: f64) -> Self {
        let result = app.outcome(&stdout);
        Self {
            result,
            status,
            stdout,
            stderr,
            seconds,
        }
    }
}

/// How the guest moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// `xl migrate` through the wrapper (remote mode).
    Live { from: usize, to: usize },
    /// `xl save` then `xl restore` through the wrapper on one host (stop-and-copy).
    SaveRestore { host: usize },
    /// A request written with `xenstore-write` under dom0's crane tree on `from`
    /// (the XenStore trigger): craned runs `xl migrate` itself. To another host, the
    /// destination has no free GPU when the guest arrives (a paused domain holds
    /// it): the program stays on crane-proxy, craned there is killed and restarted,
    /// and when the GPU frees the guest gets it and the program comes back.
    Xenstore { from: usize, to: usize },
}

impl Move {
    /// The host the guest runs on after the move.
    pub fn destination(&self) -> usize {
        match *self {
            Move::Live { to, .. } | Move::Xenstore { to, .. } => to,
            Move::SaveRestore { host } => host,
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            Move::Live { from, to } => format!("xl migrate host {from} -> host {to} (remote mode)"),
            Move::SaveRestore { host } => {
                format!("xl save + xl restore on host {host} (stop-and-copy)")
            }
            Move::Xenstore { from, to } => {
                format!("XenStore request: migrate host {from} -> host {to} (remote mode)")
            }
        }
    }

    /// [`Move::describe`], with what the full scenario adds to a cross-host
    /// XenStore move.
    pub fn describe_in(&self, scope: Scope) -> String {
        match *self {
            Move::Xenstore { from, to } if from != to && scope == Scope::Full => format!(
                "{}; no GPU free there: refused (policy refuse), then accepted with the \
                 program on the guest's CPU until the GPU frees (policy cpu), craned \
                 restarted meanwhile",
                self.describe()
            ),
            _ => self.describe(),
        }
    }
}

/// One move of the guest through the wrapper, and what crane did meanwhile.
#[derive(Debug, Clone)]
pub struct Migration {
    pub how: Move,
    pub domid_before: u32,
    pub domid_after: u32,
    pub uptime_before: f64,
    pub uptime_after: f64,
    pub seconds: f64,
    /// The wrappers' progress lines (source, then destination).
    pub log: String,
    /// The modes the guest's monitor saw the program in while it moved.
    pub modes_seen: Vec<Mode>,
    /// The longest the program was stopped by the pre-migration (its switch to
    /// crane-proxy or into RAM) and by the post-migration (back onto the GPU), as
    /// craned reported them.
    pub pre_stop_ms: Option<f64>,
    pub post_stop_ms: Option<f64>,
}

/// What the proxy domain showed.
#[derive(Debug, Clone)]
pub struct ProxyCheck {
    /// `clinfo -l` in the proxy domain.
    pub opencl: String,
    /// The slot at which the proxy sees its own stand-in GPU.
    pub gpu_slot: String,
    /// crane-proxy's log at the end.
    pub log: String,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub proxy: ProxyCheck,
    /// The slot at which the guest sees its GPU.
    pub gpu_slot: String,
    pub native: AppRun,
    pub crane: AppRun,
    /// The program's pid in the guest (the same all along).
    pub pid: u32,
    pub migrations: Vec<Migration>,
    /// What the agent answered when driven by hand (xenstore-write, xl).
    pub by_hand: Option<String>,
    /// The wrapper's output when it refused a migration with the proxy paused.
    pub refused: Option<String>,
    /// What happened when the proxy domain was destroyed ([`proxy_recreated`]).
    pub recreated: String,
    /// The proxy domain destroyed under the program
    /// ([`proxy_death_under_program`]), for a program that holds.
    pub proxy_death: Option<String>,
}

impl Report {
    /// A human summary, one line per step.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "proxy domain: crane-proxy running, its own GPU at {}",
            self.proxy.gpu_slot
        );
        let _ = writeln!(
            out,
            "native run in the guest:  {}  (status {}, {:.1} s)",
            self.native.result, self.native.status, self.native.seconds
        );
        if let Some(r) = &self.by_hand {
            let _ = writeln!(
                out,
                "the agent driven by hand (xenstore-write, xl pci-detach/attach):"
            );
            for line in r.lines().filter(|l| l.starts_with("crane:")) {
                let _ = writeln!(out, "    {line}");
            }
        }
        if let Some(r) = &self.refused {
            let _ = writeln!(
                out,
                "proxy domain paused: xl migrate refused, nothing changed"
            );
            for line in r.lines().filter(|l| l.starts_with("crane:")) {
                let _ = writeln!(out, "    {line}");
            }
        }
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
        for m in &self.migrations {
            let _ = writeln!(
                out,
                "{}: {:.1} s (domain {} -> {}); pid {} seen {:?}",
                m.how.describe(),
                m.seconds,
                m.domid_before,
                m.domid_after,
                self.pid,
                m.modes_seen
            );
            let _ = writeln!(
                out,
                "    stoppage of the program: pre-migration {}, post-migration {}",
                ms(m.pre_stop_ms),
                ms(m.post_stop_ms)
            );
            for line in m.log.lines().filter(|l| l.starts_with("crane:")) {
                let _ = writeln!(out, "    {line}");
            }
        }
        let _ = writeln!(
            out,
            "under crane:              {}  (status {}, {:.1} s, {} move(s))",
            self.crane.result,
            self.crane.status,
            self.crane.seconds,
            self.migrations.len()
        );
        if let Some(death) = &self.proxy_death {
            let _ = write!(out, "{}", death.replace("crane: ", ""));
        }
        let _ = write!(out, "{}", self.recreated.replace("crane: ", ""));
        out
    }
}

/// The proxy domain's xl configuration (craned creates the domain from it).
pub fn proxy_config() -> DomuConfig {
    DomuConfig {
        name: PROXY.into(),
        kind: DomainKind::Pv,
        address: format!("{PROXY_IP}/24"),
        memory_mib: PROXY_MEMORY_MIB,
        ramdisk: crate::PROXY_INITRD.into(),
    }
}

/// A plain PV domain (busybox, the command runner): small, so that `xl save` and
/// `xl restore` of it take seconds under emulation. (With 96 MB the kernel ran out
/// of memory unpacking its 12 MB initramfs: Xen's swiotlb takes 64 MB of a PV
/// domain.)
pub fn pv_guest_config() -> DomuConfig {
    DomuConfig {
        name: PV_GUEST.into(),
        kind: DomainKind::Pv,
        address: format!("{PV_GUEST_IP}/24"),
        memory_mib: 160,
        ramdisk: crate::PLAIN_INITRD.into(),
    }
}

pub fn guest_config() -> DomuConfig {
    DomuConfig {
        name: GUEST.into(),
        kind: DomainKind::Hvm,
        address: format!("{GUEST_IP}/24"),
        memory_mib: GUEST_MEMORY_MIB,
        ramdisk: crate::CRANE_GUEST_INITRD.into(),
    }
}

/// The GPU guest's twin (see [`TWIN`]).
pub fn twin_config() -> DomuConfig {
    DomuConfig {
        name: TWIN.into(),
        address: format!("{TWIN_IP}/24"),
        ..guest_config()
    }
}

/// craned's configuration on host `host`: host 0 runs the proxy domain (with its own
/// GPU), every host gives its stand-in GPU to the guest and points the guest's
/// processes at the proxy.
pub fn craned_config(host: usize) -> String {
    craned_config_with(host, "wait")
}

/// [`craned_config`] with the policy for arriving guests when no GPU is free
/// (`wait` or `refuse`).
fn craned_config_with(host: usize, no_free_gpu: &str) -> String {
    let proxy = if host == 0 {
        format!(
            "domain = \"{PROXY}\"\nconfig = \"/etc/xen/crane/{PROXY}.cfg\"\ngpu = \"{PROXY_STANDIN_BDF}\"\n"
        )
    } else {
        String::new()
    };
    format!(
        "guests = [\"{GUEST}\"]\nno_free_gpu = \"{no_free_gpu}\"\ntick_ms = 1000\nagent_timeout_ms = 120000\n\
         agent_ack_ms = {AGENT_ACK_MS}\n\
         migrate_deadline_ms = {MOVE_DEADLINE_MS}\nresume_deadline_ms = {MOVE_DEADLINE_MS}\n\
         [gpus]\npool = [\"{GUEST_STANDIN_BDF}\"]\n\
         [proxy]\naddress = \"tcp://{PROXY_IP}:{PROXY_PORT}\"\n\
         failures_before_restart = {PROXY_PATIENCE}\n{proxy}\
         [tokens]\nsecret_file = \"/etc/crane/token-secret\"\n"
    )
}

/// Writes craned's configuration, the token secret and the proxy's xl configuration
/// in every dom0 (idempotent).
pub fn write_dom0_configs(s: &Session) -> anyhow::Result<()> {
    for host in 0..s.hosts.len() {
        s.dom0(
            host,
            &format!(
                "mkdir -p /etc/crane /etc/xen/crane /run/crane /run/xen-save && \
                 cat > /etc/xen/crane/{PROXY}.cfg <<'CFG'\n{}CFG\n\
                 cat > /etc/crane/craned.toml <<'CFG'\n{}CFG\n\
                 (umask 077 && printf %s {} > /etc/crane/token-secret)",
                proxy_config().render(),
                craned_config(host),
                shell_quote(TOKEN_SECRET),
            ),
        )?;
    }
    Ok(())
}

/// Starts craned on every host (configurations as [`write_dom0_configs`]); waits
/// until `crane status` answers. On host 0 craned creates the proxy domain if it does
/// not run yet.
pub fn start_craned(s: &Session) -> anyhow::Result<()> {
    write_dom0_configs(s)?;
    for host in 0..s.hosts.len() {
        spawn_craned(s, host)?;
    }
    Ok(())
}

pub fn create_domain(s: &Session, host: usize, config: &DomuConfig) -> anyhow::Result<()> {
    let name = &config.name;
    s.dom0(
        host,
        &format!(
            "mkdir -p /etc/xen/crane && cat > /etc/xen/crane/{name}.cfg <<'CFG'\n{}CFG\n\
             xl create /etc/xen/crane/{name}.cfg",
            config.render()
        ),
    )?;
    Ok(())
}

/// Waits until the domU's command runner answers (it starts last in the domU's boot).
pub fn wait_booted(s: &Session, host: usize, name: &str) -> anyhow::Result<()> {
    s.wait_domu(host, name, "hostname", Duration::from_secs(300), |out| {
        out.trim() == name
    })?;
    Ok(())
}

/// Waits until craned has created the proxy domain and given it its GPU, crane-proxy
/// runs there with the guest's token in its token file (mode 0600), and PoCL works.
pub fn check_proxy(s: &Session) -> anyhow::Result<ProxyCheck> {
    s.wait_dom0(0, "xl list", Duration::from_secs(60), |o| {
        find_domain(&parse_xl_list(o), PROXY).is_some()
    })
    .context("craned did not create the proxy domain")?;
    wait_booted(s, 0, PROXY)?;
    let tokens = s.wait_domu(
        0,
        PROXY,
        &format!("stat -c %a {PROXY_TOKEN_FILE} && grep -c ' {GUEST}$' {PROXY_TOKEN_FILE}; true"),
        Duration::from_secs(60),
        |out| out.lines().nth(1) == Some("1"),
    )?;
    ensure!(
        tokens.lines().next() == Some("600"),
        "crane-proxy's token file has mode {tokens:?}"
    );
    s.wait_domu(
        0,
        PROXY,
        "pidof crane-proxy",
        Duration::from_secs(30),
        |out| !out.trim().is_empty(),
    )?;
    let opencl = s.domu(0, PROXY, "clinfo -l")?;
    ensure!(
        opencl.contains("Portable Computing Language"),
        "PoCL is not an OpenCL platform in the proxy domain: {opencl}"
    );
    // craned passes the proxy its own GPU; pcifront shows it and its driver binds it.
    let lspci = s.wait_domu(
        0,
        PROXY,
        "lspci -n 2>&1; true",
        Duration::from_secs(240),
        |out| standin_slot(out).is_some(),
    )?;
    let gpu_slot = standin_slot(&lspci).context("the proxy's GPU vanished from lspci")?;
    s.wait_domu(
        0,
        PROXY,
        &format!("readlink /sys/bus/pci/devices/0000:{gpu_slot}/driver"),
        Duration::from_secs(240),
        |out| out.contains("drivers/e1000"),
    )?;
    Ok(ProxyCheck {
        opencl,
        gpu_slot,
        log: String::new(),
    })
}

/// craned's view of the proxy on host 0 (`crane status --json`).
fn proxy_status(s: &Session) -> anyhow::Result<Option<craned_control::ProxyStatus>> {
    let out = s.dom0(0, "/usr/sbin/crane status --json")?;
    let st: craned_control::Status =
        serde_json::from_str(&out).with_context(|| format!("parsing crane status: {out}"))?;
    Ok(st.proxy)
}

/// The proxy domain dies (`xl destroy`): craned notices at its next check, creates
/// it again from its configuration, passes it its GPU and publishes the tokens, and
/// crane-proxy answers again ([`check_proxy`] on the new domain). Returns what
/// craned reported.
pub fn proxy_recreated(s: &Session) -> anyhow::Result<String> {
    let before = proxy_status(s)?.context("craned reports no proxy")?;
    let old = before.domid.context("craned reports no proxy domain")?;
    ensure!(
        before.healthy,
        "the proxy is not healthy before: {before:?}"
    );
    s.dom0(0, &format!("xl destroy {PROXY}"))?;
    let started = Instant::now();
    s.wait_dom0(
        0,
        "/usr/sbin/crane status --json",
        Duration::from_secs(240),
        |o| {
            serde_json::from_str::<craned_control::Status>(o)
                .ok()
                .and_then(|st| st.proxy)
                .is_some_and(|p| p.healthy && p.domid.is_some_and(|d| d != old))
        },
    )
    .context("craned did not bring the destroyed proxy domain back")?;
    let seconds = started.elapsed().as_secs_f64();
    check_proxy(s).context("the recreated proxy domain")?;
    let after = proxy_status(s)?.context("craned reports no proxy")?;
    Ok(format!(
        "crane: proxy domain {old} destroyed; craned created it again as domain {} \
         with its GPU and the guest's token, crane-proxy answering after {seconds:.0} s\n",
        after.domid.unwrap_or_default()
    ))
}

/// crane-proxy's death under a program on it, on host 0. The program (holding, one
/// small blocking read every [`HOLD_CHECK_MS`]) is moved to crane-proxy with
/// `cranectl remote` and the guest's token; the proxy domain is destroyed (`xl
/// destroy`: nothing reaches the guest, no FIN, no RST) and craned creates it again
/// ([`proxy_recreated`]). craned tells the guest where crane-proxy is now
/// (`crane/proxy-now`), crane-agent redirects the program, which leaves its silent
/// connection, waits for the new proxy (not for its own TCP timeout) and replays its
/// session there; `cranectl local` brings it home. The program's result, compared
/// with the native run's at the end, shows that nothing was lost. Returns what
/// happened, with the program's and the agent's account of it.
pub fn proxy_death_under_program(s: &Session, pid: u32) -> anyhow::Result<String> {
    const TOKEN: &str = "/run/crane/proxy-token";
    let token = s.domu(
        0,
        PROXY,
        &format!("sed -n 's/ {GUEST}$//p' {PROXY_TOKEN_FILE}"),
    )?;
    let token = token.trim();
    ensure!(
        !token.is_empty(),
        "no token for {GUEST} in the proxy domain"
    );
    let addr = format!("tcp://{PROXY_IP}:{PROXY_PORT}");
    let moved = s.domu(
        0,
        GUEST,
        &format!(
            "(umask 077 && printf %s {} > {TOKEN}) && \
             cranectl remote {pid} --proxy {addr} --token-file {TOKEN} 2>&1; echo status=$?",
            shell_quote(token)
        ),
    )?;
    ensure!(
        moved.contains("status=0"),
        "cranectl remote failed: {moved}"
    );
    let status = app_status(s, 0, pid)?.context("the program has no control socket")?;
    ensure!(
        status.mode == Mode::Remote,
        "pid {pid} after cranectl remote: {status:?}"
    );
    let started = Instant::now();
    let recreated = proxy_recreated(s)?;
    // Shell built-ins only (see `wait_holding`).
    let err = wait_in(
        s,
        0,
        GUEST,
        &format!(
            "{{ h=; while IFS= read -r l; do case \"$l\" in *'took the session back'*) h=1; break;; esac; \
             done < {APP_DIR}/err; [ -n \"$h\" ] || ! [ -d /proc/{pid} ]; }}"
        ),
        Duration::from_secs(300),
        &format!("cat {APP_DIR}/err"),
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let account: Vec<&str> = err.lines().filter(|l| l.starts_with("crane")).collect();
    ensure!(
        err.contains(&format!("crane-proxy at {addr} took the session back")),
        "the program did not take its session back to the recreated proxy:\n{err}"
    );
    let agent = s.domu(
        0,
        GUEST,
        "grep -a 'crane-proxy is now at' /var/log/crane-agent.log; true",
    )?;
    ensure!(
        agent.contains("on crane-proxy redirected there"),
        "crane-agent redirected no process:\n{agent}"
    );
    let home = s.domu(
        0,
        GUEST,
        &format!("cranectl local {pid} 2>&1; echo status=$?"),
    )?;
    ensure!(home.contains("status=0"), "cranectl local failed: {home}");
    let status = app_status(s, 0, pid)?.context("the program has no control socket")?;
    ensure!(
        status.mode == Mode::Passthrough,
        "pid {pid} after cranectl local: {status:?}"
    );
    let mut log = recreated;
    let _ = writeln!(
        log,
        "crane: pid {pid} on crane-proxy when its domain was destroyed: its session taken \
         back by the recreated proxy {seconds:.0} s after the destruction, then home again"
    );
    for line in account {
        let _ = writeln!(log, "    program: {line}");
    }
    for line in agent.lines() {
        let _ = writeln!(log, "    crane-agent: {line}");
    }
    Ok(log)
}

/// The proxy domain destroyed while the guest migrates (issue 17's fault
/// matrix: crane-proxy during the transfer, full scope): a same-host `xl
/// migrate` through the wrapper, the program on crane-proxy meanwhile, and
/// once craned's journal says the GPU is detached (xl is transferring the
/// guest), `xl destroy` of the proxy domain by a watcher in dom0 (the serial
/// line carries one conversation at a time, so the test cannot do it
/// itself while the wrapper runs). craned recreates the proxy domain; the
/// program takes its session back there (or, failing that, goes to the
/// local GPU from what it kept); the arrival's prepare-resume waits for it,
/// tried again by craned until it completes, the program back in
/// passthrough (its result is compared at the end, as every move's).
pub fn proxy_death_during_migration(
    s: &Session,
    pid: u32,
    samples: &mut usize,
) -> anyhow::Result<(Migration, String)> {
    let before = proxy_status(s)?.context("craned reports no proxy")?;
    let old = before.domid.context("craned reports no proxy domain")?;
    ensure!(
        before.healthy,
        "the proxy is not healthy before: {before:?}"
    );
    const MARK: &str = "/run/crane-proxy-killed";
    s.dom0(
        0,
        &format!(
            "rm -f {MARK}; (n=0; until xenstore-read /local/domain/0/crane/migrations/{GUEST} \
             2>/dev/null | grep -q 'phase=detached'; do n=$((n+1)); [ $n -lt 2400 ] || exit 0; \
             sleep 0.25; done; xl destroy {PROXY} && date +%s.%N > {MARK}) \
             </dev/null >/dev/null 2>&1 &"
        ),
    )?;
    let how = Move::Live { from: 0, to: 0 };
    let uptime_before = guest_uptime(s, 0)?;
    let domid_before = guest_domid(s, 0)?.context("the guest is not running")?;
    let started = Instant::now();
    let mut log = wrapper(
        s,
        0,
        &format!("migrate -s '' {GUEST} '{WRAPPER} migrate-receive'"),
    )?;
    for want in ["prepare-migrate", "detached", "Migration successful"] {
        ensure!(
            log.contains(want),
            "the wrapper did not report {want:?}:\n{log}"
        );
    }
    let domid_after = guest_domid(s, 0)?.context("the guest does not run after the move")?;
    ensure!(
        domid_after != domid_before,
        "a migration to the same host creates a new domain"
    );
    // The arrival's prepare-resume waits for the program, which waits for a
    // proxy to take its session back (or gives up and goes local): craned
    // tries the resume again until it completes.
    let resumed = wait_agent(s, 0, "passthrough")
        .context("the guest's agent did not come back to passthrough")?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(
        s.dom0(0, &format!("xl pci-list {GUEST}"))?
            .contains(GUEST_STANDIN_BDF),
        "the guest has no GPU after the move"
    );
    wait_gpu_bound(s, 0)?;
    let status = app_status(s, 0, pid)?.context("the program has no control socket")?;
    ensure!(
        status.mode == Mode::Passthrough,
        "pid {pid} is {:?} after the move",
        status.mode
    );
    let uptime_after = guest_uptime(s, 0)?;
    ensure!(
        uptime_after > uptime_before,
        "the guest did not keep running"
    );
    let (modes_seen, total) = modes_since(s, 0, pid, *samples)?;
    *samples = total;
    let status = s.dom0(0, "/usr/sbin/crane status")?;
    let _ = writeln!(log, "{}", resumed.trim());
    let receives: Vec<&str> = status.lines().filter(|l| l.contains("receive")).collect();
    for l in &receives {
        let _ = writeln!(log, "{l}");
    }
    // The way back as craned reports it (the receiving wrapper has ended by
    // then, its output gone with it).
    let post_stop_ms = receives
        .iter()
        .rev()
        .find_map(|l| number_after(l, "longest stop "));
    let m = Migration {
        how,
        domid_before,
        domid_after,
        uptime_before,
        uptime_after,
        seconds,
        pre_stop_ms: number_after(&log, "pre-migration stoppage "),
        post_stop_ms,
        log,
        modes_seen,
    };
    let killed = s.dom0(0, &format!("cat {MARK} 2>/dev/null; true"))?;
    ensure!(
        !killed.trim().is_empty(),
        "the watcher did not destroy the proxy domain during the transfer"
    );
    s.wait_dom0(
        0,
        "/usr/sbin/crane status --json",
        Duration::from_secs(240),
        |o| {
            serde_json::from_str::<craned_control::Status>(o)
                .ok()
                .and_then(|st| st.proxy)
                .is_some_and(|p| p.healthy && p.domid.is_some_and(|d| d != old))
        },
    )
    .context("craned did not bring the destroyed proxy domain back")?;
    check_proxy(s).context("the recreated proxy domain")?;
    let err = s.domu(0, GUEST, &format!("cat {APP_DIR}/err"))?;
    let account: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("crane") && (l.contains("proxy") || l.contains("local")))
        .collect();
    let mut log = format!(
        "crane: proxy domain {old} destroyed during the guest's transfer; the migration \
         completed, the program back in passthrough\n"
    );
    for line in account.iter().rev().take(6).rev() {
        let _ = writeln!(log, "    program: {line}");
    }
    Ok((m, log))
}

/// Waits until the guest's agent has published its state in XenStore (craned set up
/// its keys) and the state is `want`.
pub fn wait_agent(s: &Session, host: usize, want: &str) -> anyhow::Result<String> {
    s.wait_dom0(
        host,
        &format!("xenstore-read /local/domain/$(xl domid {GUEST})/crane/agent/state"),
        Duration::from_secs(300),
        |o| o.split_whitespace().any(|f| f == format!("state={want}")),
    )
}

/// `readlink` of the GPU's driver and its network interfaces (the e1000 has one).
fn gpu_bound_script(slot: &str) -> String {
    format!(
        "readlink /sys/bus/pci/devices/0000:{slot}/driver && ls /sys/bus/pci/devices/0000:{slot}/net"
    )
}

/// Passes `host`'s stand-in GPU through to the guest and waits until the guest's GPU
/// driver (e1000) is bound to it; returns the slot the guest sees it at.
pub fn attach_gpu(s: &Session, host: usize) -> anyhow::Result<String> {
    let bdf = GUEST_STANDIN_BDF;
    s.dom0(
        host,
        &format!(
            "xl pci-assignable-list | grep -q {bdf} || xl pci-assignable-add {bdf}\n\
             xl pci-attach {GUEST} {bdf}"
        ),
    )?;
    ensure!(
        s.dom0(host, &format!("xl pci-list {GUEST}"))?.contains(bdf),
        "xl pci-list does not show {bdf} attached to {GUEST} on host {host}"
    );
    let lspci = s.wait_domu(host, GUEST, "lspci -n", Duration::from_secs(240), |out| {
        standin_slot(out).is_some()
    })?;
    let slot = standin_slot(&lspci).context("the GPU vanished from lspci")?;
    s.domu(
        host,
        GUEST,
        "grep -q '^e1000 ' /proc/modules || insmod $(grep /e1000.ko /etc/crane/modules)",
    )?;
    s.wait_domu(
        host,
        GUEST,
        &gpu_bound_script(&slot),
        Duration::from_secs(240),
        |out| out.contains("drivers/e1000") && out.contains("eth"),
    )?;
    Ok(slot)
}

/// Passes `host`'s stand-in GPU through to the guest when it is created (craned hands
/// out GPUs to guests that arrive by migration; a guest's first GPU is its operator's
/// doing) and waits until the guest's GPU driver (e1000) is bound to it; returns the
/// slot the guest sees it at.
pub fn attach_first_gpu(s: &Session, host: usize) -> anyhow::Result<String> {
    let bdf = GUEST_STANDIN_BDF;
    s.dom0(
        host,
        &format!(
            "xl pci-assignable-list | grep -q {bdf} || xl pci-assignable-add {bdf}\n\
             xl pci-attach {GUEST} {bdf}"
        ),
    )?;
    wait_gpu_bound(s, host)
}

/// Waits until the guest sees its GPU and the driver is bound; the slot.
fn wait_gpu_bound(s: &Session, host: usize) -> anyhow::Result<String> {
    // The limits only bound how long a failure takes to show: right after an
    // attach, under emulation on a slow machine, one `lspci` took 40 s.
    let lspci = s.wait_domu(host, GUEST, "lspci -n", Duration::from_secs(240), |out| {
        standin_slot(out).is_some()
    })?;
    let slot = standin_slot(&lspci).context("the GPU vanished from lspci")?;
    s.domu(
        host,
        GUEST,
        "grep -q '^e1000 ' /proc/modules || insmod $(grep /e1000.ko /etc/crane/modules)",
    )?;
    s.wait_domu(
        host,
        GUEST,
        &gpu_bound_script(&slot),
        Duration::from_secs(60),
        |out| out.contains("drivers/e1000") && out.contains("eth"),
    )?;
    Ok(slot)
}

fn guest_uptime(s: &Session, host: usize) -> anyhow::Result<f64> {
    s.domu(host, GUEST, "cut -d' ' -f1 /proc/uptime")?
        .trim()
        .parse()
        .context("parsing /proc/uptime")
}

fn guest_domid(s: &Session, host: usize) -> anyhow::Result<Option<u32>> {
    Ok(find_domain(&parse_xl_list(&s.dom0(host, "xl list")?), GUEST).map(|d| d.id))
}

/// Runs the program in the guest natively: the ICD loader and PoCL, no crane.
pub fn run_native(s: &Session, host: usize, app: &App) -> anyhow::Result<AppRun> {
    let started = Instant::now();
    let out = s.try_domu(
        host,
        GUEST,
        &format!("cd /tmp && env -u LD_LIBRARY_PATH {}", app.command_line()),
        Duration::from_secs(600),
    )?;
    Ok(AppRun::new(
        app,
        out.stdout_text(),
        out.stderr_text(),
        out.status,
        started.elapsed().as_secs_f64(),
    ))
}

/// Starts the program's native run (the ICD loader and PoCL, without crane) in
/// the background in `domain` on `host`; [`finish_native`] collects it.
fn start_native(s: &Session, host: usize, domain: &str, app: &App) -> anyhow::Result<()> {
    let runner = format!(
        "cd /tmp\nread up _ < /proc/uptime; echo $up > {NATIVE_DIR}/start\n\
         env -u LD_LIBRARY_PATH {} > {NATIVE_DIR}/out 2> {NATIVE_DIR}/err\n\
         echo $? > {NATIVE_DIR}/status.new\nread up _ < /proc/uptime; echo $up > {NATIVE_DIR}/end\n\
         mv {NATIVE_DIR}/status.new {NATIVE_DIR}/status\n",
        app.command_line()
    );
    spawn_script(s, host, domain, NATIVE_DIR, "run", &runner, true)
}

/// Writes `script` to DIR/NAME in `domain` (DIR made afresh if `fresh`) and
/// starts it in the background, detached from the console's command.
fn spawn_script(
    s: &Session,
    host: usize,
    domain: &str,
    dir: &str,
    name: &str,
    script: &str,
    fresh: bool,
) -> anyhow::Result<()> {
    let make = if fresh {
        format!("rm -rf {dir} && mkdir -p {dir} && ")
    } else {
        String::new()
    };
    s.domu(
        host,
        domain,
        &format!(
            "{make}cat > {dir}/{name} <<'RUN'\n{script}RUN\n\
             setsid sh {dir}/{name} < /dev/null > /dev/null 2>&1 &"
        ),
    )?;
    Ok(())
}

/// Waits for the native run [`start_native`] started and returns it.
fn finish_native(s: &Session, host: usize, domain: &str, app: &App) -> anyhow::Result<AppRun> {
    let times = wait_in(
        s,
        host,
        domain,
        &format!("[ -s {NATIVE_DIR}/status ]"),
        Duration::from_secs(600),
        &format!("cat {NATIVE_DIR}/status {NATIVE_DIR}/start {NATIVE_DIR}/end 2>/dev/null; true"),
    )?;
    let fields: Vec<&str> = times.split_whitespace().collect();
    let [status, start, end] = fields[..] else {
        bail!("the native run in {domain} did not end within 600 s: {times:?}");
    };
    let seconds = end.parse::<f64>()? - start.parse::<f64>()?;
    Ok(AppRun::new(
        app,
        s.domu(host, domain, &format!("cat {NATIVE_DIR}/out"))?,
        s.domu(host, domain, &format!("cat {NATIVE_DIR}/err"))?,
        status
            .parse()
            .context("parsing the native run's exit status")?,
        seconds,
    ))
}

/// Starts the program in the background in the guest, under crane (the guest's
/// environment puts crane's `libOpenCL.so.1` first), holding halfway until released;
/// returns its pid. A program that does not hold gets its monitor (see
/// [`start_monitor`]) at once; one that holds gets it once it holds, so that the
/// monitor's cranectl runs do not slow its program build down.
pub fn start_under_crane(s: &Session, host: usize, app: &App) -> anyhow::Result<u32> {
    let runner = format!(
        "cd {APP_DIR}\nTESTAPP_HOLD={APP_DIR}/release TESTAPP_HOLD_MS={HOLD_CHECK_MS} {} > out 2> err &\necho $! > pid\n\
         wait $!\necho $? > status\n",
        app.command_line()
    );
    spawn_script(s, host, GUEST, APP_DIR, "run", &runner, true)?;
    let pid = s.wait_domu(
        host,
        GUEST,
        &format!("cat {APP_DIR}/pid 2>/dev/null || true"),
        Duration::from_secs(30),
        |out| out.trim().parse::<u32>().is_ok(),
    )?;
    if !app.holds() {
        start_monitor(s, host)?;
    }
    Ok(pid.trim().parse()?)
}

/// Starts the guest's monitor of the program under crane: it samples crane's view
/// of it every 2 s (each cranectl run costs a few tenths of a second of the guest's
/// one emulated CPU; the shortest mode it must see, `suspended` while the agent is
/// driven by hand, lasts several seconds) until the program's runner writes its
/// exit status.
fn start_monitor(s: &Session, host: usize) -> anyhow::Result<()> {
    // `cranectl list --watch` writes the listing (one JSON line per process) only
    // when a process appears, leaves or changes mode: the file is read back through
    // the guest's console, which is slow. One process polling the control sockets,
    // not a shell loop: under emulation every process started in the HVM guest
    // costs ~160 ms of its only CPU.
    let monitor = format!(
        "cranectl --json list --watch 2 >> {APP_DIR}/modes 2> /dev/null &\n\
         watch=$!\n\
         while [ ! -e {APP_DIR}/status ]; do sleep 5; done\n\
         kill $watch\n"
    );
    spawn_script(s, host, GUEST, APP_DIR, "monitor", &monitor, false)
}

/// Waits inside the domU, one shell loop checking `condition` every second, until
/// it holds or `limit` passes; then runs `then` and returns its output. Waiting from
/// outside would cost every check a command through the domU's console, which
/// takes dom0 (sharing the emulated host's one CPU with the domU) most of a second.
/// The loop waits with `read -t 1` on a fifo nobody writes, not `sleep 1`: every
/// process started in an HVM guest costs ~160 ms of its only CPU under emulation.
fn wait_in(
    s: &Session,
    host: usize,
    domain: &str,
    condition: &str,
    limit: Duration,
    then: &str,
) -> anyhow::Result<String> {
    let secs = limit.as_secs();
    let out = s.try_domu(
        host,
        domain,
        &format!(
            "fifo=/tmp/crane-wait.$$; mkfifo $fifo && exec 9<>$fifo; rm -f $fifo\n\
             n=0; until {condition}; do n=$((n+1)); [ $n -gt {secs} ] && break; read -t 1 _ <&9; done\n\
             exec 9<&-\n{then}"
        ),
        limit + Duration::from_secs(30),
    )?;
    ensure!(
        out.success(),
        "waiting in {domain} for `{condition}`: status {}: {}{}",
        out.status,
        out.stdout_text(),
        out.stderr_text()
    );
    Ok(out.stdout_text())
}

/// crane's view of the program (`cranectl --json list`), if it has a control socket.
pub fn app_status(s: &Session, host: usize, pid: u32) -> anyhow::Result<Option<AppStatus>> {
    let out = s.domu(host, GUEST, "cranectl --json list")?;
    for line in out.lines().filter(|l| l.starts_with('{')) {
        let status: AppStatus = serde_json::from_str(line)
            .with_context(|| format!("parsing cranectl's status line {line:?}"))?;
        if status.pid == pid {
            return Ok(Some(status));
        }
    }
    Ok(None)
}

/// Waits until the program under crane holds halfway (its kernels built, its first
/// half done), and checks that crane, not the ICD loader, is its `libOpenCL.so.1`.
pub fn wait_holding(s: &Session, host: usize, pid: u32) -> anyhow::Result<AppStatus> {
    let out = wait_in(
        s,
        host,
        GUEST,
        // Shell built-ins only: no process started per check.
        &format!(
            "{{ h=; ! [ -d /proc/{pid} ] || \
             while IFS= read -r l; do case \"$l\" in *'holding at iteration'*) h=1; break;; esac; done \
             < {APP_DIR}/err; [ -n \"$h\" ] || ! [ -d /proc/{pid} ]; }}"
        ),
        Duration::from_secs(600),
        &format!(
            "cat {APP_DIR}/err; [ -d /proc/{pid} ] || {{ echo; echo ended; cat {APP_DIR}/status; }}"
        ),
    )?;
    ensure!(
        out.contains("holding at iteration"),
        "the program did not reach its hold within 600 s: {out}"
    );
    let maps = s.domu(host, GUEST, &format!("cat /proc/{pid}/maps"))?;
    ensure!(
        maps.contains("/usr/lib/crane/libcrane_opencl.so"),
        "pid {pid} does not have crane's interposer mapped"
    );
    ensure!(
        !maps.contains("libOpenCL.so.1"),
        "pid {pid} has the ICD loader mapped besides crane"
    );
    let status = app_status(s, host, pid)?.context("the program has no control socket")?;
    ensure!(
        status.mode == Mode::Passthrough && status.objects.kernels > 0,
        "pid {pid} before any move: {status:?}"
    );
    Ok(status)
}

/// Whether the program under crane has exited (its runner wrote the status).
fn app_ended(s: &Session, host: usize) -> anyhow::Result<bool> {
    let status = s.domu(
        host,
        GUEST,
        &format!("cat {APP_DIR}/status 2>/dev/null; true"),
    )?;
    Ok(!status.trim().is_empty())
}

/// For a program that does not hold: waits until crane serves it (its control
/// socket answers) and checks that crane is its `libOpenCL.so.1`.
pub fn wait_running(s: &Session, host: usize, pid: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if app_status(s, host, pid)?.is_some() {
            break;
        }
        let ended = s.domu(
            host,
            GUEST,
            &format!("cat {APP_DIR}/status 2>/dev/null; true"),
        )?;
        if !ended.trim().is_empty() {
            let err = s.domu(host, GUEST, &format!("tail -5 {APP_DIR}/err"))?;
            bail!(
                "the program ended (status {}) before it could be moved: give it more work\n{err}",
                ended.trim()
            );
        }
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "pid {pid} never opened crane's control socket"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let maps = s.domu(host, GUEST, &format!("cat /proc/{pid}/maps"))?;
    ensure!(
        maps.contains("/usr/lib/crane/libcrane_opencl.so"),
        "pid {pid} does not have crane's interposer mapped"
    );
    Ok(())
}

/// The modes the monitor recorded for `pid` from line `from` on, in order, each run
/// of equal modes once; and the number of lines so far.
fn modes_since(
    s: &Session,
    host: usize,
    pid: u32,
    from: usize,
) -> anyhow::Result<(Vec<Mode>, usize)> {
    let text = s.domu_timeout(
        host,
        GUEST,
        &format!("cat {APP_DIR}/modes 2>/dev/null; true"),
        Duration::from_secs(60),
    )?;
    let lines: Vec<&str> = text.lines().collect();
    let mut seen: Vec<Mode> = Vec::new();
    for line in lines.iter().skip(from) {
        let Ok(status) = serde_json::from_str::<AppStatus>(line) else {
            continue;
        };
        if status.pid == pid && seen.last() != Some(&status.mode) {
            seen.push(status.mode);
        }
    }
    Ok((seen, lines.len()))
}

/// Runs a wrapper command in dom0; its output and stderr (the wrapper's progress),
/// failing with both when it fails.
fn wrapper(s: &Session, host: usize, args: &str) -> anyhow::Result<String> {
    // prepare-migrate and prepare-resume each may take up to their deadline.
    let limit = Duration::from_millis(3 * MOVE_DEADLINE_MS);
    let out = s.try_dom0_timeout(host, &format!("{WRAPPER} {args}"), limit)?;
    let log = out.stderr_text();
    ensure!(
        out.success(),
        "`xl {args}` through the wrapper on host {host} failed with status {}:\n{}{log}",
        out.status,
        out.stdout_text()
    );
    Ok(log)
}

/// The number after the last `key` in `text`: `post-migration stoppage ` in the
/// wrapper's `; post-migration stoppage 81.2 ms` gives 81.2.
fn number_after(text: &str, key: &str) -> Option<f64> {
    text.lines().rev().find_map(|l| {
        let rest = &l[l.find(key)? + key.len()..];
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The value of `key=` in a crane XenStore value (numbers and plain words only).
fn field<'a>(value: &'a str, key: &str) -> Option<&'a str> {
    value
        .split_whitespace()
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// Starts the receiving end of a cross-host `xl migrate` on `to`: the wrapper's
/// `migrate-receive` behind `nc`, logging to /var/log/xen/migrate-receive.log; the
/// `xl migrate` destination argument (with `-s ''`) that reaches it.
fn listen_for_migration(s: &Session, to: usize) -> anyhow::Result<String> {
    s.dom0(
        to,
        &format!(
            "setsid nc -l -p {MIGRATION_PORT} -e {WRAPPER} migrate-receive \
             > /var/log/xen/migrate-receive.log 2>&1 < /dev/null &"
        ),
    )?;
    Ok(format!(
        "socat -b 262144 - TCP:{}:{MIGRATION_PORT}",
        dom0_address(to)
    ))
}

/// Starts craned on `host` (its configuration already written).
fn spawn_craned(s: &Session, host: usize) -> anyhow::Result<()> {
    s.dom0(
        host,
        "RUST_LOG=info setsid /usr/sbin/craned >> /var/log/craned.log 2>&1 < /dev/null &",
    )?;
    s.wait_dom0(
        host,
        "/usr/sbin/crane status --json",
        Duration::from_secs(60),
        |o| o.contains("\"guests\""),
    )
    .with_context(|| format!("craned on host {host} does not answer"))?;
    Ok(())
}

/// The journal phase craned on `host` keeps for the guest (none: no entry).
fn journal_phase(s: &Session, host: usize) -> anyhow::Result<Option<String>> {
    let v = s.dom0(
        host,
        &format!("xenstore-read /local/domain/0/crane/migrations/{GUEST} 2>/dev/null; true"),
    )?;
    Ok(field(&v, "phase").map(str::to_owned))
}

/// Writes a XenStore migration request for the guest on `from` with
/// `xenstore-write` (the next id after the last result); the request and its id.
fn write_request(s: &Session, from: usize, dest: &str) -> anyhow::Result<(String, u64)> {
    use crane_xs::admin::{AdminOp, AdminRequest, MoveMode};
    let result_key = crane_xs::admin::result_key(GUEST);
    let last = s.dom0(
        from,
        &format!("xenstore-read {result_key} 2>/dev/null; true"),
    )?;
    let id = field(last.trim(), "id")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    let request = AdminRequest {
        id,
        op: AdminOp::Migrate {
            dest: dest.to_owned(),
            mode: MoveMode::Remote,
            ssh_command: Some(String::new()),
        },
    }
    .format();
    s.dom0(
        from,
        &format!(
            "xenstore-write {} {}",
            crane_xs::admin::request_key(GUEST),
            shell_quote(&request)
        ),
    )?;
    Ok((request, id))
}

/// Follows craned's result for request `id` on `from` until it is final, logging
/// every phase; the result and the phases seen.
fn follow_request(
    s: &Session,
    from: usize,
    id: u64,
    log: &mut String,
) -> anyhow::Result<(crane_xs::admin::AdminResult, Vec<String>)> {
    use crane_xs::admin::AdminResult;
    let result_key = crane_xs::admin::result_key(GUEST);
    let started = Instant::now();
    let mut phases: Vec<String> = Vec::new();
    let result = loop {
        let v = s.dom0(
            from,
            &format!("xenstore-read {result_key} 2>/dev/null; true"),
        )?;
        if let Ok(r) = AdminResult::parse(v.trim())
            && r.id == id
        {
            if let Some(p) = &r.phase
                && phases.last() != Some(p)
            {
                let _ = writeln!(
                    log,
                    "crane: [{:>6.1}s] result: {} {p}",
                    started.elapsed().as_secs_f64(),
                    r.state.as_str()
                );
                phases.push(p.clone());
            }
            if r.state.is_final() {
                break r;
            }
        }
        ensure!(
            started.elapsed() < Duration::from_millis(3 * MOVE_DEADLINE_MS),
            "craned on host {from} did not finish XenStore request {id}; phases {phases:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    let _ = writeln!(log, "crane: result: {}", result.format());
    Ok((result, phases))
}

/// Restarts craned on `host` with the given no-free-GPU policy.
fn restart_craned_with(s: &Session, host: usize, no_free_gpu: &str) -> anyhow::Result<()> {
    s.dom0(
        host,
        &format!(
            "kill $(pidof craned) 2>/dev/null; \
             for i in $(seq 50); do pidof craned >/dev/null || break; sleep 0.2; done; \
             cat > /etc/crane/craned.toml <<'CFG'\n{}CFG",
            craned_config_with(host, no_free_gpu)
        ),
    )?;
    spawn_craned(s, host)
}

/// The destination refuses: craned on `to` runs with `no_free_gpu = "refuse"` while
/// the paused holder keeps its only GPU. A XenStore-requested move from `from` then
/// fails before the domain leaves: the wrapper's migrate-receive on `to` asks craned,
/// which refuses, xl migrate ends, and craned on `from` rolls the guest back to its
/// GPU. The guest still runs on `from`, its program on the local GPU again. craned on
/// `to` runs with `cpu` afterwards. Returns the lines to show.
fn refused_move(s: &Session, from: usize, to: usize, pid: u32) -> anyhow::Result<String> {
    use crane_xs::admin::AdminState;
    let mut log = String::new();
    restart_craned_with(s, to, "refuse")?;
    let _ = writeln!(
        log,
        "crane: host {to}: craned restarted with no_free_gpu = \"refuse\""
    );
    let dest = listen_for_migration(s, to)?;
    let (request, id) = write_request(s, from, &dest)?;
    let _ = writeln!(log, "crane: host {from}: xenstore-write ... {request}");
    let (result, _) = follow_request(s, from, id, &mut log)?;
    let error = result.error.as_deref().unwrap_or("");
    ensure!(
        result.state == AdminState::Failed && error.contains("rolled back: the guest kept its GPU"),
        "a move to a host that refuses ended {} ({error})",
        result.state.as_str()
    );
    let received = s.dom0(to, "cat /var/log/xen/migrate-receive.log")?;
    ensure!(
        received.contains("refusing the incoming domain"),
        "host {to} did not refuse the guest:\n{received}"
    );
    for line in received.lines().filter(|l| l.contains("refusing")) {
        let _ = writeln!(
            log,
            "crane: host {to}'s migrate-receive: {}",
            line.trim().trim_start_matches("crane: ")
        );
    }
    ensure!(
        guest_domid(s, from)?.is_some() && guest_domid(s, to)?.is_none(),
        "the refused guest does not run on host {from} alone"
    );
    let status = app_status(s, from, pid)?;
    ensure!(
        status
            .as_ref()
            .is_some_and(|st| st.mode == Mode::Passthrough),
        "pid {pid} after the refused move: {status:?}"
    );
    let _ = writeln!(
        log,
        "crane: the guest stays on host {from}, pid {pid} back on its GPU (passthrough)"
    );
    restart_craned_with(s, to, "cpu")?;
    let _ = writeln!(
        log,
        "crane: host {to}: craned restarted with no_free_gpu = \"cpu\""
    );
    Ok(log)
}

/// The XenStore trigger (see [`Move::Xenstore`]): writes the request on `from` with
/// `xenstore-write`, follows craned's result until it is final, and on another host
/// walks the guest through a destination without a free GPU: first refused there (see
/// [`refused_move`]), then accepted with its program on the guest's own CPU (no GPU
/// driver loaded) until one frees, with a craned restart meanwhile.
/// Returns the lines to show and the pre-migration stoppage craned reported.
fn xenstore_move(
    s: &Session,
    app: &App,
    from: usize,
    to: usize,
    pid: u32,
    scope: Scope,
) -> anyhow::Result<(String, Option<f64>)> {
    use crane_xs::admin::AdminState;
    let mut log = String::new();
    let starve = from != to && scope == Scope::Full;
    if starve {
        // Another domain holds the destination's only GPU.
        s.dom0(
            to,
            &format!(
                "cat > /etc/xen/crane/{HOLDER}.cfg <<'CFG'\nname = \"{HOLDER}\"\ntype = \"pv\"\n\
                 memory = 96\nvcpus = 1\nkernel = \"{}\"\npci = [ \"{GUEST_STANDIN_BDF}\" ]\nCFG\n\
                 xl pci-assignable-list | grep -q {GUEST_STANDIN_BDF} || \
                 xl pci-assignable-add {GUEST_STANDIN_BDF}\n\
                 xl create -p /etc/xen/crane/{HOLDER}.cfg",
                crate::GUEST_KERNEL
            ),
        )?;
        let _ = writeln!(
            log,
            "crane: host {to}'s GPU is held by the paused domain {HOLDER}"
        );
        log.push_str(&refused_move(s, from, to, pid)?);
    }
    let dest = if from == to {
        format!("{WRAPPER} migrate-receive")
    } else {
        listen_for_migration(s, to)?
    };
    let (request, id) = write_request(s, from, &dest)?;
    let _ = writeln!(log, "crane: host {from}: xenstore-write ... {request}");
    let (result, phases) = follow_request(s, from, id, &mut log)?;
    let _ = writeln!(log, "crane: result: {}", result.format());
    ensure!(
        result.state == AdminState::Done,
        "XenStore request {id} ended {}: {}",
        result.state.as_str(),
        result.error.as_deref().unwrap_or("")
    );
    for want in ["prepare-migrate", "transfer"] {
        ensure!(
            phases.iter().any(|p| p == want),
            "the result never showed phase {want}: {phases:?}"
        );
    }
    if !starve {
        return Ok((log, result.pre_stop_ms));
    }
    ensure!(
        guest_domid(s, from)?.is_none(),
        "the guest still runs on host {from}"
    );
    let received = s.wait_dom0(
        to,
        "cat /var/log/xen/migrate-receive.log",
        Duration::from_secs(300),
        |o| o.contains("no GPU free") || o.contains("runs on GPU") || o.contains("failed"),
    )?;
    ensure!(
        received.contains("no GPU free, its programs run on its CPU until one frees"),
        "host {to} did not send the guest's programs to its CPU:\n{received}"
    );
    log.push_str(&received);
    ensure!(
        journal_phase(s, to)?.as_deref() == Some("on-cpu"),
        "host {to}'s journal does not show the guest on its CPU"
    );
    // The program runs in the guest again, in passthrough on the guest's own OpenCL
    // device (PoCL), while the GPU's driver stays unloaded and no GPU is attached.
    match app_status(s, to, pid)? {
        Some(status) => ensure!(
            status.mode == Mode::Passthrough,
            "pid {pid} is {:?} while its guest has no GPU",
            status.mode
        ),
        None => ensure!(!app.holds(), "pid {pid} is gone"),
    }
    let modules = s.domu(to, GUEST, "cut -d' ' -f1 /proc/modules")?;
    ensure!(
        !modules.lines().any(|m| m == "e1000"),
        "the GPU's driver is loaded in a guest without a GPU"
    );
    ensure!(
        !s.dom0(to, &format!("xl pci-list {GUEST}"))?
            .contains(GUEST_STANDIN_BDF),
        "the guest has a GPU on host {to} while another domain holds it"
    );
    // craned dies mid-migration and comes back: the journal keeps the guest waiting.
    s.dom0(to, "kill -9 $(pidof craned); sleep 1")?;
    spawn_craned(s, to)?;
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        journal_phase(s, to)?.as_deref() == Some("on-cpu"),
        "the restarted craned on host {to} lost the guest waiting on its CPU"
    );
    let _ = writeln!(
        log,
        "crane: host {to}: craned killed (SIGKILL) and restarted; the guest still runs \
         its program on its CPU (journal phase on-cpu), pid {pid} passthrough, no GPU \
         driver loaded"
    );
    // The GPU frees: the restarted craned gives it to the guest.
    s.dom0(to, &format!("xl destroy {HOLDER} 2>/dev/null; true"))?;
    let note = s.wait_dom0(
        to,
        "/usr/sbin/crane status",
        Duration::from_secs(300),
        |o| o.contains("received after waiting") || o.contains("recovery failed"),
    )?;
    let line = note
        .lines()
        .find(|l| l.contains("received after waiting") || l.contains("recovery failed"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    ensure!(line.contains("received after waiting"), "host {to}: {line}");
    let _ = writeln!(log, "crane: host {to}: {HOLDER} destroyed; craned: {line}");
    let _ = writeln!(
        log,
        "crane: {GUEST} arrived and runs on GPU {GUEST_STANDIN_BDF}"
    );
    Ok((log, result.pre_stop_ms))
}

/// Stops crane-agent in the guest with `unload` as its module list written into its
/// configuration; init starts it again. Returns once the old process is gone: a
/// request posted from then on is answered by the new one, which reads the request
/// key when it starts.
fn restart_agent(s: &Session, unload: &str) -> anyhow::Result<()> {
    s.domu(
        0,
        GUEST,
        &format!(
            "old=$(pidof crane-agent) && \
             sed -i 's/^unload = .*/unload = {unload}/' /etc/crane/agent.toml && \
             kill $old && while kill -0 $old 2>/dev/null; do sleep 0.1; done"
        ),
    )?;
    Ok(())
}

/// The guest agent driven by hand, as an operator debugging it would: dom0 writes
/// requests into the guest's `crane/request` with `xenstore-write` and detaches and
/// attaches the GPU with `xl`. A malformed request is rejected and changes nothing;
/// prepare-migrate (stop-and-copy) parks the program and unloads the GPU driver; the
/// GPU goes and comes back; prepare-resume loads the driver, waits until the device
/// is bound and resumes the program. Returns what the agent answered.
pub fn agent_by_hand(s: &Session, pid: u32) -> anyhow::Result<String> {
    use crane_xs::message::{Op, Request as AgentRequest};
    let domid = guest_domid(s, 0)?.context("the guest is not running")?;
    let base = format!("/local/domain/{domid}/crane");
    let read = |key: &str| -> anyhow::Result<String> {
        Ok(
            s.dom0(0, &format!("xenstore-read {base}/{key} 2>/dev/null; true"))?
                .trim()
                .to_owned(),
        )
    };
    let last_seq: u64 = field(&read("agent/state")?, "last-seq")
        .and_then(|v| v.parse().ok())
        .context("the agent's state has no last-seq")?;
    let post = |value: &str, seq: u64| -> anyhow::Result<String> {
        s.dom0(
            0,
            &format!("xenstore-write {base}/request {}", shell_quote(value)),
        )?;
        s.wait_dom0(
            0,
            &format!("xenstore-read {base}/agent/response"),
            Duration::from_millis(2 * MOVE_DEADLINE_MS),
            |o| {
                field(o, "seq") == Some(seq.to_string().as_str())
                    && field(o, "outcome").is_some_and(|v| v != "working")
            },
        )
        .map(|o| o.trim().to_owned())
    };
    let request_within = |seq, op, deadline_ms| {
        AgentRequest {
            seq,
            op,
            deadline_ms: Some(deadline_ms),
        }
        .format()
    };
    let request = |seq, op| request_within(seq, op, MOVE_DEADLINE_MS);
    let stop_and_copy = || Op::PrepareMigrate(crane_xs::message::MigrateMode::StopAndCopy);
    let park = |seq| post(&request(seq, stop_and_copy()), seq);
    let expect_mode = |p: u32, want: Mode, when: &str| -> anyhow::Result<()> {
        let status = app_status(s, 0, p)?.with_context(|| format!("pid {p} is gone"))?;
        ensure!(status.mode == want, "pid {p} is {:?} {when}", status.mode);
        Ok(())
    };
    let expect_agent_passthrough = |when: &str| -> anyhow::Result<()> {
        ensure!(
            field(&read("agent/state")?, "state") == Some("passthrough"),
            "the agent left passthrough {when}"
        );
        Ok(())
    };
    let mut log = String::new();
    // Malformed: rejected with the seq it carried, the guest untouched.
    let bad = post(&format!("seq={} op=explode", last_seq + 1), last_seq + 1)?;
    ensure!(
        field(&bad, "outcome") == Some("rejected"),
        "a malformed request was not rejected: {bad}"
    );
    let _ = writeln!(log, "crane: malformed request -> {bad}");
    expect_agent_passthrough("after a malformed request")?;
    // An app that does not answer in time: a second program under crane waits
    // inside clWaitForEvents for a user event another of its threads completes
    // only after minutes. prepare-migrate with a short deadline fails on it,
    // the agent rolls back (the first program parked and resumed) and the
    // guest stays in passthrough, both programs on the GPU.
    let busy = start_busy_app(s)?;
    let slow = post(
        &request_within(last_seq + 2, stop_and_copy(), BUSY_DEADLINE_MS),
        last_seq + 2,
    )?;
    let slow_resp = crane_xs::message::Response::parse(&slow)
        .with_context(|| format!("the agent's answer {slow:?}"))?;
    let why = slow_resp.error.clone().unwrap_or_default();
    ensure!(
        slow_resp.outcome == crane_xs::message::Outcome::Failed
            && slow_resp.rollback == Some(crane_xs::message::Rollback::Complete)
            && why.contains(&format!("pid {busy}"))
            && why.contains("stayed inside OpenCL calls past the deadline"),
        "an app that does not answer in time: {slow}"
    );
    let _ = writeln!(
        log,
        "crane: prepare-migrate, pid {busy} inside a long call -> {slow}"
    );
    expect_agent_passthrough("after an app did not answer in time")?;
    for p in [pid, busy] {
        expect_mode(
            p,
            Mode::Passthrough,
            "after the rolled-back prepare-migrate",
        )?;
    }
    // The waiting program exits: later requests drop it without waiting on it.
    s.domu(
        0,
        GUEST,
        &format!("kill {busy}; while kill -0 {busy} 2>/dev/null; do sleep 0.1; done"),
    )?;
    // A module that refuses to unload: the agent restarted with squashfs (in use:
    // PoCL's disk is mounted from it) after the GPU driver in its list. The driver
    // goes, squashfs refuses, the agent loads the driver again, resumes the program
    // and reports the failure; the guest carries on in passthrough.
    restart_agent(s, "[\"e1000\", \"squashfs\"]")?;
    let failed = park(last_seq + 3)?;
    ensure!(
        field(&failed, "outcome") == Some("failed")
            && field(&failed, "rollback") == Some("complete")
            && failed.contains("squashfs"),
        "a module that refuses to unload: {failed}"
    );
    let _ = writeln!(
        log,
        "crane: prepare-migrate, squashfs in the unload list -> {failed}"
    );
    expect_agent_passthrough("after a failed unload")?;
    wait_gpu_bound(s, 0)?;
    expect_mode(pid, Mode::Passthrough, "after a failed prepare-migrate")?;
    restart_agent(s, "[\"e1000\"]")?;
    let seq = last_seq + 4;
    let ready = park(seq)?;
    ensure!(
        field(&ready, "outcome") == Some("ready-for-detach"),
        "prepare-migrate by hand: {ready}"
    );
    let _ = writeln!(log, "crane: prepare-migrate -> {ready}");
    expect_mode(
        pid,
        Mode::Suspended,
        "after prepare-migrate (stop-and-copy)",
    )?;
    ensure!(
        !s.domu(0, GUEST, "cat /proc/modules")?.contains("e1000 "),
        "the agent left the GPU driver loaded"
    );
    s.dom0(0, &format!("xl pci-detach {GUEST} {GUEST_STANDIN_BDF}"))?;
    ensure!(
        !s.dom0(0, &format!("xl pci-list {GUEST}"))?
            .contains(GUEST_STANDIN_BDF),
        "xl pci-detach left the GPU attached"
    );
    s.dom0(0, &format!("xl pci-attach {GUEST} {GUEST_STANDIN_BDF}"))?;
    let resumed = post(&request(seq + 1, Op::RESUME), seq + 1)?;
    ensure!(
        field(&resumed, "outcome") == Some("resumed"),
        "prepare-resume by hand: {resumed}"
    );
    let _ = writeln!(
        log,
        "crane: GPU detached and attached with xl; prepare-resume -> {resumed}"
    );
    wait_gpu_bound(s, 0)?;
    expect_mode(pid, Mode::Passthrough, "after prepare-resume")?;
    // An old request written again (a replay, or a confused tool): out of
    // sequence, rejected, nothing done.
    let replayed = park(seq)?;
    ensure!(
        field(&replayed, "outcome") == Some("rejected") && replayed.contains("sequence"),
        "an out-of-sequence request: {replayed}"
    );
    let _ = writeln!(log, "crane: request {seq} written again -> {replayed}");
    expect_agent_passthrough("after an out-of-sequence request")?;
    expect_mode(pid, Mode::Passthrough, "after an out-of-sequence request")?;
    Ok(log)
}

/// The deadline of the prepare-migrate that a program inside a long call
/// cannot meet: long enough for the other program to park and come back.
const BUSY_DEADLINE_MS: u64 = 8_000;

/// Starts `badinput --wait-in-call` under crane in the guest: it waits inside
/// clWaitForEvents for ten minutes. Returns its pid once it is inside.
fn start_busy_app(s: &Session) -> anyhow::Result<u32> {
    s.domu(
        0,
        GUEST,
        &format!(
            "rm -f /tmp/busy.out && cd /tmp && \
             setsid {GUEST_TESTAPPS_DIR}/badinput --wait-in-call 600000 \
             < /dev/null > /tmp/busy.out 2>&1 & echo $! > /tmp/busy.pid"
        ),
    )?;
    let out = s.wait_domu(
        0,
        GUEST,
        "cat /tmp/busy.pid; cat /tmp/busy.out",
        Duration::from_secs(120),
        |o| o.lines().any(|l| l.trim() == "waiting"),
    )?;
    let pid: u32 = out
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("no pid for the waiting program: {out}"))?;
    // It printed "waiting" just before entering the call.
    std::thread::sleep(Duration::from_millis(500));
    Ok(pid)
}

/// `xl migrate` of the guest through the wrapper to host 0 itself, for the steps
/// where it must be refused; the command's output, whatever its status.
fn try_migrate_here(s: &Session, limit: Duration) -> anyhow::Result<CommandOutput> {
    s.try_dom0_timeout(
        0,
        &format!("{WRAPPER} migrate -s '' {GUEST} '{WRAPPER} migrate-receive'"),
        limit,
    )
}

/// After a refused migration: the guest still runs on host 0 as domain `domid`
/// with its GPU, its agent and the program `pid` are in passthrough.
fn nothing_changed(s: &Session, domid: u32, pid: u32) -> anyhow::Result<()> {
    ensure!(
        guest_domid(s, 0)? == Some(domid),
        "the guest moved although the migration was refused"
    );
    ensure!(
        s.dom0(0, &format!("xl pci-list {GUEST}"))?
            .contains(GUEST_STANDIN_BDF),
        "the guest lost its GPU although the migration was refused"
    );
    wait_agent(s, 0, "passthrough")?;
    let status = app_status(s, 0, pid)?.with_context(|| format!("pid {pid} is gone"))?;
    ensure!(
        status.mode == Mode::Passthrough,
        "pid {pid} is {:?} after a refused migration",
        status.mode
    );
    Ok(())
}

/// With the proxy domain paused, `xl migrate` through the wrapper must be refused
/// before anything changes: the guest keeps its domain and GPU, the program stays in
/// passthrough. Returns the wrapper's output.
pub fn proxy_down_refuses(s: &Session, pid: u32) -> anyhow::Result<String> {
    let domid = guest_domid(s, 0)?.context("the guest is not running")?;
    s.dom0(0, &format!("xl pause {PROXY}"))?;
    let out = try_migrate_here(s, Duration::from_secs(120));
    let unpaused = s.dom0(0, &format!("xl unpause {PROXY}"));
    let out = out?;
    unpaused?;
    let log = out.stderr_text();
    ensure!(
        !out.success(),
        "xl migrate went ahead with the proxy domain paused:\n{log}"
    );
    ensure!(
        log.contains("crane-proxy does not answer"),
        "the wrapper did not say that the proxy is down:\n{log}"
    );
    nothing_changed(s, domid, pid)?;
    Ok(log)
}

/// crane-agent stopped in the guest (SIGSTOP): `xl migrate` through the wrapper is
/// refused once the agent has not taken prepare-migrate within craned's
/// `agent_ack_ms`, instead of after the whole deadline; nothing moved, and the
/// request is superseded by prepare-resume, which the agent, continued, answers
/// `resumed` without ever running the withdrawn move. Returns the wrapper's log.
pub fn agent_stopped_refuses(s: &Session, pid: u32) -> anyhow::Result<String> {
    let domid = guest_domid(s, 0)?.context("the guest is not running")?;
    s.domu(0, GUEST, "kill -STOP $(pidof crane-agent)")?;
    let started = Instant::now();
    let out = try_migrate_here(s, Duration::from_millis(2 * AGENT_ACK_MS + 60_000));
    let refused_after = started.elapsed();
    let continued = s.domu(0, GUEST, "kill -CONT $(pidof crane-agent)");
    let out = out?;
    continued?;
    let log = out.stderr_text();
    ensure!(
        !out.success(),
        "xl migrate went ahead with the guest agent stopped:\n{log}"
    );
    ensure!(
        log.contains("did not take prepare-migrate") && log.contains("nothing was changed"),
        "the wrapper did not say that the agent did not take the request:\n{log}"
    );
    // The request now is prepare-resume; the continued agent answers it.
    let domid16 = u16::try_from(domid).context("the guest's domain id")?;
    let raw = s.dom0(0, &format!("xenstore-read {}", absolute(domid16, REQUEST)))?;
    let request = Request::parse(raw.trim())
        .map_err(|e| anyhow::anyhow!("the guest's request {raw:?}: {e}"))?;
    ensure!(
        request.op == Op::RESUME,
        "the withdrawn request was not superseded: {raw}"
    );
    let answer = s
        .wait_dom0(
            0,
            &format!("xenstore-read {}", absolute(domid16, AGENT_RESPONSE)),
            Duration::from_secs(120),
            |o| {
                Response::parse(o.trim())
                    .is_ok_and(|r| r.seq == request.seq && r.outcome == Outcome::Resumed)
            },
        )
        .context("the continued agent did not answer the prepare-resume in its place")?;
    nothing_changed(s, domid, pid)?;
    Ok(format!(
        "{log}crane: refused after {:.1} s; the continued agent answered {}\n",
        refused_after.as_secs_f64(),
        answer.trim()
    ))
}

/// Moves the guest (see [`Move`]) while the program holds, and checks what crane
/// did: each step was reported, the guest kept running (live) or came back (restore)
/// in a new domain, it has its GPU again with the driver bound, the agent is back in
/// `passthrough`, and so is the program.
pub fn move_guest(
    s: &Session,
    app: &App,
    how: Move,
    pid: u32,
    samples: &mut usize,
    scope: Scope,
) -> anyhow::Result<Migration> {
    let (from, to) = match how {
        Move::Live { from, to } | Move::Xenstore { from, to } => (from, to),
        Move::SaveRestore { host } => (host, host),
    };
    let uptime_before = guest_uptime(s, from)?;
    let domid_before = guest_domid(s, from)?.context("the guest is not running")?;
    let started = Instant::now();
    let mut pre_xs = None;
    let mut log = match how {
        Move::Live { from, to } if from == to => wrapper(
            s,
            from,
            &format!("migrate -s '' {GUEST} '{WRAPPER} migrate-receive'"),
        )?,
        Move::Live { from, to } => {
            let dest = listen_for_migration(s, to)?;
            let log = wrapper(s, from, &format!("migrate -s '' {GUEST} '{dest}'"))?;
            ensure!(
                guest_domid(s, from)?.is_none(),
                "the guest still runs on host {from} after migrating to host {to}"
            );
            // The receiving wrapper gives the guest its GPU after xl is done.
            let received = s.wait_dom0(
                to,
                "cat /var/log/xen/migrate-receive.log",
                Duration::from_secs(300),
                |o| o.contains("arrived and runs on GPU") || o.contains("failed"),
            )?;
            log + &received
        }
        Move::Xenstore { from, to } => {
            let (log, pre) = xenstore_move(s, app, from, to, pid, scope)?;
            pre_xs = pre;
            log
        }
        Move::SaveRestore { host } => {
            let saved = wrapper(s, host, &format!("save {GUEST} {SAVE_FILE}"))?;
            ensure!(
                guest_domid(s, host)?.is_none(),
                "the guest still runs after xl save"
            );
            let restored = wrapper(s, host, &format!("restore {SAVE_FILE}"))?;
            s.dom0(host, &format!("rm -f {SAVE_FILE}"))?;
            saved + &restored
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let domid_after = guest_domid(s, to)?
        .with_context(|| format!("the guest does not run on host {to} after the move"))?;
    ensure!(
        domid_after != domid_before || from != to,
        "a migration to the same host creates a new domain"
    );
    if !matches!(how, Move::Xenstore { .. }) {
        for want in ["prepare-migrate", "detached", "arrived and runs on GPU"] {
            ensure!(
                log.contains(want),
                "the wrappers did not report {want:?}:\n{log}"
            );
        }
    }
    let uptime_after = guest_uptime(s, to)?;
    ensure!(
        uptime_after > uptime_before,
        "the guest did not keep running: uptime {uptime_before} -> {uptime_after}"
    );
    ensure!(
        s.dom0(to, &format!("xl pci-list {GUEST}"))?
            .contains(GUEST_STANDIN_BDF),
        "the guest has no GPU on host {to} after the move"
    );
    wait_gpu_bound(s, to)?;
    wait_agent(s, to, "passthrough")?;
    // A program that does not hold may have ended meanwhile (its result is compared
    // at the end); one that holds must be back in passthrough.
    match app_status(s, to, pid)? {
        Some(status) => ensure!(
            status.mode == Mode::Passthrough,
            "pid {pid} is {:?} after the move",
            status.mode
        ),
        None => ensure!(!app.holds(), "pid {pid} is gone after the move"),
    }
    let (modes_seen, total) = modes_since(s, to, pid, *samples)?;
    *samples = total;
    // The stoppage both ways as the wrapper reported it; where no wrapper received
    // the guest, the way back from craned's own account (`crane status`).
    let post_stop_ms = match number_after(&log, "post-migration stoppage ") {
        Some(ms) => Some(ms),
        None => {
            let status = s.dom0(to, "/usr/sbin/crane status")?;
            let receives: Vec<&str> = status
                .lines()
                .filter(|l| l.contains("received after waiting") || l.contains("receive: "))
                .collect();
            number_after(&receives.join("\n"), "longest stop ")
        }
    };
    let pre_stop_ms = number_after(&log, "pre-migration stoppage ").or(pre_xs);
    let _ = writeln!(log, "(agent state passthrough, pid {pid} passthrough)");
    Ok(Migration {
        how,
        domid_before,
        domid_after,
        uptime_before,
        uptime_after,
        seconds,
        log,
        modes_seen,
        pre_stop_ms,
        post_stop_ms,
    })
}

/// Checks that a native run succeeded with a result.
fn check_native(native: &AppRun, place: &str) -> anyhow::Result<()> {
    ensure!(
        native.status == 0 && !native.result.is_empty(),
        "the native run in {place} failed (status {}): {}",
        native.status,
        native.stderr
    );
    Ok(())
}

/// Waits until the program under crane has ended and returns its run.
pub fn wait_finished(
    s: &Session,
    host: usize,
    app: &App,
    started: Instant,
) -> anyhow::Result<AppRun> {
    let status = wait_in(
        s,
        host,
        GUEST,
        &format!("[ -s {APP_DIR}/status ]"),
        Duration::from_secs(600),
        &format!("cat {APP_DIR}/status 2>/dev/null || true"),
    )?;
    ensure!(
        !status.trim().is_empty(),
        "the program under crane did not end within 600 s of its release"
    );
    let seconds = started.elapsed().as_secs_f64();
    let stdout = s.domu(host, GUEST, &format!("cat {APP_DIR}/out"))?;
    let stderr = s.domu(host, GUEST, &format!("cat {APP_DIR}/err"))?;
    Ok(AppRun::new(
        app,
        stdout,
        stderr,
        status.trim().parse().context("parsing the exit status")?,
        seconds,
    ))
}

/// Releases the program from its hold (a program that does not hold ignores it),
/// waits until it has ended, and checks that it exited with status 0.
fn release(s: &Session, host: usize, app: &App, started: Instant) -> anyhow::Result<AppRun> {
    s.domu(host, GUEST, &format!("touch {APP_DIR}/release"))?;
    let crane = wait_finished(s, host, app, started)?;
    ensure!(
        crane.status == 0,
        "the program under crane failed (status {}): {}",
        crane.status,
        crane.stderr
    );
    Ok(crane)
}

/// The whole scenario on the session's hosts (1 or 2): see the module's description.
/// On failure, the logs of craned, the wrappers, crane-agent, the program and
/// crane-proxy are printed to stderr (best effort) before the error is returned.
/// What `cargo xtask testbed up` sets up on host 0 for an operator to try by hand:
/// craned, the proxy domain with crane-proxy, the GPU guest with its GPU and agent,
/// and `app` under crane in it. Returns the program's pid in the guest.
pub fn bring_up(s: &mut Session, app: &App) -> anyhow::Result<u32> {
    start_craned(s)?;
    check_proxy(s)?;
    s.phase("craned; the proxy domain created by craned, crane-proxy with the guest's token");
    if guest_domid(s, 0)?.is_none() {
        create_domain(s, 0, &guest_config())?;
    }
    wait_booted(s, 0, GUEST)?;
    attach_first_gpu(s, 0)?;
    wait_agent(s, 0, "passthrough")?;
    s.phase("the GPU guest boots, gets the GPU; crane-agent answers craned");
    let pid = start_under_crane(s, 0, app)?;
    if app.holds() {
        wait_holding(s, 0, pid)?;
    } else {
        wait_running(s, 0, pid)?;
    }
    s.phase(&format!("{} under crane in the guest", app.program));
    Ok(pid)
}

/// The commands an operator can type once [`bring_up`] is done. Each command line
/// for dom0 or the guest is one double-quoted argument of `testbed run`. xl is
/// named by the wrapper's path: dom0's PATH finds Debian's own xl first.
pub fn operator_commands(pid: u32, app: &App) -> String {
    let request = crane_xs::admin::AdminRequest {
        id: 1,
        op: crane_xs::admin::AdminOp::Migrate {
            dest: format!("{WRAPPER} migrate-receive"),
            mode: crane_xs::admin::MoveMode::Remote,
            ssh_command: Some(String::new()),
        },
    }
    .format();
    let dom0 = |cmd: &str| format!("cargo xtask testbed run -- \"{cmd}\"");
    let guest = |cmd: &str| format!("cargo xtask testbed run --domain {GUEST} -- \"{cmd}\"");
    let mut steps: Vec<(String, Vec<String>)> = vec![
        (
            "craned's view: guests, GPUs, the proxy, each move's stoppage".into(),
            vec![dom0("crane status")],
        ),
        (
            format!("the program (pid {pid}) and its mode under crane, in the guest"),
            vec![guest("cranectl list")],
        ),
        (
            "live migration to the same host through the xl wrapper: the program runs on \
             crane-proxy meanwhile and comes back"
                .into(),
            vec![dom0(&format!(
                "{WRAPPER} migrate -s '' {GUEST} '{WRAPPER} migrate-receive'"
            ))],
        ),
        (
            "the same requested through XenStore (craned runs xl), then its result".into(),
            vec![
                dom0(&format!(
                    "xenstore-write {} '{request}'",
                    crane_xs::admin::request_key(GUEST)
                )),
                dom0(&format!(
                    "xenstore-read {}",
                    crane_xs::admin::result_key(GUEST)
                )),
            ],
        ),
        (
            "stop-and-copy: the program parked in RAM while the guest is saved and restored".into(),
            vec![dom0(&format!(
                "{WRAPPER} save {GUEST} {SAVE_FILE} && {WRAPPER} restore {SAVE_FILE}"
            ))],
        ),
        (
            "the program onto the guest's CPU device and back, by hand".into(),
            vec![
                guest(&format!("cranectl local {pid} --device cpu")),
                guest(&format!("cranectl local {pid} --device home")),
            ],
        ),
    ];
    if app.holds() {
        steps.push((
            "let the program finish (it holds halfway) and show its result".into(),
            vec![guest(&format!(
                "touch {APP_DIR}/release; while [ ! -e {APP_DIR}/status ]; do sleep 1; done; \
                 cat {APP_DIR}/out"
            ))],
        ));
    }
    steps.push((
        "the domUs' consoles, and stopping everything".into(),
        vec![
            "cargo xtask testbed logs".into(),
            "cargo xtask testbed down".into(),
        ],
    ));
    let mut out = String::new();
    for (what, cmds) in steps {
        let _ = writeln!(out, "  # {what}");
        for c in cmds {
            let _ = writeln!(out, "  {c}");
        }
    }
    out
}

#[cfg(test)]
mod operator_tests {
    use super::*;

    /// The soak's resource script, run here on this test's own process (the
    /// domUs' busybox runs the same: /proc's VmRSS line has a tab).
    #[test]
    fn resource_counts_of_a_real_process() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(counts_script(&std::process::id().to_string()))
            .output()
            .unwrap();
        let [fds, threads, rss] =
            parse_counts(&String::from_utf8_lossy(&out.stdout), "this test").unwrap();
        assert!(fds >= 3 && threads >= 1 && rss > 0, "{fds} {threads} {rss}");
        assert!(parse_counts("8 5\n", "short").is_err());
    }

    /// The printed commands are what the e2e tier runs: the same wrapper, request
    /// and paths; each dom0 or guest command line is one quoted argument.
    #[test]
    fn operator_commands_name_the_real_paths() {
        let text = operator_commands(321, &App::default());
        assert!(text.contains(&format!(
            "testbed run -- \"{WRAPPER} migrate -s '' {GUEST} '{WRAPPER} migrate-receive'\""
        )));
        assert!(text.contains("cranectl local 321 --device cpu"));
        assert!(text.contains(&format!("{APP_DIR}/release")));
        let request_line = text.lines().find(|l| l.contains("xenstore-write")).unwrap();
        let quoted = request_line.split('\'').nth(1).unwrap();
        let parsed = crane_xs::admin::AdminRequest::parse(quoted).unwrap();
        assert_eq!(parsed.id, 1);
        for line in text.lines().filter(|l| l.contains("testbed run")) {
            assert_eq!(line.matches('"').count(), 2, "{line}");
        }
    }
}

/// How much of the scenario runs. CI's two cores fit the core (`cargo xtask
/// test`, the demo); [`FULL_ENV`]`=1` adds what takes the most emulated time:
/// the agent driven by hand (a malformed request, two rollbacks, a park and a
/// resume; about 3.5 minutes under emulation), the agent stopped during a
/// migration, and a cross-host XenStore move first refused by a destination
/// without a free GPU and then accepted with the program on the guest's CPU
/// across a craned restart (about 3.5 minutes more than a plain move).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Core,
    Full,
}

/// `CRANE_E2E_FULL=1`: the whole scenario ([`Scope::Full`]).
pub const FULL_ENV: &str = "CRANE_E2E_FULL";

impl Scope {
    /// [`Scope::Full`] when [`FULL_ENV`] is `1`, else [`Scope::Core`].
    pub fn from_env() -> Self {
        match std::env::var(FULL_ENV).as_deref() {
            Ok("1") => Scope::Full,
            _ => Scope::Core,
        }
    }
}

pub fn run(s: &mut Session, app: &App, scope: Scope) -> anyhow::Result<Report> {
    let result = run_inner(s, app, scope);
    if result.is_err() {
        eprintln!("{}", diagnose(s));
    }
    result
}

/// What the hosts and domains logged, for the post-mortem of a failed run.
pub fn diagnose(s: &Session) -> String {
    let mut out = String::from("==== crane scenario failed; logs follow ====\n");
    let mut show = |what: &str, text: anyhow::Result<String>| {
        let text = text.unwrap_or_else(|e| format!("(not available: {e:#})"));
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        let _ = writeln!(
            out,
            "---- {what} (last {} lines)\n{}",
            tail.len(),
            tail.join("\n")
        );
    };
    for host in 0..s.hosts.len() {
        show(
            &format!("host {host}: xl list, craned.log, migrate-receive.log"),
            s.dom0(
                host,
                "xl list; cat /var/log/craned.log; cat /var/log/xen/migrate-receive.log 2>/dev/null; true",
            ),
        );
        let on_host = s
            .dom0(host, "xl list")
            .map(|l| find_domain(&parse_xl_list(&l), GUEST).is_some())
            .unwrap_or(false);
        if on_host {
            show(
                &format!("host {host}: guest crane-agent.log, program err, cranectl list"),
                s.domu(
                    host,
                    GUEST,
                    &format!(
                        "cat /var/log/crane-agent.log; cat {APP_DIR}/err; cranectl --json list; true"
                    ),
                ),
            );
        }
    }
    show(
        "proxy domain: crane-proxy.log",
        s.domu(0, PROXY, "cat /var/log/crane-proxy.log; true"),
    );
    out
}

fn run_inner(s: &mut Session, app: &App, scope: Scope) -> anyhow::Result<Report> {
    // With two hosts the native run goes to the guest's twin on host 1, which
    // has nothing else to do until the move there, while host 0 goes on with
    // crane (each emulated host has a CPU of its own).
    let twin = s.hosts.len() == 2;
    if twin {
        create_domain(s, 1, &twin_config())?;
    }
    start_craned(s)?;
    let mut proxy = check_proxy(s)?;
    s.phase("craned on every host; the proxy domain created by craned, crane-proxy with the guest's token, its own GPU bound");

    if guest_domid(s, 0)?.is_none() {
        create_domain(s, 0, &guest_config())?;
    }
    wait_booted(s, 0, GUEST)?;
    ensure!(
        standin_slot(&s.domu(0, GUEST, "lspci -n")?).is_none(),
        "the guest sees a GPU before one is attached"
    );
    let gpu_slot = attach_first_gpu(s, 0)?;
    wait_agent(s, 0, "passthrough")?;
    // The guest cannot post itself a request: xenstored refuses its write to dom0's
    // node, and the agent carries on untouched.
    let state_before = wait_agent(s, 0, "passthrough")?;
    let denied = s.domu(
        0,
        GUEST,
        "xenstore-write crane/request 'seq=999 op=prepare-resume' 2>&1; echo status=$?",
    )?;
    ensure!(
        !denied.contains("status=0"),
        "the guest could write its own crane/request: {denied}"
    );
    ensure!(
        wait_agent(s, 0, "passthrough")? == state_before,
        "the agent's state changed after the guest's own write"
    );
    s.phase("the GPU guest (HVM) boots, gets host 0's GPU; crane-agent answers craned");

    let native_here = if twin {
        wait_booted(s, 1, TWIN)?;
        start_native(s, 1, TWIN, app)?;
        None
    } else {
        let native = run_native(s, 0, app)?;
        check_native(&native, "the guest")?;
        s.phase(&format!("native run of {} in the guest", app.program));
        Some(native)
    };

    let crane_started = Instant::now();
    let pid = start_under_crane(s, 0, app)?;
    let checks = if app.holds() {
        wait_holding(s, 0, pid)?;
        start_monitor(s, 0)?;
        s.phase("the same program under crane, holding halfway");
        let by_hand = if scope == Scope::Full {
            let by_hand = agent_by_hand(s, pid).context("driving the agent by hand")?;
            eprint!("{by_hand}");
            s.phase("the agent driven by hand with xenstore-write and xl: malformed rejected, a program inside a long call and a module that will not unload rolled back, parked, resumed, a replayed request rejected");
            Some(by_hand)
        } else {
            None
        };
        let refused = proxy_down_refuses(s, pid).context("migrating with the proxy down")?;
        eprint!("{refused}");
        s.phase("proxy domain paused: xl migrate refused before anything changed");
        if scope == Scope::Full {
            let stopped =
                agent_stopped_refuses(s, pid).context("migrating with the agent stopped")?;
            eprint!("{stopped}");
            s.phase("crane-agent stopped: xl migrate refused once it did not take the request, which prepare-resume superseded");
        }
        Some((by_hand, refused))
    } else {
        wait_running(s, 0, pid)?;
        s.phase("the same program under crane, running");
        None
    };
    let native = match native_here {
        Some(native) => native,
        None => {
            let native = finish_native(s, 1, TWIN, app)?;
            check_native(&native, &format!("{TWIN} on host 1"))?;
            s.dom0(1, &format!("xl destroy {TWIN}"))?;
            s.phase(&format!(
                "native run of {} in the guest's twin on host 1 (meanwhile: {:.1}s), collected",
                app.program, native.seconds
            ));
            native
        }
    };

    // Through the wrapper to the same host; through the XenStore trigger to the other
    // host (or, with one host, to the same one again); stop-and-copy on the last.
    let other = if s.hosts.len() == 2 { 1 } else { 0 };
    let moves = [
        Move::Live { from: 0, to: 0 },
        Move::Xenstore { from: 0, to: other },
        Move::SaveRestore { host: other },
    ];
    let mut samples = 0;
    let mut migrations = Vec::new();
    let mut here = 0;
    // With two hosts, the last move (stop-and-copy on host 1) and the program's end
    // need nothing of host 0 (each emulated host has a CPU of its own): host 0
    // meanwhile checks that craned creates a destroyed proxy domain again.
    let overlap = other != 0 && app.holds();
    let (sequential, last) = if overlap {
        (&moves[..moves.len() - 1], moves.last().copied())
    } else {
        (&moves[..], None)
    };
    let mut proxy_death = None;
    // The soak's check in short (issue 17; the soak itself is `cargo xtask
    // testbed soak`): the program's, crane-agent's and crane-proxy's
    // descriptors and threads after each live migration, the first against
    // the last (the proxy domain recreated between them: a fresh
    // crane-proxy must not hold more than the one that served the program).
    let mut after_live: Vec<Resources> = Vec::new();
    for &how in sequential {
        if !app.holds() && app_ended(s, here)? {
            eprintln!("the program has ended; no more moves");
            break;
        }
        let m = move_guest(s, app, how, pid, &mut samples, scope)
            .with_context(|| format!("moving the guest: {how:?}"))?;
        eprint!("{}", m.log);
        eprintln!("modes seen: {:?}", m.modes_seen);
        s.phase(&how.describe_in(scope));
        here = how.destination();
        migrations.push(m);
        if app.holds() && matches!(how, Move::Live { .. } | Move::Xenstore { .. }) {
            after_live.push(resources(s, here, pid)?);
        }
        // After the first move (the proxy has the program's kernels): the proxy
        // domain destroyed under the program.
        if app.holds() && proxy_death.is_none() && here == 0 {
            let death = proxy_death_under_program(s, pid)
                .context("the proxy domain destroyed under the program")?;
            eprint!("{death}");
            s.phase("the program moved to crane-proxy, the proxy domain destroyed under it: craned recreated it and told the guest, the program replayed its session there, then home");
            proxy_death = Some(death);
            if scope == Scope::Full {
                let (m, log) = proxy_death_during_migration(s, pid, &mut samples)
                    .context("the proxy domain destroyed during a migration")?;
                eprint!("{}{log}", m.log);
                s.phase("xl migrate host 0 -> host 0, the proxy domain destroyed during the transfer: craned recreated it, the migration completed, the program home");
                migrations.push(m);
            }
        }
    }
    ensure!(
        !migrations.is_empty(),
        "the program ended before the first move: give it more work"
    );
    if let [first, .., last] = after_live.as_slice() {
        let same_everywhere =
            |what: &str| !what.starts_with("craned") && !what.starts_with("XenStore");
        eprintln!(
            "after the first and the last live migration (fds/threads): program {}/{} -> {}/{}, \
             crane-agent {}/{} -> {}/{}, crane-proxy {}/{} -> {}/{}",
            first.app[0],
            first.app[1],
            last.app[0],
            last.app[1],
            first.agent[0],
            first.agent[1],
            last.agent[0],
            last.agent[1],
            first.proxy[0],
            first.proxy[1],
            last.proxy[0],
            last.proxy[1],
        );
        let grew = grown(first, last, same_everywhere);
        ensure!(
            grew.is_empty(),
            "resources grew from the first live migration to the last: {grew:?}"
        );
    }
    let (crane, recreated) = match last {
        Some(how) => {
            proxy.log = s.domu(0, PROXY, "cat /var/log/crane-proxy.log")?;
            let shared: &Session = s;
            let samples = &mut samples;
            let (m, crane, recreated) = std::thread::scope(|threads| -> anyhow::Result<_> {
                let proxy_side = threads.spawn(|| {
                    let started = Instant::now();
                    let recreated = proxy_recreated(shared);
                    eprintln!(
                        "host 0, meanwhile: the proxy domain destroyed and created again ({:.1}s)",
                        started.elapsed().as_secs_f64()
                    );
                    recreated
                });
                let started = Instant::now();
                let m = move_guest(shared, app, how, pid, samples, scope)
                    .with_context(|| format!("moving the guest: {how:?}"))?;
                eprint!("{}", m.log);
                eprintln!("modes seen: {:?}", m.modes_seen);
                eprintln!(
                    "{}: {:.1}s",
                    how.describe(),
                    started.elapsed().as_secs_f64()
                );
                let crane = release(shared, how.destination(), app, crane_started)?;
                let recreated = proxy_side
                    .join()
                    .map_err(|_| anyhow::anyhow!("the proxy domain's check panicked"))?
                    .context("the proxy domain destroyed")?;
                Ok((m, crane, recreated))
            })?;
            migrations.push(m);
            eprint!("{recreated}");
            s.phase(&format!(
                "{}; the program under crane released and finished; meanwhile on host 0 \
                 the proxy domain destroyed: craned recreated it, its GPU bound, crane-proxy \
                 answering",
                how.describe()
            ));
            (crane, recreated)
        }
        None => {
            let crane = release(s, here, app, crane_started)?;
            s.phase("the program under crane released and finished");
            proxy.log = s.domu(0, PROXY, "cat /var/log/crane-proxy.log")?;
            // Destroyed once already with the program on it.
            let recreated = match &proxy_death {
                Some(death) => death.clone(),
                None => {
                    let recreated = proxy_recreated(s).context("the proxy domain destroyed")?;
                    eprint!("{recreated}");
                    s.phase(
                        "the proxy domain destroyed: craned recreated it, its GPU bound, crane-proxy answering",
                    );
                    recreated
                }
            };
            (crane, recreated)
        }
    };
    ensure!(
        crane.result == native.result,
        "results differ: native {:?}, under crane {:?}",
        native.result,
        crane.result
    );
    Ok(Report {
        proxy,
        gpu_slot,
        native,
        crane,
        pid,
        migrations,
        by_hand: checks.as_ref().and_then(|c| c.0.clone()),
        refused: checks.map(|c| c.1),
        recreated,
        proxy_death,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_runs_keep_the_last_result_line() {
        let run = AppRun::new(
            &App::default(),
            "pingpong: iteration 10000\nRESULT pingpong 744033231e3a5475\n".into(),
            String::new(),
            0,
            1.0,
        );
        assert_eq!(run.result, "RESULT pingpong 744033231e3a5475");
        assert_eq!(
            AppRun::new(&App::default(), "nothing\n".into(), String::new(), 1, 1.0).result,
            ""
        );
    }

    #[test]
    fn command_lines_are_quoted() {
        let app = App {
            program: "pingpong".into(),
            args: vec!["--iters".into(), "a b".into()],
            host_path: None,
        };
        assert_eq!(
            app.command_line(),
            "'/usr/lib/crane/testapps/pingpong' '--iters' 'a b'"
        );
        assert!(app.holds() && app.guest_files().is_empty());
        // A program of this machine lands in the guest image and is compared whole.
        let me = std::env::current_exe().unwrap();
        let mut app = App::from_host(&me, vec!["x".into()]).unwrap();
        app.program = "prog".into();
        assert!(!app.holds());
        assert_eq!(app.command_line(), "'/opt/crane-app/prog' 'x'");
        assert_eq!(app.guest_files(), [(me, "/opt/crane-app/prog".to_string())]);
        assert_eq!(app.outcome("a\nRESULT b\n\n"), "a\nRESULT b");
        assert!(App::from_host(std::path::Path::new("/nonexistent"), vec![]).is_err());
    }

    #[test]
    fn craned_runs_the_proxy_on_host_0_only() {
        let c0: toml::Value = toml::from_str(&craned_config(0)).unwrap();
        let c1: toml::Value = toml::from_str(&craned_config(1)).unwrap();
        assert_eq!(c0["proxy"]["domain"].as_str(), Some(PROXY));
        assert_eq!(c0["proxy"]["gpu"].as_str(), Some(PROXY_STANDIN_BDF));
        assert!(c1["proxy"].get("domain").is_none());
        for c in [&c0, &c1] {
            assert_eq!(c["guests"][0].as_str(), Some(GUEST));
            assert_eq!(c["gpus"]["pool"][0].as_str(), Some(GUEST_STANDIN_BDF));
            assert_eq!(c["proxy"]["address"].as_str(), Some("tcp://10.77.0.2:7000"));
        }
    }

    fn soak_with(rounds: &[[u64; 2]]) -> Soak {
        let r = |fd: u64, nodes: u64| Resources {
            proxy: [fd, 5, 1000],
            craned: [21, 2, 1000],
            app: [4, 3, 1000],
            agent: [7, 2, 100],
            xenstore_nodes: nodes,
        };
        let mut resources = vec![r(8, 494)];
        let mut migrations = Vec::new();
        for &[fd, nodes] in rounds {
            resources.push(r(fd, nodes));
            migrations.push(Migration {
                how: Move::SaveRestore { host: 0 },
                domid_before: 1,
                domid_after: 2,
                uptime_before: 0.0,
                uptime_after: 0.0,
                seconds: 1.0,
                log: String::new(),
                modes_seen: Vec::new(),
                pre_stop_ms: None,
                post_stop_ms: None,
            });
        }
        Soak {
            native: String::new(),
            result: String::new(),
            resources,
            migrations,
        }
    }

    /// The last round is held against the first, move by move: counts that
    /// alternate with the kind of move are no leak, one descriptor more per
    /// move is, and a single round says nothing.
    #[test]
    fn the_soak_finds_growth_between_its_first_and_last_rounds() {
        let flat = soak_with(&[[8, 485], [9, 493], [8, 485], [9, 493], [8, 485], [10, 493]]);
        assert!(flat.leaks(2).is_empty(), "{:?}", flat.leaks(2));
        let leaking = soak_with(&[
            [8, 485],
            [9, 493],
            [10, 485],
            [11, 493],
            [12, 485],
            [13, 493],
        ]);
        assert_eq!(
            leaking.leaks(2),
            vec![
                "crane-proxy descriptors: 8 after move 1, 12 after move 5".to_string(),
                "crane-proxy descriptors: 9 after move 2, 13 after move 6".to_string(),
            ]
        );
        let nodes = soak_with(&[[8, 485], [8, 493], [8, 489], [8, 497]]);
        assert_eq!(
            nodes.leaks(2),
            vec![
                "XenStore nodes: 485 after move 1, 489 after move 3".to_string(),
                "XenStore nodes: 493 after move 2, 497 after move 4".to_string(),
            ]
        );
        assert!(soak_with(&[[8, 485], [30, 493]]).leaks(2).is_empty());
    }

    #[test]
    fn growth_is_judged_only_on_the_counters_asked_for() {
        let then = Resources {
            proxy: [10, 5, 9000],
            craned: [12, 3, 4000],
            app: [20, 6, 70000],
            agent: [8, 2, 3000],
            xenstore_nodes: 400,
        };
        let mut now = then.clone();
        now.craned[0] = 30;
        now.xenstore_nodes = 300;
        now.app[1] = 6 + SOAK_SLACK;
        now.app[2] = 99_000;
        let others = |w: &str| !w.starts_with("craned") && !w.starts_with("XenStore");
        assert!(grown(&then, &now, others).is_empty());
        assert_eq!(
            grown(&then, &now, |_| true),
            vec![("craned descriptors", 12, 30)]
        );
        now.agent[0] = 8 + SOAK_SLACK + 1;
        assert_eq!(
            grown(&then, &now, others),
            vec![("crane-agent descriptors", 8, 11)]
        );
    }
}

/// What the soak follows from move to move (issue 17): file descriptors, threads
/// and memory of the long-lived processes, and XenStore's size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// crane-proxy in the proxy domain: descriptors, threads, resident KiB.
    pub proxy: [u64; 3],
    /// craned in dom0 of the host the guest is on.
    pub craned: [u64; 3],
    /// The program under crane in the guest.
    pub app: [u64; 3],
    /// crane-agent in the guest.
    pub agent: [u64; 3],
    /// Nodes in that host's XenStore.
    pub xenstore_nodes: u64,
}

/// `fds threads rss_kib` of the process the shell expression `pid` names.
fn counts_script(pid: &str) -> String {
    format!(
        "p={pid}; [ -n \"$p\" ] && echo $(ls /proc/$p/fd | wc -l) $(ls /proc/$p/task | wc -l) \
         $(awk '/^VmRSS:/ {{print $2}}' /proc/$p/status)"
    )
}

fn parse_counts(out: &str, what: &str) -> anyhow::Result<[u64; 3]> {
    let n: Vec<u64> = out
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{what}: {out:?}"))?;
    ensure!(n.len() == 3, "{what}: want 3 numbers, got {out:?}");
    Ok([n[0], n[1], n[2]])
}

/// The resources now, the guest being on `host` and the program `pid`.
pub fn resources(s: &Session, host: usize, pid: u32) -> anyhow::Result<Resources> {
    let proxy = parse_counts(
        &s.domu(0, PROXY, &counts_script("$(pidof crane-proxy)"))?,
        "crane-proxy",
    )?;
    let craned = parse_counts(&s.dom0(host, &counts_script("$(pidof craned)"))?, "craned")?;
    let app = parse_counts(
        &s.domu(host, GUEST, &counts_script(&pid.to_string()))?,
        "the program",
    )?;
    let agent = parse_counts(
        &s.domu(host, GUEST, &counts_script("$(pidof crane-agent)"))?,
        "crane-agent",
    )?;
    let xenstore_nodes = s
        .dom0(host, "xenstore-ls -f / | wc -l")?
        .trim()
        .parse()
        .context("counting XenStore nodes")?;
    Ok(Resources {
        proxy,
        craned,
        app,
        agent,
        xenstore_nodes,
    })
}

/// The soak's account.
#[derive(Debug)]
pub struct Soak {
    pub native: String,
    pub result: String,
    /// Before the first move, then after each.
    pub resources: Vec<Resources>,
    pub migrations: Vec<Migration>,
}

impl Soak {
    const HEADER: &'static str = "  #  move                                               s   pre ms  post ms   proxy fd/thr/KiB   craned fd/thr/KiB   app fd/thr/KiB   agent fd/thr  xs nodes";

    /// One line per move: how, seconds, stoppage both ways, the resources after.
    pub fn table(&self) -> String {
        let mut out = format!("{}\n", Self::HEADER);
        for i in 0..self.resources.len() {
            let _ = writeln!(out, "{}", self.line(i));
        }
        out
    }

    /// The table's line `i`: 0 for the resources before the first move, `i`
    /// for move `i` and the resources after it.
    pub fn line(&self, i: usize) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let m = i.checked_sub(1).and_then(|k| self.migrations.get(k));
        let r = &self.resources[i];
        let how = m.map_or("(before)".into(), |m| m.how.describe());
        format!(
            "{i:>3}  {how:<48} {:>5} {:>8} {:>8}   {:>4}/{:>3}/{:>7}   {:>4}/{:>3}/{:>7}   {:>4}/{:>3}/{:>6}   {:>4}/{:>3}  {:>8}",
            m.map_or("-".into(), |m| format!("{:.0}", m.seconds)),
            ms(m.and_then(|m| m.pre_stop_ms)),
            ms(m.and_then(|m| m.post_stop_ms)),
            r.proxy[0],
            r.proxy[1],
            r.proxy[2],
            r.craned[0],
            r.craned[1],
            r.craned[2],
            r.app[0],
            r.app[1],
            r.app[2],
            r.agent[0],
            r.agent[1],
            r.xenstore_nodes
        )
    }

    /// Growth from the first round of moves to the last (`period` moves a
    /// round, [`soak_moves`]): each counter of the last round against the
    /// most it reached in the first, at the same place in the round (the
    /// same kind of move onto the same host). Descriptors, threads and
    /// XenStore nodes that grow by more than [`SOAK_SLACK`] are a leak;
    /// resident memory is reported, not judged (glibc's arenas grow and
    /// shrink with the threads a move starts). Empty when fewer than two
    /// rounds ran.
    pub fn leaks(&self, period: usize) -> Vec<String> {
        let n = self.migrations.len();
        if period == 0 || n < 2 * period {
            return Vec::new();
        }
        let mut out = Vec::new();
        // resources[k] is after move k; the first round is moves 1..=period.
        for k in n - period + 1..=n {
            let first = (k - 1) % period + 1;
            out.extend(
                grown(&self.resources[first], &self.resources[k], |_| true)
                    .into_iter()
                    .map(|(what, then, now)| {
                        format!("{what}: {then} after move {first}, {now} after move {k}")
                    }),
            );
        }
        out
    }
}

/// The counters of `now` that exceed `then`'s by more than [`SOAK_SLACK`],
/// among those `which` keeps (by name): `(name, then, now)`. Descriptors,
/// threads and XenStore nodes; resident memory is not judged (glibc's
/// arenas grow and shrink with the threads a move starts).
pub fn grown(
    then: &Resources,
    now: &Resources,
    which: impl Fn(&str) -> bool,
) -> Vec<(&'static str, u64, u64)> {
    let counts = |r: &Resources| -> Vec<(&'static str, u64)> {
        vec![
            ("crane-proxy descriptors", r.proxy[0]),
            ("crane-proxy threads", r.proxy[1]),
            ("craned descriptors", r.craned[0]),
            ("craned threads", r.craned[1]),
            ("program descriptors", r.app[0]),
            ("program threads", r.app[1]),
            ("crane-agent descriptors", r.agent[0]),
            ("crane-agent threads", r.agent[1]),
            ("XenStore nodes", r.xenstore_nodes),
        ]
    };
    counts(then)
        .into_iter()
        .zip(counts(now))
        .filter(|((what, then), (_, now))| which(what) && *now > *then + SOAK_SLACK)
        .map(|((what, then), (_, now))| (what, then, now))
        .collect()
}

/// How much a descriptor, thread or XenStore node count may differ between
/// the soak's first and last rounds without counting as a leak (a helper
/// thread or a connection caught in passing).
pub const SOAK_SLACK: u64 = 2;

/// The moves of the soak, in turn: on one host a same-host live migration and
/// stop-and-copy; on two, also to the other host and back.
pub fn soak_moves(hosts: usize) -> Vec<Move> {
    if hosts == 2 {
        vec![
            Move::Live { from: 0, to: 0 },
            Move::SaveRestore { host: 0 },
            Move::Live { from: 0, to: 1 },
            Move::SaveRestore { host: 1 },
            Move::Live { from: 1, to: 1 },
            Move::Live { from: 1, to: 0 },
        ]
    } else {
        vec![Move::Live { from: 0, to: 0 }, Move::SaveRestore { host: 0 }]
    }
}

/// The soak (`cargo xtask testbed soak`): `app` under crane in the guest while the
/// guest makes `count` moves in a row (see [`soak_moves`]), the resources of every
/// long-lived participant read before and after each; then the program is
/// released and its result must equal a native run's.
pub fn soak(s: &mut Session, app: &App, count: usize) -> anyhow::Result<Soak> {
    start_craned(s)?;
    check_proxy(s)?;
    if guest_domid(s, 0)?.is_none() {
        create_domain(s, 0, &guest_config())?;
    }
    wait_booted(s, 0, GUEST)?;
    attach_first_gpu(s, 0)?;
    wait_agent(s, 0, "passthrough")?;
    let native = run_native(s, 0, app)?;
    check_native(&native, "the guest")?;
    s.phase("set up: craned, the proxy domain, the GPU guest; the native run");
    let started = Instant::now();
    let pid = start_under_crane(s, 0, app)?;
    if app.holds() {
        wait_holding(s, 0, pid)?;
        start_monitor(s, 0)?;
    } else {
        wait_running(s, 0, pid)?;
    }
    let mut soak = Soak {
        native: native.result.clone(),
        result: String::new(),
        resources: vec![resources(s, 0, pid)?],
        migrations: Vec::new(),
    };
    s.phase(&format!("{} under crane", app.program));
    // The table as it grows: a run cut short still shows its moves.
    println!("soak:\n{}\n{}", Soak::HEADER, soak.line(0));
    let moves = soak_moves(s.hosts.len());
    let mut samples = 0;
    for i in 0..count {
        let how = moves[i % moves.len()];
        let m = move_guest(s, app, how, pid, &mut samples, Scope::Core)
            .with_context(|| format!("move {} of {count}: {}", i + 1, how.describe()))?;
        soak.resources.push(resources(s, how.destination(), pid)?);
        s.phase(&format!("move {} of {count}: {}", i + 1, how.describe()));
        soak.migrations.push(m);
        println!("{}", soak.line(i + 1));
    }
    let host = soak.migrations.last().map_or(0, |m| m.how.destination());
    let crane = release(s, host, app, started)?;
    ensure!(
        crane.result == native.result,
        "the program's result under crane differs from the native run's:\n  native: {}\n  crane:  {}",
        native.result,
        crane.result
    );
    soak.result = crane.result;
    let leaks = soak.leaks(moves.len());
    ensure!(
        leaks.is_empty(),
        "resources grew from the first round of moves to the last:\n  {}",
        leaks.join("\n  ")
    );
    Ok(soak)
}
