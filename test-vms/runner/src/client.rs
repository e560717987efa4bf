//! `crane-guest-run DOMAIN TIMEOUT SCRIPT [START_TIMEOUT]`, in dom0: runs
//! SCRIPT in the domU DOMAIN through its runner on the Xen console (the pty
//! xenconsoled gives the console), prints its stdout and stderr, and exits with
//! its status (124 when no answer came). START_TIMEOUT bounds the wait for the
//! runner to acknowledge the request (default: TIMEOUT), so that polling a domU
//! that is still booting retries quickly.
//!
//! What an emulated console does under load, and how this copes:
//! - xenconsoled replaces a console's pty when the last process that had it open
//!   closes it, and a request racing with that sends its answer to a pty nobody
//!   reads: one idle holder per domain (`/run/crane-console/DOMID`, "PID TTY")
//!   keeps it open; holders of domains that are gone are stopped.
//! - A notification can be lost (seen after `xl restore` and `xl migrate`): the
//!   request or an answer then waits in the console ring until more bytes
//!   arrive. So while waiting an empty line goes out every 10 s (the runner
//!   answers it), and a request not acknowledged within 15 s is sent again (the
//!   runner does not run an id twice).
//! - Once the pty delivered nothing more although the guest answered: when
//!   nothing at all was heard for 25 s, the console is opened afresh (the domain
//!   may have a new pty) and the request sent again.
//! - Once an answer's lines were lost while the keep-alive answers after them
//!   arrived: an IDLE saying this request has ended, its END not taken, makes
//!   the client ask again (the runner replays the answer).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::proto::{AnswerParser, request_line};

const HOLDERS: &str = "/run/crane-console";
const POKE: Duration = Duration::from_secs(10);
const RESEND: Duration = Duration::from_secs(15);
const SILENCE: Duration = Duration::from_secs(25);
/// How long past the script's own limit the answer may take to arrive.
const MARGIN: Duration = Duration::from_secs(10);

/// The arguments, as the command line gives them.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    pub domain: String,
    pub limit: Duration,
    pub script: String,
    pub start_limit: Duration,
}

impl Args {
    pub fn parse(args: &[String]) -> Result<Args, String> {
        let usage = "usage: crane-guest-run DOMAIN TIMEOUT SCRIPT [START_TIMEOUT]";
        let secs = |s: &str, what: &str| {
            s.parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| format!("{what} must be a number of seconds, not {s:?}\n{usage}"))
        };
        match args {
            [domain, limit, script, rest @ ..] if rest.len() <= 1 => {
                let limit = secs(limit, "TIMEOUT")?;
                let start_limit = match rest.first() {
                    Some(s) => secs(s, "START_TIMEOUT")?,
                    None => limit,
                };
                Ok(Args {
                    domain: domain.clone(),
                    limit,
                    script: script.clone(),
                    start_limit,
                })
            }
            _ => Err(usage.to_owned()),
        }
    }
}

/// Runs the request; the exit status for the process.
pub fn main(args: &Args) -> i32 {
    match run(args) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("crane-guest-run: {}: {e}", args.domain);
            1
        }
    }
}

fn tool(program: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} {} failed with {}",
            args.join(" "),
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The console of one domain, kept open with an idle holder.
struct Console {
    domid: String,
    file: File,
}

impl Console {
    fn open(domid: &str) -> io::Result<Console> {
        let tty = tool(
            "xenstore-read",
            &[&format!("/local/domain/{domid}/console/tty")],
        )?;
        let hold = Path::new(HOLDERS).join(domid);
        let held = std::fs::read_to_string(&hold).unwrap_or_default();
        let mut words = held.split_whitespace();
        let (pid, held_tty) = (
            words.next().and_then(|p| p.parse::<i32>().ok()),
            words.next(),
        );
        let alive = pid.is_some_and(|p| kill(Pid::from_raw(p), None).is_ok());
        if !(alive && held_tty == Some(tty.as_str())) {
            if let Some(p) = pid.filter(|_| alive) {
                let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
            }
            let end = crate::open_raw(Path::new(&tty))?;
            let mut holder = Command::new("sleep");
            holder
                .arg("2147483647")
                .stdin(end)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // SAFETY: setsid is async-signal-safe and touches only the child.
            unsafe {
                holder.pre_exec(|| {
                    nix::unistd::setsid().map_err(io::Error::from)?;
                    Ok(())
                });
            }
            let child = holder.spawn()?;
            std::fs::write(&hold, format!("{} {tty}\n", child.id()))?;
        }
        let file = crate::open_raw(Path::new(&tty))?;
        Ok(Console {
            domid: domid.to_owned(),
            file,
        })
    }

