//! The emulated Xen testbed: real Xen 4.17 hosts (Debian's) booted under QEMU software
//! emulation, with a command channel into dom0 and, through dom0, into each domU.
//!
//! `cargo xtask testbed ...` drives it ([`cli`]); the end-to-end tests use
//! [`EmulatedHost`] directly. docs/testbed.md explains the whole tier.

pub mod control;
pub mod domus;
pub mod host;
pub mod proxy_image;
pub mod scenario;
pub mod session;
pub mod tier;
pub mod xl;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use crane_images::{ImageSpec, Images, Paths};

pub use control::CommandOutput;
pub use host::{EmulatedHost, GUEST_STANDIN_BDF, HostConfig, Lifetime, PROXY_STANDIN_BDF};

/// Where dom0 finds the domU kernel and initramfs images (see [`domus`]): the GPU
/// guest carrying crane, the proxy domain, and a plain domU (busybox and the
/// command runner: the PV guest of the stop-and-copy check).
pub const GUEST_KERNEL: &str = "/guest/vmlinuz";
pub const CRANE_GUEST_INITRD: &str = "/guest/crane-guest.cpio.gz";
pub const PROXY_INITRD: &str = "/guest/crane-proxy.cpio.gz";
pub const PLAIN_INITRD: &str = "/guest/plain.cpio.gz";

/// The workspace root (this crate sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-vms lives inside the workspace")
        .to_path_buf()
}

/// The state directory of emulated host number `index`.
pub fn state_dir(index: usize) -> PathBuf {
    workspace_root()
        .join("target/testbed")
        .join(format!("host{index}"))
}

/// Installs QEMU on the build machine if it is missing (Debian's qemu-system-x86).
pub fn ensure_qemu(paths: &Paths) -> anyhow::Result<()> {
    crane_images::apt::ensure_host_tool(&paths.cache, Path::new(host::QEMU), &["qemu-system-x86"])
        .context("installing QEMU")
}

/// Builds the testbed's images: the standard ones plus the command runner in every
/// domain, and inside dom0 the domU kernel, the two domU images and the OpenCL disk
/// (see [`domus`]), after building the crane programs they carry.
pub fn build_images(paths: &Paths) -> anyhow::Result<TestbedImages> {
    build_images_with(paths, &[])
}

/// [`build_images`], with more files in the GPU guest's image: (file of this machine,
/// its path in the guest); an ELF program brings the libraries it needs.
pub fn build_images_with(
    paths: &Paths,
    guest_files: &[(PathBuf, String)],
) -> anyhow::Result<TestbedImages> {
    let artifacts = domus::CraneArtifacts::build()?;
    let builder = crane_images::Builder::new(paths.clone()).context("loading the image lock")?;
    let opencl = domus::opencl_disk(&builder).context("building the OpenCL runtime disk")?;
    let crane_guest = builder
        .domu(
            "crane-guest",
            &guest_files.iter().fold(
                domus::guest_spec(&artifacts, &opencl)?,
                |spec, (src, dest)| spec.file(src, dest, 0o755),
            ),
        )
        .context("building the GPU guest's image")?;
    let proxy = builder
        .domu("crane-proxy", &domus::proxy_spec(&artifacts, &opencl))
        .context("building the proxy domain's image")?;
    let plain = builder
        .domu("plain", &domus::plain_spec(&artifacts.runner))
        .context("building the plain domU's image")?;
    let kernel = builder.kernel()?;
    let dom0_spec = ImageSpec::default()
        .file(&artifacts.runner, "/usr/sbin/crane-runner", 0o755)
        .file(&artifacts.runner, "/usr/sbin/crane-guest-run", 0o755)
        .file(&kernel, GUEST_KERNEL, 0o644)
        .file(&crane_guest, CRANE_GUEST_INITRD, 0o644)
        .file(&proxy, PROXY_INITRD, 0o644)
        .file(&plain, PLAIN_INITRD, 0o644)
        .file(&opencl.image, domus::OPENCL_DISK, 0o444)
        .file(&artifacts.craned, "/usr/sbin/craned", 0o755)
        .file(&artifacts.crane, "/usr/sbin/crane", 0o755)
        .file(&artifacts.xl_wrapper, scenario::WRAPPER, 0o755)
        .service("/usr/sbin/crane-runner /dev/ttyS1");
    Ok(TestbedImages {
        boot: Images {
            xen: builder.xen()?,
            dom0_initrd: builder.dom0(&dom0_spec)?,
            kernel,
            guest_initrd: crane_guest,
        },
        proxy_initrd: proxy,
        opencl_disk: opencl.image,
    })
}

