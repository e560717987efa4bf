//! Running the end-to-end tier from a driver (`cargo xtask test`, `cargo xtask testbed
//! e2e`): whether this machine can run it at all ([`prepare`]), and running it so that
//! nothing of it outlives the run ([`run`]), whether it passes, fails, times out or is
//! interrupted.
//!
//! The test's QEMUs die with the test process (parent-death signal) and when its
//! session is dropped; on top of that, the driver runs the test in a process group of
//! its own, kills that group on SIGINT, SIGTERM and SIGHUP and when its guard is
//! dropped, and then sweeps what a killed test may have left: QEMUs named by the test
//! hosts' pidfiles, their sockets, and the image builder's temporary files.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::EmulatedHost;

/// `CRANE_REQUIRE_E2E=1` makes a skipped tier an error (for CI machines that must run it).
pub const REQUIRE_ENV: &str = "CRANE_REQUIRE_E2E";
/// `CRANE_E2E=1` at build time turns the tier's tests on (build.rs); `CRANE_E2E=0` given
/// to a driver skips the tier on purpose (still reported as skipped).
pub const E2E_ENV: &str = "CRANE_E2E";
/// The state directories' prefix of the tier's hosts (`target/testbed/e2e-host0`, ...).
pub const HOST_PREFIX: &str = "e2e-host";
/// The tier fails itself past 35 minutes; this bounds a hung build or boot on top.
const TIER_LIMIT: Duration = Duration::from_secs(40 * 60);

/// Whether the tier can run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Why not, in a sentence.
    Skip(String),
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Checks what the tier needs and installs what is missing when it can (as root, with
/// apt): QEMU and squashfs-tools. Needs no KVM: Xen runs under QEMU's software
/// emulation.
pub fn prepare() -> Readiness {
    if let Some(skip) = opted_out(std::env::var(E2E_ENV).ok().as_deref()) {
        return skip;
    }
    let tools = [
        (crate::host::QEMU, "qemu-system-x86"),
        (crane_images::squashfs::MKSQUASHFS, "squashfs-tools"),
    ];
    let missing: Vec<&str> = tools
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Readiness::Ready;
    }
    if !is_root() {
        return Readiness::Skip(format!(
            "the Debian packages {missing:?} are not installed and installing them needs root"
        ));
    }
    let paths = crane_images::Paths::in_workspace(&crate::workspace_root());
    match ensure_host_tools(&paths) {
        Ok(()) => Readiness::Ready,
        Err(e) => Readiness::Skip(format!("installing {missing:?} failed: {e:#}")),
    }
}

/// A skip when `CRANE_E2E` (given as `value`) is `0`.
fn opted_out(value: Option<&str>) -> Option<Readiness> {
    (value == Some("0")).then(|| Readiness::Skip(format!("{E2E_ENV}=0 asks to skip it")))
}

/// Installs QEMU and squashfs-tools on the build machine if they are missing.
pub fn ensure_host_tools(paths: &crane_images::Paths) -> anyhow::Result<()> {
    crate::ensure_qemu(paths)?;
    crane_images::apt::ensure_host_tool(
        &paths.cache,
        Path::new(crane_images::squashfs::MKSQUASHFS),
        &["squashfs-tools"],
    )
    .context("installing squashfs-tools")?;
    Ok(())
}

/// The process group of the running tier, for the signal handler (0: none).
static TIER_GROUP: AtomicI32 = AtomicI32::new(0);
/// Set by the signal handler, which cleans up and exits on its own.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Kills the tier's process group and sweeps its leftovers when dropped.
struct Guard {
    child: Option<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut()
            && matches!(child.try_wait(), Ok(None))
        {
            stop_group(child.id() as i32);
            let _ = child.wait();
        }
        TIER_GROUP.store(0, Ordering::SeqCst);
        for line in clean_up() {
            eprintln!("e2e tier clean-up: {line}");
        }
    }
}

/// SIGTERM to the whole group, SIGKILL to what is left after 3 s.
fn stop_group(group: i32) {
    let group = Pid::from_raw(-group);
    if kill(group, Signal::SIGTERM).is_err() {
        return;
    }
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) && kill(group, None).is_ok() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = kill(group, Signal::SIGKILL);
}

