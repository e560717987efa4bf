//! `cranectl`: list, suspend and resume interposed OpenCL processes through
//! their control sockets, and install libcrane_opencl.so as the ICD in front
//! of the system's OpenCL vendors.

mod icd;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use crane_control::{AppStatus, Request, Response, call, list_pids, run_dir_from_env, socket_path};

mod agent;

/// Control of interposed OpenCL processes (through their control sockets)
/// and of libcrane_opencl.so's installation as the system's ICD.
#[derive(Debug, Parser)]
#[command(name = "cranectl", version, about, max_term_width = 100)]
struct Cli {
    /// Print machine-readable JSON, one object per line.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Args)]
struct Which {
    /// A process id, or `all` (every process with a control socket).
    #[arg(value_name = "PID|all")]
    target: String,
    /// How long the process may take to leave (or reach) its device, in ms.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    deadline_ms: u64,
}

#[derive(Debug, Args)]
struct OnDevice {
    /// Where the process's devices go: `home` (those it started on), `cpu`,
    /// `gpu`, `accelerator`, or text found in the platform name, vendor or
    /// device name (ignoring case). Default: the devices it is on.
    #[arg(long, value_name = "SPEC", value_parser = parse_device)]
    device: Option<String>,
}

#[derive(Debug, Args)]
struct Precopy {
    /// Pre-copy first, in rounds, while the process runs on, so that the
    /// move stops it only for what it changed since: to crane-proxy, the
    /// buffers' contents are sent there; back from it, the local vendor is
    /// opened, the contexts made and what the proxy changed read.
    #[arg(long)]
    precopy: bool,
    /// The most rounds of --precopy (each moves what changed during the one
    /// before; it stops early once little changed).
    #[arg(long, value_name = "N", default_value_t = 4, requires = "precopy",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    precopy_rounds: u32,
}

impl Precopy {
    /// The request's rounds (0: no pre-copy).
    fn rounds(&self) -> u32 {
        if self.precopy { self.precopy_rounds } else { 0 }
    }
}

/// A watch interval: a positive number of seconds, at most a day.
fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

/// Checks a device spec the way the process will read it.
fn parse_device(s: &str) -> Result<String, String> {
    crane_control::DeviceSpec::parse(s).map(|_| s.trim().to_owned())
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List the interposed processes, their mode and their objects.
    List {
        /// List again every SECS seconds until stopped, printing the listing
        /// only when a process appeared, left or changed mode (e.g. to follow a
        /// migration).
        #[arg(long, value_name = "SECS", value_parser = parse_interval)]
        watch: Option<f64>,
    },
    /// Park a process's GPU state in RAM and unload its vendor library.
    Suspend(Which),
    /// Read a process's device memory into RAM while it runs on, so that a
    /// suspend or move soon after stops it only for what changed since.
    Precopy(Which),
    /// On crane-proxy: drain, read back what the proxy changed and shrink what
    /// the process keeps to replay itself if its proxy dies.
    Checkpoint(Which),
    /// Reload the vendor library and rebuild the process's objects.
    Resume {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        device: OnDevice,
    },
    /// Move a process to crane-proxy; it carries on over RPC.
    Remote {
        #[command(flatten)]
        which: Which,
        /// crane-proxy's address: tcp://HOST:PORT or unix:/PATH.
        #[arg(long, value_name = "ADDR", env = "CRANE_PROXY")]
        proxy: String,
        /// A file holding the session token the proxy expects.
        #[arg(long, value_name = "F")]
        token_file: Option<PathBuf>,
        #[command(flatten)]
        device: OnDevice,
        #[command(flatten)]
        precopy: Precopy,
    },
    /// Point a process whose crane-proxy died, and which waits for one to
    /// take its session back, at another proxy (it waits as long again).
    Redirect {
        /// A process id, or `all` (every process with a control socket;
        /// those not waiting for a proxy say so).
        #[arg(value_name = "PID|all")]
        target: String,
        /// Where the session goes: `tcp://HOST:PORT` or `unix:/path`.
        #[arg(long, value_name = "ADDR")]
        proxy: String,
        /// A file holding the session token that proxy expects (default:
        /// the token the process has).
        #[arg(long, value_name = "F")]
        token_file: Option<PathBuf>,
    },
    /// Bring a process back from crane-proxy to the local vendor library;
    /// with --device, also move a process in passthrough onto another local
    /// device.
    Local {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        device: OnDevice,
        #[command(flatten)]
        precopy: Precopy,
    },
    /// Drive a `crane-agent --standalone` (no Xen) over its socket.
    #[command(subcommand)]
    Agent(agent::AgentCmd),
    /// Install libcrane_opencl.so as the ICD in front of the system's vendors.
    InstallIcd {
        /// The library (default: the one beside cranectl).
        #[arg(long, value_name = "PATH")]
        lib: Option<PathBuf>,
        /// Install into this root directory (an image) instead of /.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
    /// Undo install-icd.
    UninstallIcd {
        /// The root directory install-icd was given.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
}

/// The token in `file`, trimmed.
fn read_token(file: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(file)
        .with_context(|| format!("reading {}", file.display()))?
        .trim()
        .to_string())
}

/// libcrane_opencl.so installed beside cranectl (a cargo target directory, or
/// `bin/` and `lib/` under one prefix).
fn default_library() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find cranectl's own path")?;
    let dir = exe.parent().context("cranectl's path has no directory")?;
    [
        dir.join("libcrane_opencl.so"),
        dir.join("../lib/libcrane_opencl.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
    .context("libcrane_opencl.so is not beside cranectl; give its path with --lib")
}

fn targets(run_dir: &Path, which: &str) -> Result<Vec<u32>> {
    if which == "all" {
        return Ok(list_pids(run_dir));
    }
    Ok(vec![
        which
            .parse()
            .with_context(|| format!("not a pid: {which}"))?,
    ])
}

fn print_phases(pid: u32, verb: &str, r: &Response) {
    let total = crane_control::Phase::total_ms(&r.phases);
    let parts: Vec<String> = r
        .phases
        .iter()
        .map(|p| {
            let mut s = format!("{} {:.1} ms", p.name, p.ms);
            if p.bytes > 0 {
                s += &format!(" ({} B)", p.bytes);
            }
            if p.parallel {
                s += " (in parallel)";
            }
            s
        })
        .collect();
    println!("{pid}: {verb} in {total:.1} ms: {}", parts.join(", "));
    if let Some(res) = &r.residue {
        println!(
            "{pid}: device fds left {}, device mappings left {}, vendor threads left {}",
            res.device_fds.len(),
            res.device_mappings.len(),
            res.vendor_threads.len()
        );
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cranectl: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The status of every process with a control socket (a stale socket of a
/// process that is gone is removed; other failures are reported on stderr).
fn statuses(run_dir: &Path, timeout: Duration) -> Vec<AppStatus> {
    let mut out = Vec::new();
    for pid in list_pids(run_dir) {
        let path = socket_path(run_dir, pid);
        match call(&path, &Request::Status, timeout) {
            Ok(Response {
                status: Some(s), ..
            }) => out.push(s),
            Ok(r) => eprintln!("{pid}: {}", r.error.unwrap_or_default()),
            Err(crane_control::CallError::Connect { .. })
                if !Path::new(&format!("/proc/{pid}")).exists() =>
            {
                // The process is gone; its socket is stale.
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => eprintln!("{pid}: {e}"),
        }
    }
    out
}

fn list(run_dir: &Path, json: bool, timeout: Duration) -> Result<()> {
    print_list(&statuses(run_dir, timeout), json)
}

fn print_list(seen: &[AppStatus], json: bool) -> Result<()> {
    if !json {
        println!(
            "{:>8}  {:<11} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5} {:>12} {:>12}  exe",
            "pid", "mode", "ctx", "queue", "mem", "prog", "kern", "event", "tracked B", "dirty B"
        );
    }
    for s in seen {
        if json {
            println!("{}", serde_json::to_string(&s)?);
        } else if s.busy {
            println!(
                "{:>8}  {:<11} (inside an OpenCL call: objects not counted)  {}",
                s.pid,
                format!("{:?}", s.mode).to_lowercase(),
                s.exe
            );
        } else {
            let o = &s.objects;
            println!(
                "{:>8}  {:<11} {:>4} {:>5} {:>4} {:>4} {:>5} {:>5} {:>12} {:>12}  {}",
                s.pid,
                format!("{:?}", s.mode).to_lowercase(),
                o.contexts,
                o.queues,
                o.buffers + o.images,
                o.programs,
                o.kernels,
                o.events,
                s.tracked_bytes,
                s.dirty_bytes,
                s.exe
            );
            if !s.devices.is_empty() {
                println!("{:>8}  on {}", "", s.devices.join(", "));
            }
        }
    }
    Ok(())
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    let json = cli.json;
    let run_dir = run_dir_from_env();
    let timeout = Duration::from_secs(120);
    let mut failed = false;
    match cli.cmd {
        Cmd::List { watch } => match watch {
            None => list(&run_dir, json, timeout)?,
            Some(every) => {
                // Listed again every `every` seconds; printed only when a process
                // appeared, left or changed mode.
                let mut last = None;
                loop {
                    let seen = statuses(&run_dir, timeout);
                    let key: Vec<_> = seen.iter().map(|s| (s.pid, s.mode)).collect();
                    if last.as_ref() != Some(&key) {
                        print_list(&seen, json)?;
                        std::io::stdout().flush()?;
                        last = Some(key);
                    }
                    std::thread::sleep(Duration::from_secs_f64(every));
                }
            }
        },
        Cmd::Suspend(_)
        | Cmd::Precopy(_)
        | Cmd::Checkpoint(_)
        | Cmd::Resume { .. }
        | Cmd::Remote { .. }
        | Cmd::Redirect { .. }
        | Cmd::Local { .. } => {
            let (verb, done, which, req) = match cli.cmd {
                Cmd::Suspend(w) => (
                    "suspend",
                    "suspended",
                    w.target,
                    Request::Suspend {
                        deadline_ms: w.deadline_ms,
                    },
                ),
                Cmd::Precopy(w) => (
                    "precopy",
                    "pre-copied",
                    w.target,
                    Request::Precopy {
                        deadline_ms: w.deadline_ms,
                    },
                ),
                Cmd::Checkpoint(w) => (
                    "checkpoint",
                    "checkpointed",
                    w.target,
                    Request::Checkpoint {
                        deadline_ms: w.deadline_ms,
                    },
                ),
                Cmd::Resume { which, device } => (
                    "resume",
                    "resumed",
                    which.target,
                    Request::Resume {
                        device: device.device,
                    },
                ),
                Cmd::Remote {
                    which,
                    proxy,
                    token_file,
                    device,
                    precopy,
                } => (
                    "remote",
                    "remote",
                    which.target,
                    Request::Remote {
                        proxy,
                        token: token_file.as_deref().map(read_token).transpose()?,
                        deadline_ms: which.deadline_ms,
                        device: device.device,
                        precopy: precopy.rounds(),
                    },
                ),
                Cmd::Redirect {
                    target,
                    proxy,
                    token_file,
                } => (
                    "redirect",
                    "redirected",
                    target,
                    Request::Redirect {
                        proxy,
                        token: token_file.as_deref().map(read_token).transpose()?,
                    },
                ),
                Cmd::Local {
                    which,
                    device,
                    precopy,
                } => (
                    "local",
                    "local",
                    which.target,
                    Request::Local {
                        deadline_ms: which.deadline_ms,
                        device: device.device,
                        precopy: precopy.rounds(),
                    },
                ),
                _ => unreachable!("matched above"),
            };
            let which = which.as_str();
            for pid in targets(&run_dir, which)? {
                match call(&socket_path(&run_dir, pid), &req, timeout) {
                    Ok(r) if r.ok => {
                        if json {
                            println!(
                                "{}",
                                serde_json::to_string(
                                    &serde_json::json!({"pid": pid, "phases": r.phases, "residue": r.residue})
                                )?
                            );
                        } else {
                            print_phases(pid, done, &r);
                        }
                    }
                    Ok(r) => {
                        failed = true;
                        eprintln!("{pid}: {verb} failed: {}", r.error.unwrap_or_default());
                    }
                    Err(e) => {
                        failed = true;
                        eprintln!("{pid}: {e}");
                    }
                }
            }
        }
        Cmd::Agent(cmd) => return agent::run(cmd, json, &run_dir),
        Cmd::InstallIcd { lib, root } => {
            let lib = match lib {
                Some(l) => l,
                None if root.is_none() => default_library()?,
                None => bail!("with --root, give the library's path in the image with --lib"),
            };
            let on_disk = icd::under(root.as_deref(), &lib);
            if !on_disk.is_file() {
                bail!("{} does not exist", on_disk.display());
            }
            let out = icd::install(&icd::Layout::from_env(root.as_deref()), &lib)?;
            for a in &out.actions {
                println!("{a}");
            }
            if out.wrapped.is_empty() {
                eprintln!(
                    "cranectl: warning: no vendor ICD file to wrap; applications will see no OpenCL platform"
                );
            } else {
                println!("crane wraps {}", out.wrapped.join(", "));
            }
        }
        Cmd::UninstallIcd { root } => {
            for a in icd::uninstall(&icd::Layout::from_env(root.as_deref()))?.actions {
                println!("{a}");
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
