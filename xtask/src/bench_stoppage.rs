//! `cargo xtask bench-stoppage`: how long an application stops when crane
//! suspends and resumes it, and when it moves it to crane-proxy (TCP
//! loopback) and back, as its memory grows and as it rewrites more of it.
//!
//! benches/stoppage.c runs under `libcrane_opencl.so` with `--mib` of device
//! memory, rewriting `--rewrite` percent of it per second by kernel; for each
//! size and rate this drives suspend+resume twice and remote+local twice
//! through the process's control socket, a second apart (so that the second
//! of each sees one second's rewrites), then twice a pre-copy followed at
//! once by suspend+resume (steps `precopy`, `pc-suspend`, `pc-resume`: the
//! pre-copy reads while the application runs, the suspend only what it
//! rewrote meanwhile), and records the longest gap the
//! application saw around each step (its stoppage), crane's per-phase account
//! (read-dirty, release, unload, reload, recreate, reinject, ...), and the
//! GB/s of the phases that move bytes. The application checks every byte at
//! the end. A figure printer (docs/benchmarks.md), not a timed test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crane_control::{Phase, Request, call, socket_path};
use serde::Serialize;

use crate::conformance::Proxy;

#[derive(Debug, clap::Args)]
#[command(about = "Stoppage of suspend/resume and moves to crane-proxy and back, by memory size")]
pub struct Args {
    /// Device memory the application holds, MiB, comma-separated.
    #[arg(long, default_value = "1,16,256,1024,4096")]
    pub mib: String,
    /// Percent of its memory the application rewrites per second, comma-separated.
    #[arg(long, default_value = "0,10,100")]
    pub rewrite: String,
    /// The size of each of the application's buffers, MiB.
    #[arg(long, default_value_t = 8.0)]
    pub buffer_mib: f64,
    /// Steps per kind (suspend+resume, remote+local) per size and rate.
    #[arg(long, default_value_t = 2)]
    pub repeat: usize,
    /// The platform whose name contains this (default: the first).
    #[arg(long)]
    pub platform: Option<String>,
    /// A prebuilt libcrane_opencl.so (default: build the release one).
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// A prebuilt crane-proxy (default: build the release one).
    #[arg(long)]
    pub proxy: Option<PathBuf>,
    /// A prebuilt benches/stoppage.c (default: build it with gcc).
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Also move the running application between devices, in this order
    /// (device specs, comma-separated, e.g. `cpu,gpu`: steps `to-cpu`,
    /// `to-gpu`), `--repeat` times, each with its stoppage.
    #[arg(long)]
    pub moves: Option<String>,
    /// Which of the kinds to run: `suspend` (suspend+resume), `precopy`
    /// (pre-copy, then suspend+resume), `remote` (to crane-proxy and back),
    /// `pc-remote` (to crane-proxy after a pre-copy there, and back after a
    /// pre-copy on the way back: steps `pc-remote` and `pc-local`).
    #[arg(
        long,
        default_value = "suspend,precopy,remote,pc-remote",
        value_delimiter = ','
    )]
    pub steps: Vec<String>,
    /// The most rounds of a pre-copy to or from crane-proxy (`pc-remote`,
    /// `pc-local`).
    #[arg(long, default_value_t = 4)]
    pub precopy_rounds: u32,
}

#[derive(Debug, Serialize)]
struct Step {
    mib: f64,
    rewrite_percent: f64,
    /// `suspend`, `resume`, `remote`, `local`, `precopy`, `pc-suspend`,
    /// `pc-resume`, `pc-remote`, `pc-local`, or `to-SPEC` (a move to other
    /// devices).
    step: String,
    /// The longest gap between two of the application's iterations around
    /// the step (for suspend+resume: both, with the driver's turnaround).
    app_pause_ms: Option<f64>,
    /// crane's own account: the sum of its phases that stopped the application.
    crane_ms: f64,
    phases: Vec<Phase>,
}

struct App {
    child: Child,
    lines: Receiver<String>,
    pid: u32,
}