/// Kills every QEMU that a test-owned host's pidfile still names, removes the pidfile
/// and sockets of QEMUs that are gone, and removes the image builder's temporary files
/// of processes that are gone. Returns one line per thing done.
pub fn clean_up() -> Vec<String> {
    let mut done = Vec::new();
    for index in 0..8 {
        let dir = crate::test_state_dir(&format!("{HOST_PREFIX}{index}"));
        if let Ok(host) = EmulatedHost::attach(&dir) {
            let pid = host.pid();
            if host.shutdown(Duration::ZERO).is_ok() {
                done.push(format!("killed QEMU {pid} of {}", dir.display()));
            }
        }
        for name in [
            crate::host::files::PID,
            crate::host::files::CONTROL,
            crate::host::files::MONITOR,
        ] {
            let path = dir.join(name);
            if std::fs::remove_file(&path).is_ok() {
                done.push(format!("removed {}", path.display()));
            }
        }
    }
    let out = crane_images::Paths::in_workspace(&crate::workspace_root()).out;
    for path in stale_temporaries(&out) {
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if removed.is_ok() {
            done.push(format!("removed {}", path.display()));
        }
    }
    done
}

/// Files `NAME.tmpPID` and directories `NAME.tree.PID` in `dir` whose process is gone:
/// what an interrupted image build leaves.
fn stale_temporaries(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|path| {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                return false;
            };
            let pid = name
                .rsplit_once(".tmp")
                .or_else(|| name.rsplit_once(".tree."))
                .and_then(|(_, pid)| pid.parse::<i32>().ok());
            pid.is_some_and(|pid| kill(Pid::from_raw(pid), None).is_err())
        })
        .collect()
}

/// Runs the tier (`CRANE_E2E=1 cargo test -p crane-test-vms --test xen_host`) in its
/// own process group; kills it on SIGINT/SIGTERM/SIGHUP (then exits 130) and past
/// 40 minutes, and cleans up after it in every case. A run that failed because
/// the emulated machine stalled ([`crate::EMULATION_STALL`] in a host's Xen
/// console) is run once more, and says so loudly.
pub fn run() -> anyhow::Result<()> {
    // A run killed with SIGKILL leaves no chance to clean up; do it now.
    for line in clean_up() {
        eprintln!("e2e tier clean-up (from an earlier run): {line}");
    }
    ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let group = TIER_GROUP.load(Ordering::SeqCst);
        if group > 0 {
            stop_group(group);
        }
        for line in clean_up() {
            eprintln!("e2e tier clean-up: {line}");
        }
        std::process::exit(130);
    })
    .context("installing the signal handler")?;
    let started = Instant::now();
    crate::once_more_if_stalled("e2e tier", HOST_PREFIX, || {
        if INTERRUPTED.load(Ordering::SeqCst) {
            anyhow::bail!("the end-to-end tier was interrupted");
        }
        run_once()
    })?;
    eprintln!(
        "e2e tier: passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One run of the tier's test in its own process group, bounded by
/// [`TIER_LIMIT`].
fn run_once() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(&cargo);
    command
        .args([
            "test",
            "-p",
            "crane-test-vms",
            "--test",
            "xen_host",
            "--",
            "--nocapture",
        ])
        .env(E2E_ENV, "1")
        .current_dir(crate::workspace_root())
        .process_group(0);
    eprintln!("e2e tier: {command:?}");
    let child = command
        .spawn()
        .with_context(|| format!("running {cargo} test"))?;
    TIER_GROUP.store(child.id() as i32, Ordering::SeqCst);
    let mut guard = Guard { child: Some(child) };
    let started = Instant::now();
    let status = loop {
        let child = guard.child.as_mut().expect("the guard holds the child");
        if let Some(status) = child.try_wait()? {
            if INTERRUPTED.load(Ordering::SeqCst) {
                // The handler stopped the tier; it cleans up and exits 130.
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            break status;
        }
        if started.elapsed() > TIER_LIMIT {
            bail!("the end-to-end tier ran past {TIER_LIMIT:?} and was killed");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(guard);
    if !status.success() {
        bail!("the end-to-end tier failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_temporaries_of_dead_processes_only() {
        let dir = tempfile::tempdir().unwrap();
        // pid_max is at most 2^22: this pid cannot exist.
        let dead = 99_999_999;
        let alive = std::process::id();
        for name in [
            format!("dom0.cpio.tmp{dead}"),
            format!("dom0.cpio.tmp{alive}"),
            "dom0.cpio.gz".to_owned(),
            format!("opencl.tree.{dead}"),
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let mut stale: Vec<String> = stale_temporaries(dir.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        stale.sort();
        assert_eq!(
            stale,
            [
                format!("dom0.cpio.tmp{dead}"),
                format!("opencl.tree.{dead}")
            ]
        );
    }

    #[test]
    fn opting_out_is_a_skip_with_a_reason() {
        assert_eq!(
            opted_out(Some("0")),
            Some(Readiness::Skip("CRANE_E2E=0 asks to skip it".to_owned()))
        );
        assert_eq!(opted_out(Some("1")), None);
        assert_eq!(opted_out(None), None);
    }
}
