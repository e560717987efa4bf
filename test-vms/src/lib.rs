//! The emulated Xen testbed: real Xen 4.17 hosts (Debian's) booted under QEMU software
//! emulation, with a command channel into dom0 and, through dom0, into each domU.
//!
//! `cargo xtask testbed ...` drives it ([`cli`]); the end-to-end tests use
//! [`EmulatedHost`] directly. docs/testbed.md explains the whole tier.

pub mod control;
pub mod host;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use crane_images::{ImageSpec, Images, Paths};

pub use control::CommandOutput;
pub use host::{EmulatedHost, HostConfig, Lifetime};

const RUNNER: &str = include_str!("../files/crane-runner");
const GUEST_RUN: &str = include_str!("../files/crane-guest-run");

/// Where dom0 finds the domU kernel and initramfs.
pub const GUEST_KERNEL: &str = "/guest/vmlinuz";
pub const GUEST_INITRD: &str = "/guest/guest.cpio.gz";

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
/// domain, and the domU kernel and initramfs inside dom0.
pub fn build_images(paths: &Paths) -> anyhow::Result<Images> {
    let builder = crane_images::Builder::new(paths.clone()).context("loading the image lock")?;
    let guest_spec = ImageSpec::default()
        .text("/usr/sbin/crane-runner", RUNNER, 0o755)
        .service("/usr/sbin/crane-runner /dev/hvc0");
    let guest_initrd = builder.domu("guest", &guest_spec)?;
    let kernel = builder.kernel()?;
    let dom0_spec = ImageSpec::default()
        .text("/usr/sbin/crane-runner", RUNNER, 0o755)
        .text("/usr/sbin/crane-guest-run", GUEST_RUN, 0o755)
        .file(&kernel, GUEST_KERNEL, 0o644)
        .file(&guest_initrd, GUEST_INITRD, 0o644)
        .service("/usr/sbin/crane-runner /dev/ttyS1");
    Ok(Images {
        xen: builder.xen()?,
        dom0_initrd: builder.dom0(&dom0_spec)?,
        kernel,
        guest_initrd,
    })
}

/// Builds the images and boots a host with its state in `target/testbed/NAME`, owned
/// by the caller (killed on drop, or when the calling process dies).
pub fn boot_owned_host(name: &str) -> anyhow::Result<EmulatedHost> {
    let paths = Paths::in_workspace(&workspace_root());
    ensure_qemu(&paths)?;
    let images = build_images(&paths)?;
    let config = HostConfig::new(test_state_dir(name));
    Ok(EmulatedHost::boot(&config, &images, Lifetime::Owned)?)
}

/// The state directory of a host that a test owns, apart from the `testbed up` one.
pub fn test_state_dir(name: &str) -> PathBuf {
    workspace_root().join("target/testbed").join(name)
}

const USAGE: &str = "\
usage: cargo xtask testbed <command>
  lock                 re-resolve images/packages.lock from Debian's archive
  images               build the images into target/images/out
  up                   build the images and boot an emulated Xen host in the background
  run [--timeout S] [--domain D] -- CMD...
                       run CMD in dom0 (or in domU D) and exit with its status
  logs                 copy the domUs' console logs to target/testbed/host0/consoles
  status               say whether the host is running
  down                 stop the emulated host";

/// Entry point for `cargo xtask testbed ARGS...`.
pub fn cli(args: &[String]) -> anyhow::Result<()> {
    let root = workspace_root();
    let paths = Paths::in_workspace(&root);
    let dir = state_dir(0);
    match args.first().map(String::as_str) {
        Some("lock") => {
            let lock = crane_images::relock(&paths)?;
            println!("{}: {} packages", paths.lock.display(), lock.packages.len());
        }
        Some("images") => {
            let started = Instant::now();
            let images = build_images(&paths)?;
            for path in [
                &images.xen,
                &images.kernel,
                &images.dom0_initrd,
                &images.guest_initrd,
            ] {
                println!(
                    "{}  {}",
                    crane_images::store::sha256_file(path)?,
                    path.display()
                );
            }
            eprintln!("images built in {:.1}s", started.elapsed().as_secs_f64());
        }
        Some("up") => up(&paths, &dir)?,
        Some("run") => {
            let code = run(&dir, &args[1..])?;
            std::process::exit(code);
        }
        Some("logs") => {
            for path in EmulatedHost::attach(&dir)?.collect_logs()? {
                println!("{}", path.display());
            }
        }
        Some("status") => match EmulatedHost::attach(&dir) {
            Ok(host) => println!("running: pid {} in {}", host.pid(), dir.display()),
            Err(_) => println!("not running"),
        },
        Some("down") => match EmulatedHost::attach(&dir) {
            Ok(host) => {
                let _ = host.collect_logs();
                host.shutdown(Duration::from_secs(5))?;
                println!("stopped");
            }
            Err(_) => println!("not running"),
        },
        _ => anyhow::bail!("{USAGE}"),
    }
    Ok(())
}

fn up(paths: &Paths, dir: &Path) -> anyhow::Result<()> {
    ensure_qemu(paths)?;
    let started = Instant::now();
    let images = build_images(paths)?;
    eprintln!(
        "testbed: images ready in {:.1}s; booting Xen under QEMU",
        started.elapsed().as_secs_f64()
    );
    // An interrupted `up` must not leave QEMU behind: until the host answers, a
    // signal kills whatever QEMU this state directory names.
    let interrupted_dir = dir.to_path_buf();
    ctrlc::set_handler(move || {
        if let Ok(host) = EmulatedHost::attach(&interrupted_dir) {
            let _ = host.shutdown(Duration::ZERO);
        }
        std::process::exit(130);
    })
    .context("installing the signal handler")?;
    let boot_started = Instant::now();
    let host = EmulatedHost::boot(&HostConfig::new(dir), &images, Lifetime::Detached)?;
    eprintln!(
        "testbed: dom0 answering after {:.1}s (pid {}, state in {})",
        boot_started.elapsed().as_secs_f64(),
        host.pid(),
        dir.display()
    );
    Ok(())
}

fn run(dir: &Path, args: &[String]) -> anyhow::Result<i32> {
    let mut timeout = Duration::from_secs(600);
    let mut domain = None;
    let mut rest = args;
    loop {
        match rest {
            [flag, value, tail @ ..] if flag == "--timeout" => {
                timeout = Duration::from_secs(value.parse().context("--timeout takes seconds")?);
                rest = tail;
            }
            [flag, value, tail @ ..] if flag == "--domain" => {
                domain = Some(value.clone());
                rest = tail;
            }
            [dashdash, tail @ ..] if dashdash == "--" => {
                rest = tail;
                break;
            }
            _ => break,
        }
    }
    anyhow::ensure!(!rest.is_empty(), "{USAGE}");
    // Like ssh: the words are joined into one shell command line.
    let script = rest.join(" ");
    let host = EmulatedHost::attach(dir)?;
    let output = match &domain {
        Some(domain) => host.run_in_domain(domain, &script, timeout)?,
        None => host.run(&script, timeout)?,
    };
    use std::io::Write;
    std::io::stdout().write_all(&output.stdout)?;
    std::io::stderr().write_all(&output.stderr)?;
    Ok(output.status)
}
