//! Moving a domain for the XenStore trigger: craned runs the real
//! `xl migrate` itself (through the wrapper, `xl migrate` runs in the
//! operator's shell instead). The transfer runs beside the service, which
//! polls it on each supervision tick, so `crane status` and other guests'
//! requests are not held up while a domain's memory crosses the network.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Starts transfers. craned's unit tests use a fake that moves a fake domain.
pub trait Transfers: Send {
    /// Starts `xl migrate [-s ssh_command] guest dest`.
    fn start(
        &self,
        guest: &str,
        dest: &str,
        ssh_command: Option<&str>,
    ) -> Result<Box<dyn Running>, String>;
}

/// A transfer under way.
pub trait Running: Send {
    /// `None` while it runs; then whether it succeeded (and if not, why).
    fn poll(&mut self) -> Option<Result<(), String>>;
    /// Bytes sent so far, when known.
    fn bytes(&self) -> Option<u64> {
        None
    }
}

/// Runs the real xl (not the wrapper: craned does the choreography itself).
pub struct XlTransfers {
    pub xl: PathBuf,
}

/// How much of xl's output a failure message quotes.
const TAIL_LINES: usize = 6;

struct XlRunning {
    child: Child,
    guest: String,
    tail: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// How long a finished xl's output may take to be read (a process xl left
/// behind may hold the pipe open; its output is then cut).
const DRAIN: std::time::Duration = std::time::Duration::from_secs(1);

impl Transfers for XlTransfers {
    fn start(
        &self,
        guest: &str,
        dest: &str,
        ssh_command: Option<&str>,
    ) -> Result<Box<dyn Running>, String> {
        let mut cmd = Command::new(&self.xl);
        cmd.arg("migrate");
        if let Some(s) = ssh_command {
            cmd.arg("-s").arg(s);
        }
        // The request parser refuses a destination starting with '-', so
        // neither argument can become an option.
        cmd.arg(guest).arg(dest);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // If craned dies, xl dies with it: the restarted craned then finds the
        // domain either gone (done) or here (rolled back), never a transfer
        // nobody watches.
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the child's own state between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.xl.display()))?;
        let tail = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for (stream, name) in [
            (
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                "stdout",
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                "stderr",
            ),
        ] {
            let Some(stream) = stream else { continue };
            let tail = tail.clone();
            let guest = guest.to_string();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    log::info!("{guest}: xl migrate ({name}): {line}");
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    if t.len() == TAIL_LINES {
                        t.remove(0);
                    }
                    t.push(line);
                }
            }));
        }
        log::info!(
            "{guest}: running {} migrate{} {guest} {dest}",
            self.xl.display(),
            ssh_command.map_or(String::new(), |s| format!(" -s {s:?}"))
        );
        Ok(Box::new(XlRunning {
            child,
            guest: guest.to_string(),
            tail,
            readers,
        }))
    }
}

impl Running for XlRunning {
    fn bytes(&self) -> Option<u64> {
        craned_control::migration_stream_bytes(self.child.id())
    }

    fn poll(&mut self) -> Option<Result<(), String>> {
        let status = match self.child.try_wait() {
            Ok(None) => return None,
            Ok(Some(s)) => s,
            Err(e) => return Some(Err(format!("cannot wait for xl: {e}"))),
        };
        if status.success() {
            return Some(Ok(()));
        }
        let until = std::time::Instant::now() + DRAIN;
        while self.readers.iter().any(|r| !r.is_finished()) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let tail = failure_text(&self.tail.lock().unwrap_or_else(|e| e.into_inner()));
        log::warn!("{}: xl migrate ended with {status}", self.guest);
        Some(Err(format!("xl migrate ended with {status}: {tail}")))
    }
}

/// xl's last lines for a failure's text: its warnings (libxl warns about
/// harmless things on every migration) only where nothing else was said.
fn failure_text(lines: &[String]) -> String {
    let said: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with("libxl: warning:"))
        .collect();
    if said.is_empty() {
        lines.join(" | ")
    } else {
        said.join(" | ")
    }
}

impl Drop for XlRunning {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn finish(r: &mut Box<dyn Running>) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(r) = r.poll() {
                return r;
            }
            assert!(Instant::now() < until, "the transfer never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn failure_texts_leave_out_warnings_when_there_is_more() {
        let l = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            failure_text(&l(&[
                "libxl: warning: Device present in JSON but not in xenstore",
                "libxl: error: truncated reading banner",
            ])),
            "libxl: error: truncated reading banner"
        );
        assert_eq!(
            failure_text(&l(&["libxl: warning: a", "libxl: warning: b"])),
            "libxl: warning: a | libxl: warning: b"
        );
    }

    #[test]
    fn runs_xl_and_reports_its_failure_with_its_output() {
        // Stand-ins for xl that need no file written by the test (a script
        // written here could meet ETXTBSY while other tests fork): true
        // succeeds; ls fails on `migrate -s "" g1 host1`, saying so.
        let ok = XlTransfers {
            xl: PathBuf::from("/bin/true"),
        };
        assert_eq!(finish(&mut ok.start("g1", "host1", None).unwrap()), Ok(()));
        let bad = XlTransfers {
            xl: PathBuf::from("/bin/ls"),
        };
        let e = finish(&mut bad.start("g1", "host1", Some("")).unwrap()).unwrap_err();
        assert!(e.contains("exit status: 2") && e.contains("migrate"), "{e}");
        let missing = XlTransfers {
            xl: PathBuf::from("/nonexistent/xl"),
        };
        assert!(missing.start("g1", "h", None).is_err());
    }
}
