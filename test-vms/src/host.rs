//! One emulated Xen host: QEMU (software emulation) running Debian's Xen with a dom0
//! from [`crane_images`], its state kept in a directory so that separate invocations
//! (`up`, `run`, `down`) find it again.
//!
//! State directory layout (`target/testbed/host0/` for the first host):
//! - `qemu.pid`: QEMU's process id, written by QEMU itself;
//! - `control.sock`: the command channel to dom0's runner (the second serial port);
//! - `monitor.sock`: QEMU's human monitor, used to quit it;
//! - `console-xen.log`: Xen's and dom0's console (the first serial port);
//! - `consoles/`: the domUs' console logs, copied out of dom0 by [`EmulatedHost::collect_logs`];
//! - `qemu.log`: QEMU's own stderr.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crane_images::Images;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::control::{self, CommandOutput, ControlError};

/// dom0's address on its bridge `xenbr0`, which the domUs' network back ends join:
/// 10.77.0.1 on host 0, 10.77.0.11 on host 1, ... The network exists only inside the
/// emulated machines (and the loopback link between them).
pub fn dom0_address(host_index: usize) -> String {
    format!("10.77.0.{}", 1 + 10 * host_index)
}

/// The first TCP port on 127.0.0.1 at which a host's QEMU listens for the peer that
/// links the emulated hosts' bridges (`-netdev socket`): `CRANE_TESTBED_PORT_BASE`, or
/// 47700. Hosts owned by tests use ports 50 higher, so they can run beside `testbed up`.
pub fn default_port_base() -> u16 {
    std::env::var("CRANE_TESTBED_PORT_BASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(47_700)
}

/// The QEMU binary (Debian's qemu-system-x86 package).
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start QEMU: {0}")]
    Spawn(std::io::Error),
    #[error("QEMU exited during boot ({status}); see {log}")]
    QemuExited { status: String, log: String },
    #[error("dom0's command runner did not answer within {waited:?}; see {log}")]
    BootTimeout { waited: Duration, log: String },
    #[error("no emulated host is running in {0} (run `cargo xtask testbed up`)")]
    NotRunning(String),
    #[error(
        "an emulated host is already running in {0} (pid {1}); `cargo xtask testbed down` stops it"
    )]
    AlreadyRunning(String, i32),
    #[error("QEMU did not start listening on 127.0.0.1:{0} for its peer host")]
    NotListening(u16),
    #[error(transparent)]
    Control(#[from] ControlError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HostError + '_ {
    move |source| HostError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// How the emulated machine is sized and where its state goes.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub state_dir: PathBuf,
    /// This host's number (addresses, MACs and ports derive from it).
    pub index: usize,
    /// The host whose bridge this one's is linked to, if any (two-host testbeds).
    pub peer: Option<usize>,
    /// Host N listens for its higher-numbered peer on 127.0.0.1:`port_base + N`.
    pub port_base: u16,
    pub memory_mib: u32,
    /// Emulated CPUs. One: with two (a QEMU thread each), HVM guests doing real work
    /// triple-faulted at random moments, often just after Xen changed a guest's
    /// physical map (a device attached), in 4 of 5 runs of the tier; with one, none
    /// did (docs/testbed.md, traps). It costs little: on the 2-core machines the tier
    /// runs on, two emulated hosts get a core each anyway.
    pub cpus: u32,
    pub dom0_memory_mib: u32,
    pub boot_timeout: Duration,
}

impl HostConfig {
    /// The port at which host `index` listens for its peer.
    pub fn interhost_port(&self, index: usize) -> u16 {
        self.port_base + index as u16
    }

    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            index: 0,
            peer: None,
            port_base: default_port_base(),
            memory_mib: 3072,
            cpus: 1,
            dom0_memory_mib: 1024,
            boot_timeout: Duration::from_secs(300),
        }
    }
}

/// Whether QEMU outlives this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// Killed when the [`EmulatedHost`] is dropped or this process dies (tests).
    Owned,
    /// Left running for later invocations (`testbed up`); `testbed down` stops it.
    Detached,
}

/// A running emulated host.
#[derive(Debug)]
pub struct EmulatedHost {
    state_dir: PathBuf,
    pid: i32,
    child: Option<Child>,
    lifetime: Lifetime,
}