/// What Xen prints when it did not read its platform timer for longer than the
/// timer takes to wrap (HPET: 43 s): the emulated machine stalled. On some
/// machines of this kind QEMU's software emulation now and then starves the
/// emulated CPU of timer interrupts for minutes (the guest soft-locks, every
/// domain's clock then runs far ahead); nothing in crane can finish in time
/// then (docs/testbed.md, "Known traps").
pub const EMULATION_STALL: &str = "Platform timer appears to have unexpectedly wrapped";

/// Whether the Xen console of a host whose state directories start with
/// `prefix` shows an emulation stall.
pub fn emulation_stalled(prefix: &str) -> bool {
    (0..8).any(|i| {
        std::fs::read_to_string(test_state_dir(&format!("{prefix}{i}")).join(host::files::CONSOLE))
            .is_ok_and(|log| log.contains(EMULATION_STALL))
    })
}

/// Runs `attempt`, and once more when it failed and the Xen console of a host
/// whose state directories start with `prefix` shows an emulation stall
/// ([`EMULATION_STALL`]), saying so loudly on stderr (`what` names the run).
pub fn once_more_if_stalled<T>(
    what: &str,
    prefix: &str,
    mut attempt: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    match attempt() {
        Err(e) if emulation_stalled(prefix) => {
            eprintln!(
                "{what}: THE EMULATED MACHINE STALLED (Xen: \"{EMULATION_STALL}\"), and the run \
                 failed: {e:#}\n{what}: running it once more on new hosts"
            );
            attempt()
        }
        other => other,
    }
}

/// `cargo xtask demo` on emulated Xen hosts (1 or 2, owned by this process): the
/// scenario of [`scenario`], each phase printed as it ends. A run that failed
/// because the emulated machine stalled is started once more, from new hosts.
pub fn demo(hosts: usize, app: &scenario::App) -> anyhow::Result<scenario::Report> {
    const PREFIX: &str = "demo-host";
    once_more_if_stalled("demo", PREFIX, || {
        let mut session = session::Session::boot_with(PREFIX, hosts, &app.guest_files())?;
        scenario::run(&mut session, app, scenario::Scope::from_env())
    })
}

/// What [`build_images`] makes: what QEMU boots, and the domU images dom0 carries.
#[derive(Debug, Clone)]
pub struct TestbedImages {
    /// Xen, the kernel, dom0's initramfs and (as `guest_initrd`) the GPU guest's.
    pub boot: Images,
    pub proxy_initrd: PathBuf,
    pub opencl_disk: PathBuf,
}

/// Host configurations for `count` hosts with state under `dir_of(index)`; with two
/// hosts, their bridges are linked.
pub fn host_configs(count: usize, dir_of: impl Fn(usize) -> PathBuf) -> Vec<HostConfig> {
    (0..count)
        .map(|index| HostConfig {
            index,
            peer: (count == 2).then_some(1 - index),
            ..HostConfig::new(dir_of(index))
        })
        .collect()
}

/// Builds the images and boots `count` (1 or 2) hosts with their state in
/// `target/testbed/PREFIX0`, `PREFIX1`, owned by the caller (killed on drop, or when
/// the calling process dies).
pub fn boot_owned_hosts(
    prefix: &str,
    count: usize,
    guest_files: &[(PathBuf, String)],
) -> anyhow::Result<Vec<EmulatedHost>> {
    anyhow::ensure!((1..=2).contains(&count), "the testbed runs 1 or 2 hosts");
    let paths = Paths::in_workspace(&workspace_root());
    tier::ensure_host_tools(&paths)?;
    let images = build_images_with(&paths, guest_files)?;
    let mut configs = host_configs(count, |i| test_state_dir(&format!("{prefix}{i}")));
    for config in &mut configs {
        config.port_base += 50;
    }
    Ok(EmulatedHost::boot_all(
        &configs,
        &images.boot,
        Lifetime::Owned,
    )?)
}

/// The state directory of a host that a test owns, apart from the `testbed up` ones.
pub fn test_state_dir(name: &str) -> PathBuf {
    workspace_root().join("target/testbed").join(name)
}

/// The `testbed up` hosts that are running now.
fn running_hosts() -> Vec<EmulatedHost> {
    (0..8)
        .filter_map(|i| EmulatedHost::attach(&state_dir(i)).ok())
        .collect()
}

