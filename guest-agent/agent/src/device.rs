//! Waiting until an attached GPU is really usable, instead of the paper's
//! fixed 10 s sleep: the configured device nodes must exist (woken by inotify
//! on their directories when they appear) and open, then an optional probe
//! command (e.g. a tiny OpenCL device query) must exit 0 within its timeout.
//! Failed checks are retried with exponential backoff (10 ms doubling to
//! 500 ms) until the deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the GPU was not usable within {waited_ms} ms ({attempts} checks): {last}")]
    NotReady {
        waited_ms: u128,
        attempts: u32,
        last: String,
    },
}

/// Whether the GPU is usable; the real one and a fake for unit tests.
pub trait DeviceProbe: Send + Sync {
    /// Waits until the GPU is usable or the deadline passes; returns how many
    /// checks it took.
    fn wait_ready(&self, deadline: Instant) -> Result<u32, ProbeError>;
}

pub struct SystemProbe {
    pub wait_for: Vec<PathBuf>,
    pub command: Vec<String>,
    pub command_timeout: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

impl SystemProbe {
    /// One check; the error says what is not there yet.
    fn check(&self) -> Result<(), String> {
        for node in &self.wait_for {
            if !node.exists() {
                return Err(format!("{} does not exist", node.display()));
            }
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(node)
                .map_err(|e| format!("cannot open {}: {e}", node.display()))?;
        }
        if let Some((prog, args)) = self.command.split_first() {
            run_with_timeout(prog, args, self.command_timeout)?;
        }
        Ok(())
    }

    /// Sleeps up to `d`, waking early when an entry is created in the
    /// directory of a missing node.
    fn nap(&self, d: Duration) {
        let missing: Vec<&Path> = self
            .wait_for
            .iter()
            .filter(|n| !n.exists())
            .filter_map(|n| n.parent())
            .collect();
        let woke = (|| -> Option<()> {
            if missing.is_empty() {
                return None;
            }
            let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok()?;
            for dir in &missing {
                ino.add_watch(*dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ATTRIB)
                    .ok()?;
            }
            // A node that appeared before its watch was set sent no event.
            if self.wait_for.iter().all(|n| n.exists()) {
                return Some(());
            }
            let ms = u16::try_from(d.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(&ino),
                PollFlags::POLLIN,
            )];
            let _ = poll(&mut fds, PollTimeout::from(ms));
            Some(())
        })();
        if woke.is_none() {
            std::thread::sleep(d);
        }
    }
}

fn run_with_timeout(prog: &str, args: &[String], timeout: Duration) -> Result<(), String> {
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    let end = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("{prog} failed ({st})")),
            Ok(None) if Instant::now() >= end => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{prog} did not finish within {} ms",
                    timeout.as_millis()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {prog}: {e}")),
        }
    }
}

impl DeviceProbe for SystemProbe {
    fn wait_ready(&self, deadline: Instant) -> Result<u32, ProbeError> {
        let start = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let last = match self.check() {
                Ok(()) => return Ok(attempts),
                Err(e) => e,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ProbeError::NotReady {
                    waited_ms: start.elapsed().as_millis(),
                    attempts,
                    last,
                });
            }
            log::debug!("GPU not usable yet: {last}");
            self.nap(backoff.min(left));
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe waiting for `<dir>/gpuctl` and the thread that makes it after
    /// `after`; with the directory and the node's path.
    fn node_made_later(
        tag: &str,
        after: Duration,
    ) -> (SystemProbe, std::thread::JoinHandle<()>, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("crane-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let node = dir.join("gpuctl");
        let probe = SystemProbe {
            wait_for: vec![node.clone()],
            command: vec!["true".into()],
            command_timeout: Duration::from_secs(5),
        };
        let n2 = node.clone();
        let maker = std::thread::spawn(move || {
            std::thread::sleep(after);
            std::fs::write(&n2, b"").unwrap();
        });
        (probe, maker, dir, node)
    }

    #[test]
    fn waits_for_a_node_that_appears_later() {
        let (probe, maker, dir, _) = node_made_later("probe", Duration::from_millis(300));
        let attempts = probe
            .wait_ready(Instant::now() + Duration::from_secs(10))
            .unwrap();
        maker.join().unwrap();
        assert!(attempts >= 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A nap ends when a missing node appears (inotify on its directory),
    /// not when its time is up.
    #[test]
    fn a_nap_ends_when_the_node_appears() {
        let (probe, maker, dir, node) = node_made_later("nap", Duration::from_millis(200));
        let t = Instant::now();
        probe.nap(Duration::from_secs(30));
        maker.join().unwrap();
        assert!(node.exists());
        assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gives_up_at_the_deadline_with_the_reason() {
        let probe = SystemProbe {
            wait_for: vec![],
            command: vec!["false".into()],
            command_timeout: Duration::from_secs(5),
        };
        let e = probe
            .wait_ready(Instant::now() + Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        assert!(e.contains("false failed"), "{e}");
        let slow = SystemProbe {
            wait_for: vec![],
            command: vec!["sleep".into(), "5".into()],
            command_timeout: Duration::from_millis(50),
        };
        let e = slow
            .wait_ready(Instant::now() + Duration::from_millis(100))
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not finish"), "{e}");
    }
}