/// The file names inside a state directory.
pub mod files {
    pub const PID: &str = "qemu.pid";
    pub const CONTROL: &str = "control.sock";
    pub const MONITOR: &str = "monitor.sock";
    pub const CONSOLE: &str = "console-xen.log";
    pub const QEMU_LOG: &str = "qemu.log";
    pub const CONSOLES: &str = "consoles";
}

/// The stand-in for the guest's GPU: an e1000 at slot 5 (QEMU's Xen passthrough code
/// takes anything at 00:02.0 for an Intel IGD).
pub const GUEST_STANDIN_BDF: &str = "0000:00:05.0";
/// The stand-in for the proxy domain's own GPU: a second e1000, at slot 7.
pub const PROXY_STANDIN_BDF: &str = "0000:00:07.0";

/// The QEMU command line for one host, with the two stand-in passthrough devices.
pub fn qemu_args(config: &HostConfig, images: &Images) -> Vec<String> {
    let dir = &config.state_dir;
    let p = |name: &str| dir.join(name).display().to_string();
    let i = config.index;
    let xen_cmdline = format!(
        "console=com1 com1=115200,8n1 dom0_mem={m}M,max:{m}M loglvl=all guest_loglvl=all \
         console_timestamps=boot",
        m = config.dom0_memory_mib
    );
    let mut args: Vec<String> = vec![
        "-machine".into(),
        "q35,accel=tcg".into(),
        "-cpu".into(),
        "qemu64,+svm,+npt".into(),
        "-m".into(),
        config.memory_mib.to_string(),
        "-smp".into(),
        config.cpus.to_string(),
        "-nodefaults".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-device".into(),
        "intel-iommu,intremap=on".into(),
        "-kernel".into(),
        images.xen.display().to_string(),
        "-append".into(),
        xen_cmdline,
        "-initrd".into(),
        format!(
            "{} console=hvc0 loglevel=4 crane.hostname=host{i}-dom0 crane.ip={}/24@xenbr0{},{}",
            images.kernel.display(),
            dom0_address(i),
            if config.peer.is_some() {
                " crane.bridge-port=eth0"
            } else {
                ""
            },
            images.dom0_initrd.display()
        ),
        "-chardev".into(),
        format!("file,id=console,path={}", p(files::CONSOLE)),
        "-serial".into(),
        "chardev:console".into(),
        "-chardev".into(),
        format!(
            "socket,id=control,path={},server=on,wait=off",
            p(files::CONTROL)
        ),
        "-serial".into(),
        "chardev:control".into(),
        "-monitor".into(),
        format!("unix:{},server=on,wait=off", p(files::MONITOR)),
        "-pidfile".into(),
        p(files::PID),
        "-netdev".into(),
        "user,id=standin,restrict=on".into(),
        "-device".into(),
        "e1000,netdev=standin,addr=05.0".into(),
        "-netdev".into(),
        "user,id=proxystandin,restrict=on".into(),
        "-device".into(),
        "e1000,netdev=proxystandin,addr=07.0".into(),
    ];
    if let Some(peer) = config.peer {
        // dom0 drives this virtio NIC as eth0 and puts it on its bridge (the stand-in
        // e1000 has no driver in dom0).
        args.extend([
            "-netdev".into(),
            // A TCP stream, lossless: over QEMU's UDP variant, frames dropped while
            // one emulated host is busy made TCP inside back off, and a migration
            // took minutes. The lower-numbered host listens.
            if i < peer {
                format!(
                    "socket,id=interhost,listen=127.0.0.1:{}",
                    config.interhost_port(i)
                )
            } else {
                format!(
                    "socket,id=interhost,connect=127.0.0.1:{}",
                    config.interhost_port(peer)
                )
            },
            "-device".into(),
            format!(
                "virtio-net-pci,netdev=interhost,addr=06.0,mac=52:54:00:77:00:{:02x}",
                i + 1
            ),
        ]);
    }
    args
}

/// Waits until a TCP socket listens on 127.0.0.1:`port`, looking at /proc/net/tcp
/// (connecting to find out would take QEMU's one peer connection).
fn wait_listening(port: u16, limit: Duration) -> Result<(), HostError> {
    let wanted = format!("0100007F:{port:04X}");
    let start = Instant::now();
    while start.elapsed() < limit {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let listening = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&wanted.as_str()) && fields.get(3) == Some(&"0A")
        });
        if listening {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(HostError::NotListening(port))
}

fn read_pid(state_dir: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(state_dir.join(files::PID)).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    // Signal 0 only asks whether the process exists.
    kill(Pid::from_raw(pid), None).ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains("qemu-system")
        .then_some(pid)
}