impl App {
    fn line(&self, prefix: &str, within: Duration) -> Result<String> {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).with_context(|| {
                format!("no {prefix:?} line from the application within {within:?}")
            })?;
            if let Some(rest) = l.strip_prefix(prefix) {
                return Ok(rest.trim().to_owned());
            }
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), sig)?;
        Ok(())
    }

    /// The longest gap since the last call.
    fn gap(&self) -> Result<f64> {
        self.signal(nix::sys::signal::Signal::SIGUSR2)?;
        Ok(self.line("GAP ", Duration::from_secs(120))?.parse()?)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn list(s: &str) -> Result<Vec<f64>> {
    s.split(',')
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .with_context(|| format!("{v:?} is not a number"))
        })
        .collect()
}

fn stopped_ms(phases: &[Phase]) -> f64 {
    phases.iter().filter(|p| !p.parallel).map(|p| p.ms).sum()
}

fn describe(phases: &[Phase]) -> String {
    phases
        .iter()
        .map(|p| {
            let mut s = format!("{} {:.1}", p.name, p.ms);
            if p.bytes > 0 {
                s += &format!(" ({:.1} MiB", p.bytes as f64 / 1048576.0);
                if p.ms > 0.05 {
                    s += &format!(", {:.1} GB/s", p.bytes as f64 / p.ms / 1e6);
                }
                s += ")";
            }
            if p.parallel {
                s += " [beside]";
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn request(sock: &Path, req: &Request) -> Result<Vec<Phase>> {
    let r = call(sock, req, Duration::from_secs(300))?;
    if !r.ok {
        bail!("{req:?} failed: {}", r.error.unwrap_or_default());
    }
    Ok(r.phases)
}

/// `build` makes the release library and crane-proxy and returns their paths.
pub fn main(
    a: Args,
    root: &Path,
    build: impl FnOnce() -> Result<(PathBuf, PathBuf)>,
) -> Result<()> {
    for s in &a.steps {
        if !["suspend", "precopy", "remote", "pc-remote"].contains(&s.as_str()) {
            bail!("--steps: unknown kind {s:?} (suspend, precopy, remote, pc-remote)");
        }
    }
    let (lib, proxy_bin) = match (a.lib.clone(), a.proxy.clone()) {
        (Some(l), Some(p)) => (l, p),
        _ => build()?,
    };
    let exe = match &a.exe {
        Some(e) => e.clone(),
        None => {
            let exe = root.join("target/bench/stoppage");
            std::fs::create_dir_all(exe.parent().expect("has a parent"))?;
            crate::run(
                Command::new("gcc")
                    .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                    .arg(&exe)
                    .arg(root.join("benches/stoppage.c"))
                    .arg("-lOpenCL"),
            )?;
            exe
        }
    };
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let proxy = Proxy::start_at(&proxy_bin, dir.path(), format!("tcp://127.0.0.1:{port}"))?;
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&run_dir)?;
    let mut steps = Vec::new();
    println!(
        "{:>6} {:>5} {:<8} {:>9} {:>9}  phases (ms)",
        "MiB", "rw%/s", "step", "app ms", "crane ms"
    );
    for &mib in &list(&a.mib)? {
        for &rewrite in &list(&a.rewrite)? {
            let mut c = Command::new(&exe);
            c.args(["--mib", &mib.to_string(), "--rewrite", &rewrite.to_string()])
                .args(["--buffer-mib", &a.buffer_mib.to_string()])
                .env("LD_PRELOAD", &lib)
                .env("CRANE_RUN_DIR", &run_dir)
                .stdout(Stdio::piped())
                .stdin(Stdio::null());
            if let Some(p) = &a.platform {
                c.args(["--platform", p]);
            }
            let mut child = c
                .spawn()
                .with_context(|| format!("starting {}", exe.display()))?;
            let out = child.stdout.take().expect("piped");
            let (tx, rx) = channel();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            });
            let app = App {
                pid: child.id(),
                child,
                lines: rx,
            };
            app.line("READY", Duration::from_secs(600))?;
            let sock = socket_path(&run_dir, app.pid);
            let t = Instant::now();
            while !sock.exists() {
                if t.elapsed() > Duration::from_secs(30) {
                    bail!("no control socket {}", sock.display());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut record = |step: &str, pause: Option<f64>, phases: Vec<Phase>| {
                // A pre-copy stops the application only at its snapshot point.
                let crane_ms = if step == "precopy" {
                    phases
                        .iter()
                        .filter(|p| p.name == "mark")
                        .map(|p| p.ms)
                        .sum()
                } else {
                    stopped_ms(&phases)
                };
                println!(
                    "{mib:>6} {rewrite:>5} {step:<8} {:>9} {crane_ms:>9.1}  {}",
                    pause.map_or("-".into(), |p| format!("{p:.1}")),
                    describe(&phases)
                );
                steps.push(Step {
                    mib,
                    rewrite_percent: rewrite,
                    step: step.to_owned(),
                    app_pause_ms: pause,
                    crane_ms,
                    phases,
                });
            };
            let deadline_ms = 120_000;
            let times = |kind: &str| {
                if a.steps.iter().any(|s| s == kind) {
                    a.repeat.max(1)
                } else {
                    0
                }
            };
            for _ in 0..times("suspend") {
                std::thread::sleep(Duration::from_secs(1));
                app.gap()?;
                let s = request(&sock, &Request::Suspend { deadline_ms })?;
                let r = request(&sock, &Request::RESUME)?;
                std::thread::sleep(Duration::from_millis(200));
                let pause = app.gap()?;
                record("suspend", None, s);
                record("resume", Some(pause), r);
            }
            for _ in 0..times("precopy") {
                std::thread::sleep(Duration::from_secs(1));
                app.gap()?;
                // The application runs on while the pre-copy reads: its gap
                // is the snapshot point's (crane's `mark` phase).
                let p = request(&sock, &Request::Precopy { deadline_ms })?;
                let during = app.gap()?;
                let s = request(&sock, &Request::Suspend { deadline_ms })?;
                let r = request(&sock, &Request::RESUME)?;
                std::thread::sleep(Duration::from_millis(200));
                let pause = app.gap()?;
                record("precopy", Some(during), p);
                record("pc-suspend", None, s);
                record("pc-resume", Some(pause), r);
            }
            // A move to crane-proxy and back; with a pre-copy (`pc-remote`)
            // the application runs on while its buffers are sent ahead, and
            // its gap is the move's stop (or a round's snapshot point).
            for (kind, precopy) in [("remote", 0), ("pc-remote", a.precopy_rounds.max(1))] {
                for _ in 0..times(kind) {
                    std::thread::sleep(Duration::from_secs(1));
                    app.gap()?;
                    let away = request(
                        &sock,
                        &Request::Remote {
                            proxy: proxy.addr.clone(),
                            token: Some(proxy.token.clone()),
                            deadline_ms,
                            device: None,
                            precopy,
                        },
                    )?;
                    std::thread::sleep(Duration::from_millis(200));
                    record(kind, Some(app.gap()?), away);
                    std::thread::sleep(Duration::from_secs(1));
                    app.gap()?;
                    let back = request(
                        &sock,
                        &Request::Local {
                            deadline_ms,
                            device: None,
                            precopy,
                        },
                    )?;
                    std::thread::sleep(Duration::from_millis(200));
                    let back_kind = if precopy > 0 { "pc-local" } else { "local" };
                    record(back_kind, Some(app.gap()?), back);
                }
            }
            let specs: Vec<&str> = a.moves.as_deref().map_or(Vec::new(), |m| {
                m.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect()
            });
            for _ in 0..if specs.is_empty() { 0 } else { a.repeat.max(1) } {
                for spec in &specs {
                    std::thread::sleep(Duration::from_secs(1));
                    app.gap()?;
                    let moved = request(
                        &sock,
                        &Request::Local {
                            deadline_ms,
                            device: Some((*spec).to_owned()),
                            precopy: 0,
                        },
                    )?;
                    std::thread::sleep(Duration::from_millis(200));
                    record(&format!("to-{spec}"), Some(app.gap()?), moved);
                }
            }
            app.signal(nix::sys::signal::Signal::SIGUSR1)?;
            app.line("OK", Duration::from_secs(600)).with_context(|| {
                format!(
                    "the application ({mib} MiB, {rewrite}%/s) did not end with its memory intact"
                )
            })?;
        }
    }
    drop(proxy);
    if let Some(path) = a.out {
        std::fs::write(&path, serde_json::to_string_pretty(&steps)?)?;
    }
    Ok(())
}