/// `cargo xtask testbed`'s arguments.
#[derive(Debug, clap::Args)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

/// The commands of `cargo xtask testbed`.
#[derive(Debug, PartialEq, Eq, clap::Subcommand)]
pub enum CliCommand {
    /// Re-resolve images/packages.lock from Debian's archive.
    Lock,
    /// Build the images into target/images/out and print their SHA-256.
    Images,
    /// Build the images and boot emulated Xen hosts in the background; unless
    /// --bare, set up on host 0 what the demo uses (craned, the proxy domain, the
    /// GPU guest with its GPU and agent, pingpong under crane) and print the
    /// commands to try it by hand.
    #[command(args_override_self = true)]
    Up {
        /// How many hosts to boot, 1 or 2 (two have their dom0 bridges linked).
        #[arg(long, default_value_t = 1, value_name = "N")]
        hosts: usize,
        /// Only boot the hosts: dom0, no domains.
        #[arg(long)]
        bare: bool,
    },
    /// Run CMD in dom0 of a host (or in one of its domUs); exit with its status.
    #[command(args_override_self = true)]
    Run {
        /// The host, by number.
        #[arg(long, default_value_t = 0, value_name = "I")]
        host: usize,
        /// Stop the command after this many seconds.
        #[arg(long, default_value_t = 600, value_name = "S")]
        timeout: u64,
        /// Run CMD in this domU, through its console, instead of in dom0.
        #[arg(long, value_name = "D")]
        domain: Option<String>,
        /// The command; its words are joined into one shell command line, as ssh
        /// does.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Copy the domUs' console logs to target/testbed/hostI/consoles.
    Logs,
    /// Say which hosts are running.
    Status,
    /// Stop the emulated hosts (their logs collected first).
    Down,
    /// Run the end-to-end tier (two hosts; see docs/testbed.md).
    E2e,
    /// Pingpong under crane while the guest makes M moves in a row (same host and
    /// stop-and-copy, with two hosts also across), the file descriptors, threads
    /// and memory of crane-proxy, craned, the program and crane-agent and
    /// XenStore's size after each; the result must equal a native run's (hosts
    /// booted for it, stopped after).
    #[command(args_override_self = true)]
    Soak {
        /// How many hosts to boot, 1 or 2.
        #[arg(long, default_value_t = 1, value_name = "N")]
        hosts: usize,
        /// How many moves in a row.
        #[arg(long, default_value_t = 50, value_name = "M")]
        migrations: usize,
    },
}

/// Entry point for `cargo xtask testbed ...`.
pub fn cli(args: Cli) -> anyhow::Result<()> {
    let root = workspace_root();
    let paths = Paths::in_workspace(&root);
    match args.command {
        CliCommand::Lock => {
            let lock = crane_images::relock(&paths)?;
            println!("{}: {} packages", paths.lock.display(), lock.packages.len());
        }
        CliCommand::Images => {
            let started = Instant::now();
            let images = build_images(&paths)?;
            for path in [
                &images.boot.xen,
                &images.boot.kernel,
                &images.boot.dom0_initrd,
                &images.boot.guest_initrd,
                &images.proxy_initrd,
                &images.opencl_disk,
            ] {
                println!(
                    "{}  {}",
                    crane_images::store::sha256_file(path)?,
                    path.display()
                );
            }
            eprintln!("images built in {:.1}s", started.elapsed().as_secs_f64());
        }
        CliCommand::Up { hosts, bare } => up(&paths, hosts, bare)?,
        CliCommand::Run {
            host,
            timeout,
            domain,
            cmd,
        } => {
            let code = run(host, Duration::from_secs(timeout), domain.as_deref(), &cmd)?;
            std::process::exit(code);
        }
        CliCommand::Logs => {
            for host in running_hosts() {
                for path in host.collect_logs()? {
                    println!("{}", path.display());
                }
            }
        }
        CliCommand::Status => {
            let hosts = running_hosts();
            if hosts.is_empty() {
                println!("not running");
            }
            for host in hosts {
                println!(
                    "running: pid {} in {}",
                    host.pid(),
                    host.state_dir().display()
                );
            }
        }
        CliCommand::Down => {
            let hosts = running_hosts();
            if hosts.is_empty() {
                println!("not running");
            }
            for host in hosts {
                let _ = host.collect_logs();
                let dir = host.state_dir().to_path_buf();
                host.shutdown(Duration::from_secs(5))?;
                println!("stopped {}", dir.display());
            }
        }
        CliCommand::Soak { hosts, migrations } => {
            anyhow::ensure!((1..=2).contains(&hosts), "the testbed runs 1 or 2 hosts");
            let started = Instant::now();
            let app = scenario::App::default();
            let soak = once_more_if_stalled("soak", "soak-host", || {
                let mut session = session::Session::boot("soak-host", hosts)?;
                scenario::soak(&mut session, &app, migrations)
            })?;
            print!("{}", soak.table());
            println!(
                "soak: {} moves in {:.0} s; result {} identical to the native run",
                soak.migrations.len(),
                started.elapsed().as_secs_f64(),
                soak.result
            );
        }
        CliCommand::E2e => match tier::prepare() {
            tier::Readiness::Ready => tier::run()?,
            tier::Readiness::Skip(reason) => {
                anyhow::bail!("the end-to-end tier cannot run here: {reason}")
            }
        },
    }
    Ok(())
}

fn up(paths: &Paths, count: usize, bare: bool) -> anyhow::Result<()> {
    anyhow::ensure!((1..=2).contains(&count), "the testbed runs 1 or 2 hosts");
    tier::ensure_host_tools(paths)?;
    let started = Instant::now();
    let images = build_images(paths)?;
    eprintln!(
        "testbed: images ready in {:.1}s; booting {count} Xen host(s) under QEMU",
        started.elapsed().as_secs_f64()
    );
    // An interrupted `up` must not leave QEMU behind: until the hosts answer, a
    // signal kills whatever QEMU the state directories name.
    ctrlc::set_handler(move || {
        for host in running_hosts() {
            let _ = host.shutdown(Duration::ZERO);
        }
        std::process::exit(130);
    })
    .context("installing the signal handler")?;
    let boot_started = Instant::now();
    let hosts = EmulatedHost::boot_all(
        &host_configs(count, state_dir),
        &images.boot,
        Lifetime::Detached,
    )?;
    for (index, host) in hosts.iter().enumerate() {
        eprintln!(
            "testbed: host{index} dom0 ({}) answering after {:.1}s (pid {}, state in {})",
            host::dom0_address(index),
            boot_started.elapsed().as_secs_f64(),
            host.pid(),
            host.state_dir().display()
        );
    }
    if bare {
        return Ok(());
    }
    // The hosts stay up (they were booted detached) whatever happens below.
    let mut session = session::Session::over(hosts);
    let app = scenario::App::default();
    let pid = scenario::bring_up(&mut session, &app).context(
        "setting up crane on host 0 (the hosts stay up: `cargo xtask testbed logs`, `down`)",
    )?;
    println!(
        "testbed: crane is up on host 0: craned and the xl wrapper in dom0, crane-proxy in \
         the domain `proxy`, crane-agent in `{}` with the GPU (an e1000 stand-in), and {} \
         (pid {pid}) under crane there, holding halfway. Try:",
        scenario::GUEST,
        app.program
    );
    print!("{}", scenario::operator_commands(pid, &app));
    Ok(())
}

fn run(
    index: usize,
    timeout: Duration,
    domain: Option<&str>,
    cmd: &[String],
) -> anyhow::Result<i32> {
    // Like ssh: the words are joined into one shell command line.
    let script = cmd.join(" ");
    let host = EmulatedHost::attach(&state_dir(index))?;
    let output = match domain {
        Some(domain) => host.run_in_domain(domain, &script, timeout)?,
        None => host.run(&script, timeout)?,
    };
    use std::io::Write;
    std::io::stdout().write_all(&output.stdout)?;
    std::io::stderr().write_all(&output.stderr)?;
    Ok(output.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_emulation_is_told_from_xen_s_console() {
        let prefix = format!("unit-stall-{}-", std::process::id());
        assert!(!emulation_stalled(&prefix), "no host, no stall");
        let dir = test_state_dir(&format!("{prefix}1"));
        std::fs::create_dir_all(&dir).unwrap();
        let console = dir.join(host::files::CONSOLE);
        std::fs::write(
            &console,
            "(XEN) [  1.5] Platform timer is 100.000MHz HPET\n",
        )
        .unwrap();
        assert!(!emulation_stalled(&prefix));
        std::fs::write(
            &console,
            "(XEN) [  887.535192] Platform timer appears to have unexpectedly wrapped 10 or more times.\n",
        )
        .unwrap();
        assert!(emulation_stalled(&prefix));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
