//! crane on the emulated Xen hosts, the suspend path (stop-and-copy of GPU state):
//!
//! 1. host 0 runs the proxy domain (PV), which starts `crane-proxy` with its settings
//!    from XenStore, and the GPU guest (HVM), which gets the stand-in GPU (an e1000
//!    passed through, its driver standing in for the GPU driver);
//! 2. an OpenCL program runs natively in the guest (ICD loader, PoCL), then again
//!    under crane (the guest's drop-in `libOpenCL.so.1`);
//! 3. while it runs: `cranectl suspend all` (GPU state to RAM, vendor library
//!    unloaded), the guest unloads the GPU driver, dom0 detaches the GPU (`xl
//!    pci-detach`), the guest live-migrates (`xl migrate`) to the same host, and with
//!    two hosts once more to host 1; there the guest gets that host's GPU (attach,
//!    driver loaded) and `cranectl resume all` rebuilds every OpenCL object;
//! 4. the program must end with exit status 0 and the same result as the native run.
//!
//! The end-to-end tier (tests/xen_host.rs) runs this with two hosts; `cargo xtask
//! demo` runs it as the demo. The remoting path (the program forwarded to the proxy
//! while the guest has no GPU) and the dom0/agent automation come later.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use crane_control::{AppStatus, Mode, Phase, Residue};

use crate::domus::{GUEST_TESTAPPS_DIR, PROXY_STATE_DIR, PROXY_XENSTORE_DIR};
use crate::host::{GUEST_STANDIN_BDF, dom0_address, shell_quote};
use crate::session::Session;
use crate::xl::{DomainKind, DomuConfig, find_domain, parse_xl_list, standin_slot};

/// The HVM domain that runs OpenCL programs under crane.
pub const GUEST: &str = "gpuguest";
/// The PV domain that runs crane-proxy.
pub const PROXY: &str = "proxy";
pub const PROXY_IP: &str = "10.77.0.2";
pub const GUEST_IP: &str = "10.77.0.3";
/// The port crane-proxy is told to listen on.
pub const PROXY_PORT: u16 = 7000;
/// Memory of the GPU guest. A live migration copies all of it, so it is kept small:
/// the OpenCL runtime comes from a disk, its pages are only cached. PoCL compiling a
/// program caches about 150 MB of LLVM; with 256 MB the guest thrashed (every evicted
/// page is decompressed again from squashfs) and, after minutes, triple-faulted.
pub const GUEST_MEMORY_MIB: u32 = 384;
/// Memory of the proxy domain (PV, never live-migrated).
pub const PROXY_MEMORY_MIB: u32 = 256;
const MIGRATION_PORT: u16 = 8002;
/// Where the program under crane runs in the guest: its pid, output and exit status.
const APP_DIR: &str = "/tmp/crane-app";

/// The OpenCL program the scenario runs: one of the test programs in the guest.
#[derive(Debug, Clone)]
pub struct App {
    pub program: String,
    pub args: Vec<String>,
}

impl Default for App {
    /// `pingpong`, long enough (about 30 s in the guest) that suspends land while it
    /// runs: its kernel arguments are re-set every iteration and its buffers rotate,
    /// so any state crane failed to rebuild shows in the result.
    fn default() -> Self {
        Self {
            program: "pingpong".into(),
            args: vec!["--iters".into(), "40000".into()],
        }
    }
}

impl App {
    fn command_line(&self) -> String {
        let mut line = shell_quote(&format!("{GUEST_TESTAPPS_DIR}/{}", self.program));
        for arg in &self.args {
            line.push(' ');
            line.push_str(&shell_quote(arg));
        }
        line
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
    fn new(stdout: String, stderr: String, status: i32, seconds: f64) -> Self {
        let result = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("RESULT "))
            .unwrap_or_default()
            .to_owned();
        Self {
            result,
            status,
            stdout,
            stderr,
            seconds,
        }
    }
}

/// What `cranectl --json suspend|resume` reports for one process.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Transition {
    pub pid: u32,
    pub phases: Vec<Phase>,
    #[serde(default)]
    pub residue: Option<Residue>,
}

impl Transition {
    pub fn total_ms(&self) -> f64 {
        self.phases.iter().map(|p| p.ms).sum()
    }