    fn send(&mut self, text: &str) -> io::Result<()> {
        self.file.write_all(text.as_bytes())
    }
}

/// Stops the holders of domains that are gone.
fn sweep_holders() -> io::Result<()> {
    std::fs::create_dir_all(HOLDERS)?;
    let entries: Vec<PathBuf> = std::fs::read_dir(HOLDERS)?
        .flatten()
        .map(|e| e.path())
        .collect();
    if entries.is_empty() {
        return Ok(());
    }
    let live = tool("xenstore-list", &["/local/domain"])?;
    let live: Vec<&str> = live.split_whitespace().collect();
    for path in entries {
        let Some(domid) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if live.contains(&domid) {
            continue;
        }
        if let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}

fn run(args: &Args) -> io::Result<i32> {
    let domid = tool("xl", &["domid", &args.domain])?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let id = format!("g{}{secs}", std::process::id());
    sweep_holders()?;
    let mut console = Console::open(&domid)?;
    let request = request_line(&id, args.limit, &args.script);
    console.send(&request)?;

    let now = Instant::now();
    let mut deadline = now + args.limit + MARGIN;
    let start_deadline = now + args.start_limit;
    let (mut poke, mut resend, mut heard) = (now + POKE, now + RESEND, now);
    let mut acked = false;
    let mut parser = AnswerParser::new(&id);
    let (ack, idle_ended) = (format!("CRANE-ACK {id}"), format!("CRANE-IDLE {id} ended"));
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() <= deadline {
        let now = Instant::now();
        if !parser.started() && !acked && now > start_deadline {
            break;
        }
        if now.duration_since(heard) >= SILENCE {
            eprintln!(
                "crane-guest-run: nothing heard from {} for {}s; reopening its console",
                args.domain,
                now.duration_since(heard).as_secs()
            );
            console = Console::open(&console.domid)?;
            console.send(&request)?;
            (heard, resend, poke) = (now, now + RESEND, now + POKE);
            pending.clear();
        } else if !acked && now >= resend {
            console.send(&request)?;
            resend = now + RESEND;
        } else if now >= poke {
            console.send("\n")?;
            poke = now + POKE;
        }
        let mut fds = [PollFd::new(console.file.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(1000u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let n = match console.file.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A pty whose other side went away (xenconsoled replaced it): the
            // silence rule reopens the console.
            Err(_) => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        if n == 0 {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw);
            let line = line.trim_end_matches(['\r', '\n']);
            heard = Instant::now();
            if line == ack {
                // The guest starts the script's own limit now, maybe after a resend.
                if !acked {
                    deadline = heard + args.limit + MARGIN;
                }
                acked = true;
            } else if line == idle_ended {
                eprintln!(
                    "crane-guest-run: {} ended the request but its answer was lost; asking again",
                    args.domain
                );
                console.send(&request)?;
            }
            match parser.feed(line) {
                Ok(Some(output)) => {
                    io::stdout().write_all(&output.stdout)?;
                    io::stdout().flush()?;
                    io::stderr().write_all(&output.stderr)?;
                    return Ok(output.status);
                }
                Ok(None) => acked |= parser.started(),
                Err(e) => {
                    eprintln!(
                        "crane-guest-run: the answer from {} is not base64: {e}",
                        args.domain
                    );
                    return Ok(125);
                }
            }
        }
    }
    eprintln!(
        "crane-guest-run: no answer from {} within {}s",
        args.domain,
        args.limit.as_secs()
    );
    Ok(124)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_as_the_driver_gives_them() {
        assert_eq!(
            Args::parse(&v(&["gpuguest", "60", "echo hi", "4"])).unwrap(),
            Args {
                domain: "gpuguest".into(),
                limit: Duration::from_secs(60),
                script: "echo hi".into(),
                start_limit: Duration::from_secs(4),
            }
        );
        assert_eq!(
            Args::parse(&v(&["g", "9", "true"])).unwrap().start_limit,
            Duration::from_secs(9)
        );
        assert!(
            Args::parse(&v(&["g", "x", "true"]))
                .unwrap_err()
                .contains("TIMEOUT")
        );
        assert!(Args::parse(&v(&["g", "1"])).unwrap_err().contains("usage"));
        assert!(Args::parse(&v(&["g", "1", "a", "2", "3"])).is_err());
    }
}