impl EmulatedHost {
    fn spawn(config: &HostConfig, images: &Images, lifetime: Lifetime) -> Result<Self, HostError> {
        let dir = &config.state_dir;
        if let Some(pid) = read_pid(dir) {
            return Err(HostError::AlreadyRunning(dir.display().to_string(), pid));
        }
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        for name in [files::PID, files::CONTROL, files::MONITOR, files::CONSOLE] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        // Console logs of an earlier boot would pass for this one's.
        let _ = std::fs::remove_dir_all(dir.join(files::CONSOLES));
        let log_path = dir.join(files::QEMU_LOG);
        let log = std::fs::File::create(&log_path).map_err(io_err(&log_path))?;
        let mut command = Command::new(QEMU);
        command
            .args(qemu_args(config, images))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io_err(&log_path))?)
            .stderr(log)
            // Its own process group: a Ctrl-C meant for `testbed up` must not reach a
            // detached QEMU; owned ones are stopped by Drop and by the parent-death signal.
            .process_group(0);
        if lifetime == Lifetime::Owned {
            dies_with_parent(&mut command, libc::SIGKILL);
        }
        let child = command.spawn().map_err(HostError::Spawn)?;
        let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
        Ok(Self {
            state_dir: dir.clone(),
            pid,
            child: Some(child),
            // Until `boot_all` sees dom0 answer, a failure kills QEMU even when detached.
            lifetime: Lifetime::Owned,
        })
    }

    /// Starts QEMU for every host, then waits until each dom0's runner answers, so
    /// the hosts boot side by side. Owned QEMUs are started from the calling thread:
    /// their parent-death signal follows that thread.
    pub fn boot_all(
        configs: &[HostConfig],
        images: &Images,
        lifetime: Lifetime,
    ) -> Result<Vec<Self>, HostError> {
        let mut hosts = Vec::new();
        for config in configs {
            hosts.push(Self::spawn(config, images, lifetime)?);
            if config.peer.is_some_and(|peer| config.index < peer) {
                // The peer's QEMU connects at start-up and exits if nobody listens.
                wait_listening(config.interhost_port(config.index), Duration::from_secs(30))?;
            }
        }
        for (host, config) in hosts.iter_mut().zip(configs) {
            host.wait_ready(config.boot_timeout)?;
        }
        for host in &mut hosts {
            host.lifetime = lifetime;
        }
        Ok(hosts)
    }

    /// Boots one host and waits until dom0's command runner answers.
    pub fn boot(
        config: &HostConfig,
        images: &Images,
        lifetime: Lifetime,
    ) -> Result<Self, HostError> {
        let mut hosts = Self::boot_all(std::slice::from_ref(config), images, lifetime)?;
        Ok(hosts.remove(0))
    }

    /// Finds the host that an earlier `boot` left running in `state_dir`.
    pub fn attach(state_dir: &Path) -> Result<Self, HostError> {
        let pid = read_pid(state_dir)
            .ok_or_else(|| HostError::NotRunning(state_dir.display().to_string()))?;
        Ok(Self {
            state_dir: state_dir.to_path_buf(),
            pid,
            child: None,
            lifetime: Lifetime::Detached,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), HostError> {
        let start = Instant::now();
        let socket = self.state_dir.join(files::CONTROL);
        let log = self.state_dir.join(files::CONSOLE).display().to_string();
        while start.elapsed() < limit {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(HostError::QemuExited {
                    status: status.to_string(),
                    log: self.state_dir.join(files::QEMU_LOG).display().to_string(),
                });
            }
            match control::ping(&socket, Duration::from_secs(5)) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                // QEMU has not created the socket yet.
                Err(ControlError::Connect { .. }) => std::thread::sleep(Duration::from_millis(200)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(HostError::BootTimeout { waited: limit, log })
    }

    /// Runs a shell script in dom0; stops it after `timeout`.
    pub fn run(&self, script: &str, timeout: Duration) -> Result<CommandOutput, HostError> {
        let lock_path = self.state_dir.join("control.lock");
        let lock_file = std::fs::File::create(&lock_path).map_err(io_err(&lock_path))?;
        // One request at a time per host: the serial line carries one conversation.
        let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| HostError::Io {
                path: lock_path.display().to_string(),
                source: e.into(),
            })?;
        Ok(control::run(
            &self.state_dir.join(files::CONTROL),
            script,
            timeout,
        )?)
    }

    /// Runs a script in the domU `domain` through its console runner (via dom0).
    pub fn run_in_domain(
        &self,
        domain: &str,
        script: &str,
        timeout: Duration,
    ) -> Result<CommandOutput, HostError> {
        self.poll_domain(domain, script, timeout, timeout)
    }

    /// Like [`Self::run_in_domain`], but gives up after `start_within` if the domU's
    /// runner has not started answering (status 124): for polling a booting domU.
    pub fn poll_domain(
        &self,
        domain: &str,
        script: &str,
        timeout: Duration,
        start_within: Duration,
    ) -> Result<CommandOutput, HostError> {
        self.run(
            &format!(
                "crane-guest-run {} {} {} {}",
                shell_quote(domain),
                timeout.as_secs().max(1),
                shell_quote(script),
                start_within.as_secs().max(1)
            ),
            timeout + Duration::from_secs(20),
        )
    }

    /// Copies every domU console log out of dom0 into `consoles/` of the state directory.
    pub fn collect_logs(&self) -> Result<Vec<PathBuf>, HostError> {
        let listing = self.run(
            "ls /var/log/xen/console/ 2>/dev/null",
            Duration::from_secs(20),
        )?;
        let dir = self.state_dir.join(files::CONSOLES);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mut saved = Vec::new();
        for name in listing.stdout_text().split_whitespace() {
            if name.contains('/') {
                continue;
            }
            let out = self.run(
                &format!("cat /var/log/xen/console/{name}"),
                Duration::from_secs(60),
            )?;
            let path = dir.join(name);
            std::fs::write(&path, &out.stdout).map_err(io_err(&path))?;
            saved.push(path);
        }
        Ok(saved)
    }

    /// Stops QEMU: asks it to quit through its monitor (everything lives in memory,
    /// nothing needs flushing), then kills it if it has not gone after `grace`.
    pub fn shutdown(mut self, grace: Duration) -> Result<(), HostError> {
        let _ = std::os::unix::net::UnixStream::connect(self.state_dir.join(files::MONITOR))
            .and_then(|mut s| std::io::Write::write_all(&mut s, b"quit\n"));
        let start = Instant::now();
        while start.elapsed() < grace && self.alive() {
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
        Ok(())
    }

    fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => kill(Pid::from_raw(self.pid), None).is_ok(),
        }
    }

    fn kill(&mut self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        } else {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(5)
                && kill(Pid::from_raw(self.pid), None).is_ok()
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for name in [files::PID, files::CONTROL, files::MONITOR] {
            let _ = std::fs::remove_file(self.state_dir.join(name));
        }
    }
}

