//! The xl wrapper, installed as `xl` ahead of the real one in PATH
//! (/usr/local/sbin/xl; the real one at /usr/sbin/xl, or `CRANE_REAL_XL`).
//! Every subcommand runs the real xl untouched (exec, same arguments, same
//! exit status) except the four that move a domain:
//!
//! - `migrate`: craned's pre-migrate (the guest's processes leave the GPU,
//!   which is detached: Xen refuses log-dirty mode while a device is
//!   assigned), then the real `xl migrate`; on success craned is told the
//!   domain left, on failure it rolls back (GPU attached again, processes
//!   resumed). Mode: remote (`CRANE_MIGRATE_MODE=stop-and-copy` to park the
//!   processes instead).
//! - `save`: the same in stop-and-copy mode (`save -c`, which leaves the
//!   domain running, resumes it afterwards).
//! - `migrate-receive` and `restore`: asked first whether a guest may arrive
//!   (craned refuses when no GPU is free and its policy says so), then the
//!   real command, then craned's receive for each managed domain that
//!   appeared. Their stdout is the migration stream, so the wrapper writes
//!   only to stderr.
//!
//! craned answers `managed: false` for domains it does not manage; those
//! migrate exactly as without crane.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use craned_control::{ControlError, DEFAULT_SOCKET, Done, Mode, Progress, Request, call};

/// How long the wrapper waits for each line from craned (a prepare-migrate
/// may take its whole deadline).
const CRANED_TIMEOUT: Duration = Duration::from_secs(900);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub real_xl: PathBuf,
    pub socket: PathBuf,
    pub migrate_mode: Mode,
    /// Run xl alone when craned cannot be reached.
    pub bypass: bool,
}

impl Settings {
    /// From the environment: `CRANE_REAL_XL` (/usr/sbin/xl), `CRANED_SOCKET`
    /// (/run/crane/craned.sock), `CRANE_MIGRATE_MODE` (remote),
    /// `CRANE_XL_BYPASS=1`.
    pub fn from_env() -> Result<Settings, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Ok(Settings {
            real_xl: var("CRANE_REAL_XL")
                .map_or_else(|| PathBuf::from("/usr/sbin/xl"), PathBuf::from),
            socket: var("CRANED_SOCKET")
                .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from),
            migrate_mode: match var("CRANE_MIGRATE_MODE") {
                Some(m) => m.parse()?,
                None => Mode::Remote,
            },
            bypass: var("CRANE_XL_BYPASS").as_deref() == Some("1"),
        })
    }
}

/// What the wrapper does with a command line (the arguments after `xl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    PassThrough,
    Migrate {
        domain: String,
        host: String,
    },
    Save {
        domain: String,
        leave_running: bool,
    },
    /// `migrate-receive` or `restore`: a domain arrives.
    Receive,
}

/// xl's global options (`xl [-vfNtT] SUBCOMMAND ...`) are flags; `-N` is a
/// dry run, which the wrapper leaves alone.
fn split_global(args: &[String]) -> Option<(&str, &[String])> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') {
            break;
        }
        if a[1..].contains('N') {
            return None;
        }
        i += 1;
    }
    let sub = args.get(i)?;
    Some((sub.as_str(), &args[i + 1..]))
}

/// Positional arguments after getopt-style options; `with_value` are the
/// short options that take one (`-s CMD` or `-sCMD`), `flags` the other
/// short ones and `long` the long ones xl accepts there. `None` on `-h` and
/// on an option xl does not know: the wrapper then leaves everything to xl,
/// which prints its usage, instead of preparing a migration xl will refuse.
fn positionals(
    args: &[String],
    with_value: &[char],
    flags: &[char],
    long: &[&str],
) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            out.extend(it.cloned());
            break;
        }
        if a == "-h" || a == "--help" {
            return None;
        }
        if a == "-" {
            out.push(a.clone());
            continue;
        }
        if a.starts_with("--") {
            if !long.contains(&a.as_str()) {
                return None;
            }
            continue;
        }
        if let Some(cluster) = a.strip_prefix('-') {
            // A cluster of flags, the last of which may take a value.
            for (i, c) in cluster.char_indices() {
                if with_value.contains(&c) {
                    if i + c.len_utf8() == cluster.len() {
                        it.next();
                    }
                    break;
                }
                if !flags.contains(&c) {
                    return None;
                }
            }
            continue;
        }
        out.push(a.clone());
    }
    Some(out)
}

