//! A run on emulated hosts that this process owns: the hosts, a phase clock whose
//! timings end up in `timings.txt`, and command helpers that turn a failed command
//! into an error carrying its output. The end-to-end tier and `cargo xtask demo` both
//! drive their hosts through it.
//!
//! Dropping a session collects every domU's console log (for the post-mortem of a
//! failed run), writes the timings, and then drops the hosts, which kills their QEMUs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{CommandOutput, EmulatedHost};

/// How long a dom0 command may take unless a caller says otherwise.
pub const DOM0_TIMEOUT: Duration = Duration::from_secs(240);
/// How long a domU command may take unless a caller says otherwise. Its
/// runner answers on the console, and while PoCL compiles in a guest of one
/// emulated vCPU on a slow host it did not start answering for over 60 s
/// (a clean-clone CI run, 2026-11-26, where every phase took two to four
/// times its usual time): a failure only takes longer to report.
pub const DOMU_TIMEOUT: Duration = Duration::from_secs(180);

pub struct Session {
    pub hosts: Vec<EmulatedHost>,
    started: Instant,
    phase_started: Instant,
    timings: Vec<(String, Duration)>,
}

impl Session {
    /// Builds the images and boots `count` hosts (1 or 2) with their state in
    /// `target/testbed/PREFIX0`, ...; they die with this process.
    pub fn boot(prefix: &str, count: usize) -> anyhow::Result<Self> {
        Self::boot_with(prefix, count, &[])
    }

    /// [`Session::boot`] with more files in the GPU guest's image (file of this
    /// machine, path in the guest).
    pub fn boot_with(
        prefix: &str,
        count: usize,
        guest_files: &[(PathBuf, String)],
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        let hosts = crate::boot_owned_hosts(prefix, count, guest_files)?;
        let mut session = Self {
            hosts,
            started,
            phase_started: started,
            timings: Vec::new(),
        };
        session.phase(&format!("build images and boot {count} Xen host(s)"));
        Ok(session)
    }

    /// A session over hosts booted elsewhere (`cargo xtask testbed up`).
    pub fn over(hosts: Vec<EmulatedHost>) -> Self {
        let started = Instant::now();
        Self {
            hosts,
            started,
            phase_started: started,
            timings: Vec::new(),
        }
    }