impl Drop for EmulatedHost {
    fn drop(&mut self) {
        if self.lifetime == Lifetime::Owned
            && (self.child.is_some() || read_pid(&self.state_dir).is_some())
        {
            self.kill();
        }
    }
}

/// Quotes `text` for a POSIX shell.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Has the process `command` starts get `signal` when the thread that starts it
/// ends (`PR_SET_PDEATHSIG`): the thread, not the process, so start it from one
/// that lives as long as the process is wanted.
pub(crate) fn dies_with_parent(command: &mut Command, signal: libc::c_int) {
    // SAFETY: the closure runs in the forked child before exec and only makes the
    // async-signal-safe prctl system call, touching no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_for_the_shell() {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", shell_quote("it's $HOME `x`")))
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"it's $HOME `x`");
    }

    #[test]
    fn standin_device_is_not_at_slot_2() {
        let images = Images {
            xen: "/x/xen".into(),
            kernel: "/x/vmlinuz".into(),
            dom0_initrd: "/x/dom0.cpio.gz".into(),
            guest_initrd: "/x/guest.cpio.gz".into(),
        };
        let args = qemu_args(&HostConfig::new("/state"), &images);
        let devices: Vec<&String> = args.iter().filter(|a| a.starts_with("e1000")).collect();
        assert_eq!(
            devices,
            vec![
                "e1000,netdev=standin,addr=05.0",
                "e1000,netdev=proxystandin,addr=07.0"
            ]
        );
        assert!(args.contains(&"qemu64,+svm,+npt".to_owned()));
        assert!(args.contains(&"intel-iommu,intremap=on".to_owned()));
        let modules = &args[args.iter().position(|a| a == "-initrd").unwrap() + 1];
        assert_eq!(modules.matches(',').count(), 1, "{modules}");
    }
}