    /// `drain 20.0 ms, read-dirty 9.3 ms (196608 B), ...`
    pub fn describe(&self) -> String {
        self.phases
            .iter()
            .map(|p| {
                if p.bytes > 0 {
                    format!("{} {:.1} ms ({} B)", p.name, p.ms, p.bytes)
                } else {
                    format!("{} {:.1} ms", p.name, p.ms)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A live migration of the guest.
#[derive(Debug, Clone)]
pub struct Migration {
    pub from: usize,
    pub to: usize,
    pub domid_before: u32,
    pub domid_after: u32,
    pub uptime_before: f64,
    pub uptime_after: f64,
    pub seconds: f64,
}

/// One suspend → detach → migrate → attach → resume round.
#[derive(Debug, Clone)]
pub struct Cycle {
    pub suspend: Transition,
    pub migration: Migration,
    pub resume: Transition,
}

/// What the proxy domain showed.
#[derive(Debug, Clone)]
pub struct ProxyCheck {
    /// `placeholder` (with the arguments it got) or `running`.
    pub crane_proxy: String,
    /// `clinfo -l` in the proxy domain.
    pub opencl: String,
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
    pub cycles: Vec<Cycle>,
}

impl Report {
    /// A human summary, one line per step.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "proxy domain: crane-proxy {}", self.proxy.crane_proxy);
        let _ = writeln!(
            out,
            "native run in the guest:  {}  (status {}, {:.1} s)",
            self.native.result, self.native.status, self.native.seconds
        );
        for cycle in &self.cycles {
            let m = &cycle.migration;
            let _ = writeln!(
                out,
                "suspended pid {} in {:.0} ms ({}); live migration host {} -> host {} in {:.1} s \
                 (domain {} -> {}); resumed in {:.0} ms ({})",
                cycle.suspend.pid,
                cycle.suspend.total_ms(),
                cycle.suspend.describe(),
                m.from,
                m.to,
                m.seconds,
                m.domid_before,
                m.domid_after,
                cycle.resume.total_ms(),
                cycle.resume.describe()
            );
        }
        let _ = writeln!(
            out,
            "under crane:              {}  (status {}, {:.1} s, {} migration(s))",
            self.crane.result,
            self.crane.status,
            self.crane.seconds,
            self.cycles.len()
        );
        out
    }
}

/// The provisional settings dom0 publishes for crane-proxy (files/crane-proxy-start).
#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub listen: String,
    pub token: String,
}

impl ProxySettings {
    pub fn generate() -> anyhow::Result<Self> {
        let mut bytes = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
        Ok(Self {
            listen: format!("{PROXY_IP}:{PROXY_PORT}"),
            token: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }
}

pub fn proxy_config() -> DomuConfig {
    DomuConfig {
        name: PROXY.into(),
        kind: DomainKind::Pv,
        address: format!("{PROXY_IP}/24"),
        memory_mib: PROXY_MEMORY_MIB,
        ramdisk: crate::PROXY_INITRD.into(),
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

/// Writes the proxy's settings below its XenStore home, where its start script looks.
pub fn publish_proxy_settings(
    s: &Session,
    host: usize,
    settings: &ProxySettings,
) -> anyhow::Result<()> {
    s.dom0(
        host,
        &format!(
            "id=$(xl domid {PROXY}) && keys=/local/domain/$id/{PROXY_XENSTORE_DIR} && \
             xenstore-write $keys/listen {} $keys/token {}",
            shell_quote(&settings.listen),
            shell_quote(&settings.token)
        ),
    )?;
    Ok(())
}

/// Creates the proxy domain and the GPU guest on host 0, publishes the proxy's
/// settings, and waits until both answer.
pub fn create_domains(s: &mut Session) -> anyhow::Result<ProxySettings> {
    create_domain(s, 0, &proxy_config())?;
    let settings = ProxySettings::generate()?;
    publish_proxy_settings(s, 0, &settings)?;
    create_domain(s, 0, &guest_config())?;
    wait_booted(s, 0, PROXY)?;
    wait_booted(s, 0, GUEST)?;
    s.phase("create the proxy domain (PV) and the GPU guest (HVM), both answer");
    Ok(settings)
}

/// Checks that the proxy domain started crane-proxy with the settings from XenStore
/// (the token in a file only root can read) and that PoCL works there.
pub fn check_proxy(
    s: &Session,
    host: usize,
    settings: &ProxySettings,
) -> anyhow::Result<ProxyCheck> {
    let dir = PROXY_STATE_DIR;
    let listen = s.wait_domu(
        host,
        PROXY,
        &format!("cat {dir}/listen"),
        Duration::from_secs(60),
        |out| !out.trim().is_empty(),
    )?;
    ensure!(
        listen.trim() == settings.listen,
        "the proxy read listen address {listen:?} from XenStore, dom0 wrote {:?}",
        settings.listen
    );
    let token = s.domu(
        host,
        PROXY,
        &format!("stat -c %a {dir}/token; cat {dir}/token"),
    )?;
    let (mode, token) = token.split_once('\n').unwrap_or_default();
    ensure!(mode == "600", "the token file has mode {mode}");
    ensure!(
        token == settings.token,
        "the proxy's token file does not hold the token from XenStore"
    );
    // The placeholder records its arguments; the real proxy must be running.
    let started = s.wait_domu(
        host,
        PROXY,
        &format!(
            "if [ -e {dir}/placeholder-args ]; then echo placeholder; cat {dir}/placeholder-args; \
             elif pidof crane-proxy > /dev/null; then echo running; fi"
        ),
        Duration::from_secs(30),
        |out| !out.trim().is_empty(),
    )?;
    let mut lines = started.lines();
    let crane_proxy = match lines.next() {
        Some("placeholder") => {
            let args: Vec<&str> = lines.collect();
            let token_file = format!("{dir}/token");
            ensure!(
                args == [
                    "--listen",
                    settings.listen.as_str(),
                    "--token-file",
                    &token_file
                ],
                "the proxy placeholder got the arguments {args:?}"
            );
            format!("placeholder, started with {}", args.join(" "))
        }
        _ => "running".to_owned(),
    };
    let opencl = s.domu(host, PROXY, "clinfo -l")?;
    ensure!(
        opencl.contains("Portable Computing Language"),
        "PoCL is not an OpenCL platform in the proxy domain: {opencl}"
    );
    Ok(ProxyCheck {
        crane_proxy,
        opencl,
    })
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
    let lspci = s.wait_domu(host, GUEST, "lspci -n", Duration::from_secs(60), |out| {
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

/// The guest lets go of its GPU the way a guest agent will: the driver unloads, then
/// dom0 detaches the device (Xen refuses log-dirty mode, hence live migration, while
/// a PCI device is assigned).
pub fn detach_gpu(s: &Session, host: usize) -> anyhow::Result<()> {
    let bdf = GUEST_STANDIN_BDF;
    s.domu(host, GUEST, "rmmod e1000")?;
    s.dom0(host, &format!("xl pci-detach {GUEST} {bdf}"))?;
    ensure!(
        !s.dom0(host, &format!("xl pci-list {GUEST}"))?.contains(bdf),
        "{bdf} is still attached to {GUEST} on host {host}"
    );
    s.wait_domu(host, GUEST, "lspci -n", Duration::from_secs(60), |out| {
        standin_slot(out).is_none()
    })?;
    Ok(())
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

/// Live-migrates the guest from host `from` to host `to` (the same host, or the other
/// one over TCP with xl's own transport: `-s ''` makes xl run the "host" argument as
/// the transport command, here socat to a listener that hands the socket to
/// `xl migrate-receive`; no ssh).
pub fn migrate(s: &Session, from: usize, to: usize) -> anyhow::Result<Migration> {
    let uptime_before = guest_uptime(s, from)?;
    let domid_before = guest_domid(s, from)?.context("the guest is not running")?;
    let started = Instant::now();
    if from == to {
        s.dom0(
            from,
            &format!("xl migrate -s '' {GUEST} 'xl migrate-receive'"),
        )?;
    } else {
        s.dom0(
            to,
            &format!(
                "setsid nc -l -p {MIGRATION_PORT} -e xl migrate-receive \
                 > /var/log/xen/migrate-receive.log 2>&1 < /dev/null &"
            ),
        )?;
        s.dom0(
            from,
            &format!(
                "xl migrate -s '' {GUEST} 'socat -b 262144 - TCP:{}:{MIGRATION_PORT}'",
                dom0_address(to)
            ),
        )?;
        ensure!(
            guest_domid(s, from)?.is_none(),
            "the guest still runs on host {from} after migrating to host {to}"
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let domid_after = guest_domid(s, to)?
        .with_context(|| format!("the guest does not run on host {to} after migrating"))?;
    if from == to {
        ensure!(
            domid_after != domid_before,
            "a migration to the same host creates a new domain"
        );
    }
    let uptime_after = guest_uptime(s, to)?;
    ensure!(
        uptime_after > uptime_before,
        "the guest did not keep running: uptime {uptime_before} -> {uptime_after}"
    );
    Ok(Migration {
        from,
        to,
        domid_before,
        domid_after,
        uptime_before,
        uptime_after,
        seconds,
    })
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
        out.stdout_text(),
        out.stderr_text(),
        out.status,
        started.elapsed().as_secs_f64(),
    ))
}

/// Starts the program in the background in the guest, under crane (the guest's
/// environment puts crane's `libOpenCL.so.1` first); returns its pid.
pub fn start_under_crane(s: &Session, host: usize, app: &App) -> anyhow::Result<u32> {
    let runner = format!(
        "cd {APP_DIR}\n{} > out 2> err &\necho $! > pid\nwait $!\necho $? > status\n",
        app.command_line()
    );
    s.domu(
        host,
        GUEST,
        &format!(
            "rm -rf {APP_DIR} && mkdir -p {APP_DIR} && cat > {APP_DIR}/run <<'RUN'\n{runner}RUN\n\
             setsid sh {APP_DIR}/run < /dev/null > /dev/null 2>&1 &"
        ),
    )?;
    let pid = s.wait_domu(
        host,
        GUEST,
        &format!("cat {APP_DIR}/pid 2>/dev/null || true"),
        Duration::from_secs(30),
        |out| out.trim().parse::<u32>().is_ok(),
    )?;
    Ok(pid.trim().parse()?)
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

/// Waits until the program under crane has built its kernels (it is in its loop), and
/// checks that crane, not the ICD loader, is its `libOpenCL.so.1`.
pub fn wait_in_loop(s: &Session, host: usize, pid: u32) -> anyhow::Result<AppStatus> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = app_status(s, host, pid)?
            && status.objects.kernels > 0
        {
            let maps = s.domu(host, GUEST, &format!("cat /proc/{pid}/maps"))?;
            ensure!(
                maps.contains("/usr/lib/crane/libcrane_opencl.so"),
                "pid {pid} does not have crane's interposer mapped"
            );
            ensure!(
                !maps.contains("libOpenCL.so.1"),
                "pid {pid} has the ICD loader mapped besides crane"
            );
            return Ok(status);
        }
        let alive = s.domu(
            host,
            GUEST,
            &format!("[ -d /proc/{pid} ] && echo alive || true"),
        )?;
        if alive.trim() != "alive" {
            let err = s.domu(host, GUEST, &format!("cat {APP_DIR}/err"))?;
            bail!("the program ended before it built its kernels: {err}");
        }
        if Instant::now() > deadline {
            bail!("the program under crane built no kernel within 300 s");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn transition(s: &Session, host: usize, verb: &str, want: Mode) -> anyhow::Result<Transition> {
    let out = s.domu_timeout(
        host,
        GUEST,
        &format!("cranectl --json {verb} all --deadline-ms 60000"),
        Duration::from_secs(180),
    )?;
    let mut reports: Vec<Transition> = Vec::new();
    for line in out.lines().filter(|l| l.starts_with('{')) {
        reports.push(
            serde_json::from_str(line)
                .with_context(|| format!("parsing cranectl's {verb} line {line:?}"))?,
        );
    }
    let [report] = <[Transition; 1]>::try_from(reports)
        .map_err(|r| anyhow::anyhow!("cranectl {verb} all reported {} processes", r.len()))?;
    let status = app_status(s, host, report.pid)?
        .with_context(|| format!("pid {} has no control socket after {verb}", report.pid))?;
    ensure!(
        status.mode == want,
        "pid {} is {:?} after {verb}",
        report.pid,
        status.mode
    );
    Ok(report)
}

/// `cranectl suspend all`: GPU state to RAM, every vendor object released, the vendor
/// library unloaded; nothing of the device may be left in the process.
pub fn suspend(s: &Session, host: usize) -> anyhow::Result<Transition> {
    let report = transition(s, host, "suspend", Mode::Suspended)?;
    let residue = report.residue.clone().unwrap_or_default();
    ensure!(
        residue.device_fds.is_empty()
            && residue.device_mappings.is_empty()
            && residue.vendor_threads.is_empty(),
        "the suspended process kept device state: {residue:?}"
    );
    Ok(report)
}

/// `cranectl resume all`: vendor library reloaded, every object recreated.
pub fn resume(s: &Session, host: usize) -> anyhow::Result<Transition> {
    transition(s, host, "resume", Mode::Passthrough)
}

/// Waits until the program under crane has ended and returns its run.
pub fn wait_finished(s: &Session, host: usize, started: Instant) -> anyhow::Result<AppRun> {
    let status = s.wait_domu(
        host,
        GUEST,
        &format!("cat {APP_DIR}/status 2>/dev/null || true"),
        Duration::from_secs(600),
        |out| !out.trim().is_empty(),
    )?;
    let seconds = started.elapsed().as_secs_f64();
    let stdout = s.domu(host, GUEST, &format!("cat {APP_DIR}/out"))?;
    let stderr = s.domu(host, GUEST, &format!("cat {APP_DIR}/err"))?;
    Ok(AppRun::new(
        stdout,
        stderr,
        status.trim().parse().context("parsing the exit status")?,
        seconds,
    ))
}

/// The whole scenario on the session's hosts (1 or 2): see the module's description.
pub fn run(s: &mut Session, app: &App) -> anyhow::Result<Report> {
    let settings = create_domains(s)?;
    let proxy = check_proxy(s, 0, &settings)?;
    s.phase("proxy domain: crane-proxy started with its XenStore settings; PoCL there");

    ensure!(
        standin_slot(&s.domu(0, GUEST, "lspci -n")?).is_none(),
        "the guest sees a GPU before one is attached"
    );
    let gpu_slot = attach_gpu(s, 0)?;
    s.phase("attach host 0's GPU (stand-in) to the guest, driver bound");

    let native = run_native(s, 0, app)?;
    ensure!(
        native.status == 0 && !native.result.is_empty(),
        "the native run in the guest failed (status {}): {}",
        native.status,
        native.stderr
    );
    s.phase(&format!("native run of {} in the guest", app.program));

    let crane_started = Instant::now();
    let pid = start_under_crane(s, 0, app)?;
    wait_in_loop(s, 0, pid)?;
    s.phase("the same program under crane, kernels built");

    let routes: &[(usize, usize)] = if s.hosts.len() == 2 {
        &[(0, 0), (0, 1)]
    } else {
        &[(0, 0)]
    };
    let mut cycles = Vec::new();
    for &(from, to) in routes {
        let suspend = suspend(s, from)?;
        detach_gpu(s, from)?;
        s.phase("cranectl suspend all, GPU driver unloaded, GPU detached");
        let migration = migrate(s, from, to)?;
        let status = app_status(s, to, pid)?
            .with_context(|| format!("pid {pid} is gone after the migration"))?;
        ensure!(
            status.mode == Mode::Suspended,
            "pid {pid} is {:?} after the migration",
            status.mode
        );
        s.phase(&format!("live migration host {from} -> host {to}"));
        attach_gpu(s, to)?;
        let resume = resume(s, to)?;
        s.phase(&format!(
            "attach host {to}'s GPU, driver bound, cranectl resume all"
        ));
        cycles.push(Cycle {
            suspend,
            migration,
            resume,
        });
    }
    let last = routes.last().map_or(0, |r| r.1);
    let crane = wait_finished(s, last, crane_started)?;
    s.phase("the program under crane finished");
    ensure!(
        crane.status == 0,
        "the program under crane failed (status {}): {}",
        crane.status,
        crane.stderr
    );
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
        cycles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_runs_keep_the_last_result_line() {
        let run = AppRun::new(
            "pingpong: iteration 10000\nRESULT pingpong 744033231e3a5475\n".into(),
            String::new(),
            0,
            1.0,
        );
        assert_eq!(run.result, "RESULT pingpong 744033231e3a5475");
        assert_eq!(
            AppRun::new("nothing\n".into(), String::new(), 1, 1.0).result,
            ""
        );
    }

    #[test]
    fn command_lines_are_quoted() {
        let app = App {
            program: "pingpong".into(),
            args: vec!["--iters".into(), "a b".into()],
        };
        assert_eq!(
            app.command_line(),
            "'/usr/lib/crane/testapps/pingpong' '--iters' 'a b'"
        );
    }

    #[test]
    fn parses_cranectl_transitions() {
        let line = r#"{"pid":285,"phases":[{"name":"drain","ms":20.0,"bytes":0},{"name":"read-dirty","ms":9.3,"bytes":196608}],"residue":{"device_fds":[],"device_mappings":[],"vendor_threads":[],"libraries_still_mapped":["libpocl.so.2"]}}"#;
        let t: Transition = serde_json::from_str(line).unwrap();
        assert_eq!(t.pid, 285);
        assert!((t.total_ms() - 29.3).abs() < 1e-9);
        assert_eq!(t.describe(), "drain 20.0 ms, read-dirty 9.3 ms (196608 B)");
        let resumed: Transition =
            serde_json::from_str(r#"{"pid":1,"phases":[],"residue":null}"#).unwrap();
        assert!(resumed.residue.is_none());
    }

    #[test]
    fn proxy_settings_are_fresh_tokens() {
        let a = ProxySettings::generate().unwrap();
        let b = ProxySettings::generate().unwrap();
        assert_eq!(a.listen, format!("{PROXY_IP}:{PROXY_PORT}"));
        assert_eq!(a.token.len(), 32);
        assert_ne!(a.token, b.token);
    }
}