    /// Ends the current phase: records and prints its wall time.
    pub fn phase(&mut self, name: &str) {
        let now = Instant::now();
        let took = now - self.phase_started;
        self.timings.push((name.to_owned(), took));
        eprintln!(
            "[{:>6.1}s] {name}: {:.1}s",
            self.started.elapsed().as_secs_f64(),
            took.as_secs_f64()
        );
        self.phase_started = now;
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn timings(&self) -> &[(String, Duration)] {
        &self.timings
    }

    fn host(&self, host: usize) -> anyhow::Result<&EmulatedHost> {
        self.hosts
            .get(host)
            .with_context(|| format!("this session has no host {host}"))
    }

    /// Runs a script in dom0 of `host`; its stdout, or an error on a non-zero status.
    pub fn dom0(&self, host: usize, script: &str) -> anyhow::Result<String> {
        let out = self.host(host)?.run(script, DOM0_TIMEOUT)?;
        check(&format!("dom0 of host {host}"), script, &out)
    }

    /// Runs a script in dom0 of `host` and returns its whole output, whatever its status.
    pub fn try_dom0(&self, host: usize, script: &str) -> anyhow::Result<CommandOutput> {
        self.try_dom0_timeout(host, script, DOM0_TIMEOUT)
    }

    /// [`Session::try_dom0`] with its own time limit.
    pub fn try_dom0_timeout(
        &self,
        host: usize,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<CommandOutput> {
        Ok(self.host(host)?.run(script, timeout)?)
    }

    /// Runs a script in the domU `domain` on `host` (via its console runner); its
    /// stdout, or an error on a non-zero status.
    pub fn domu(&self, host: usize, domain: &str, script: &str) -> anyhow::Result<String> {
        self.domu_timeout(host, domain, script, DOMU_TIMEOUT)
    }

    pub fn domu_timeout(
        &self,
        host: usize,
        domain: &str,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let out = self.try_domu(host, domain, script, timeout)?;
        check(&format!("{domain} on host {host}"), script, &out)
    }

    /// Runs a script in a domU and returns its whole output, whatever its status.
    pub fn try_domu(
        &self,
        host: usize,
        domain: &str,
        script: &str,
        timeout: Duration,
    ) -> anyhow::Result<CommandOutput> {
        Ok(self.host(host)?.run_in_domain(domain, script, timeout)?)
    }

    /// Polls a dom0 command until it succeeds with output `accept` accepts; its
    /// output.
    pub fn wait_dom0(
        &self,
        host: usize,
        script: &str,
        limit: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        poll(limit, accept, || self.try_dom0(host, script))
            .with_context(|| format!("`{script}` on host {host}"))
    }

    /// Polls a domU until `check` accepts the stdout of `script` (guests under software
    /// emulation take seconds to boot, to probe a device, to finish a program).
    pub fn wait_domu(
        &self,
        host: usize,
        domain: &str,
        script: &str,
        limit: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let h = self.host(host)?;
        // Each attempt: 4 s for the runner to take the request (a domU still
        // booting has none), then up to 60 s for the script (right after a PCI
        // attach, `lspci` took 20-40 s on a slow machine).
        poll(limit, accept, || {
            Ok(h.poll_domain(
                domain,
                script,
                Duration::from_secs(60).min(limit.max(Duration::from_secs(1))),
                Duration::from_secs(4),
            )?)
        })
        .with_context(|| format!("{domain} on host {host}: `{script}`"))
    }

    /// Where the timings of this session are written.
    pub fn timings_path(&self) -> Option<PathBuf> {
        self.hosts
            .first()
            .map(|h| h.state_dir().join("timings.txt"))
    }
}

fn check(place: &str, script: &str, out: &CommandOutput) -> anyhow::Result<String> {
    if !out.success() {
        bail!(
            "{place}: script failed with status {}:\n{script}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout_text(),
            out.stderr_text()
        );
    }
    Ok(out.stdout_text())
}

impl Drop for Session {
    fn drop(&mut self) {
        // Keep the domUs' consoles for the post-mortem when a check failed.
        for host in &self.hosts {
            if let Ok(paths) = host.collect_logs() {
                for path in paths {
                    eprintln!("console log: {}", path.display());
                    // CI keeps only the output: show how each console ended.
                    if std::thread::panicking() {
                        eprint!("{}", console_tail(&path, 30));
                    }
                }
            }
        }
        let report: String = self
            .timings
            .iter()
            .map(|(name, d)| format!("{:>7.1}s  {name}\n", d.as_secs_f64()))
            .collect();
        if let Some(path) = self.timings_path() {
            let _ = std::fs::write(path, report);
        }
    }
}

/// The last `lines` lines of a console log, less the runner's base64 output lines,
/// each indented, control characters shown as `?`.
fn console_tail(path: &std::path::Path, lines: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    // xenconsoled may put a timestamp ("[2026-11-26 08:23:31] ") before each line.
    let body = |l: &str| -> bool {
        let l = match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
            Some((_, rest)) => rest,
            None => l,
        };
        l.starts_with("O ") || l.starts_with("E ")
    };
    let kept: Vec<&str> = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !body(l))
        .collect();
    kept[kept.len().saturating_sub(lines)..]
        .iter()
        .map(|l| {
            let shown: String = l
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            format!("    | {shown}\n")
        })
        .collect()
}

/// Runs `attempt` every second until it succeeds with stdout that `accept`
/// takes, for at most `limit`; that stdout, or an error with the last outcome.
fn poll(
    limit: Duration,
    accept: impl Fn(&str) -> bool,
    mut attempt: impl FnMut() -> anyhow::Result<CommandOutput>,
) -> anyhow::Result<String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        match attempt() {
            Ok(out) => {
                if out.success() && accept(&out.stdout_text()) {
                    return Ok(out.stdout_text());
                }
                last = format!(
                    "status {}: {}{}",
                    out.status,
                    out.stdout_text(),
                    out.stderr_text()
                );
            }
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    bail!("did not reach the expected state in {limit:?}; last: {last}")
}

#[cfg(test)]
mod tests {
    use super::console_tail;

    #[test]
    fn console_tails_leave_out_the_runner_s_base64_lines() {
        let path = std::env::temp_dir().join(format!("crane-tail-{}", std::process::id()));
        std::fs::write(
            &path,
            "boot\r\n[2026-11-26 08:23:31] CRANE-BEGIN g1\n[2026-11-26 08:23:31] O aGk=\nO aGk=\nE eA==\nCRANE-END g1 0\n",
        )
        .unwrap();
        assert_eq!(
            console_tail(&path, 10),
            "    | boot\n    | [2026-11-26 08:23:31] CRANE-BEGIN g1\n    | CRANE-END g1 0\n"
        );
        assert_eq!(console_tail(&path, 1), "    | CRANE-END g1 0\n");
        std::fs::remove_file(&path).unwrap();
    }
}