/// Reads the command line the way xl does, for the four subcommands the
/// wrapper handles; anything it cannot read passes through for xl to judge.
pub fn plan(args: &[String]) -> Plan {
    let Some((sub, rest)) = split_global(args) else {
        return Plan::PassThrough;
    };
    match sub {
        "migrate" => match positionals(rest, &['C', 's'], &['e', 'p', 'D'], &["--debug", "--live"])
            .as_deref()
        {
            Some([domain, host]) => Plan::Migrate {
                domain: domain.clone(),
                host: host.clone(),
            },
            _ => Plan::PassThrough,
        },
        "save" => {
            let leave_running = rest
                .iter()
                .take_while(|a| *a != "--")
                .any(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('c'));
            match positionals(rest, &[], &['c', 'p'], &[]).as_deref() {
                Some([domain, _file]) | Some([domain, _file, _]) => Plan::Save {
                    domain: domain.clone(),
                    leave_running,
                },
                _ => Plan::PassThrough,
            }
        }
        "migrate-receive" | "restore" => {
            if rest.iter().any(|a| a == "-h" || a == "--help") {
                Plan::PassThrough
            } else {
                Plan::Receive
            }
        }
        _ => Plan::PassThrough,
    }
}

/// Writes craned's progress to the terminal.
pub struct Reporter {
    started: Instant,
}

impl Default for Reporter {
    fn default() -> Self {
        Reporter {
            started: Instant::now(),
        }
    }
}

impl Reporter {
    pub fn line(&self, what: &str) {
        eprintln!(
            "crane: [{:>6.1}s] {what}",
            self.started.elapsed().as_secs_f64()
        );
    }

    pub fn progress(&self, p: &Progress) {
        let mut s = p.phase.clone();
        if let Some(d) = &p.detail {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(b) = p.bytes {
            s.push_str(&format!(" ({:.1} MiB)", b as f64 / (1 << 20) as f64));
        }
        self.line(&s);
    }
}

/// One request to craned, progress printed.
pub fn ask(settings: &Settings, rep: &Reporter, req: &Request) -> Result<Done, ControlError> {
    call(&settings.socket, req, CRANED_TIMEOUT, |p| rep.progress(p))
}

/// Fails when the "real" xl is this very wrapper (a misconfiguration that
/// would make every command call itself).
pub fn check_real_xl(real: &Path) -> Result<(), String> {
    let me = std::fs::canonicalize("/proc/self/exe").ok();
    let it = std::fs::canonicalize(real)
        .map_err(|e| format!("the real xl {} cannot be used: {e}", real.display()))?;
    if me.as_deref() == Some(it.as_path()) {
        return Err(format!(
            "{} is this wrapper itself; set CRANE_REAL_XL to the real xl",
            real.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Plan {
        let args: Vec<String> = s.split_whitespace().map(String::from).collect();
        plan(&args)
    }

    #[test]
    fn reads_xl_command_lines() {
        assert_eq!(p("list"), Plan::PassThrough);
        assert_eq!(p("-v pci-attach g 0000:00:05.0"), Plan::PassThrough);
        assert_eq!(
            p("migrate g host1"),
            Plan::Migrate {
                domain: "g".into(),
                host: "host1".into()
            }
        );
        assert_eq!(
            p("-vv migrate -s ssh-x -e --debug -C /etc/x.cfg 5 host1"),
            Plan::Migrate {
                domain: "5".into(),
                host: "host1".into()
            }
        );
        assert_eq!(
            p("migrate -sfoo -p g h"),
            Plan::Migrate {
                domain: "g".into(),
                host: "h".into()
            }
        );
        assert_eq!(p("migrate g"), Plan::PassThrough, "xl prints the usage");
        assert_eq!(p("migrate -h"), Plan::PassThrough);
        // Options xl does not know: xl refuses them before anything moves.
        assert_eq!(p("migrate --bogus-flag g h"), Plan::PassThrough);
        assert_eq!(p("migrate -ex g h"), Plan::PassThrough);
        assert_eq!(p("save -z g f"), Plan::PassThrough);
        assert_eq!(
            p("migrate -e --live -p g h"),
            Plan::Migrate {
                domain: "g".into(),
                host: "h".into()
            }
        );
        assert_eq!(p("-N migrate g h"), Plan::PassThrough, "dry run");
        assert_eq!(
            p("save g /var/lib/xen/save/g.chk"),
            Plan::Save {
                domain: "g".into(),
                leave_running: false
            }
        );
        assert_eq!(
            p("save -c g f /etc/xen/g.cfg"),
            Plan::Save {
                domain: "g".into(),
                leave_running: true
            }
        );
        assert_eq!(p("save g"), Plan::PassThrough);
        assert_eq!(p("migrate-receive"), Plan::Receive);
        assert_eq!(p("migrate-receive -d -e"), Plan::Receive);
        assert_eq!(p("restore /var/lib/xen/save/g.chk"), Plan::Receive);
        assert_eq!(p("restore -h"), Plan::PassThrough);
        assert_eq!(p(""), Plan::PassThrough);
    }

    #[test]
    fn the_wrapper_is_never_its_own_real_xl() {
        let e = check_real_xl(Path::new("/proc/self/exe")).unwrap_err();
        assert!(e.contains("wrapper itself"), "{e}");
        assert!(check_real_xl(Path::new("/bin/sh")).is_ok());
        assert!(check_real_xl(Path::new("/nonexistent/xl")).is_err());
    }
}
