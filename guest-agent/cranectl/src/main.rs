//! `cranectl`: list, suspend and resume interposed OpenCL processes through
//! their control sockets, and install libcrane_opencl.so as the ICD in front
//! of the system's OpenCL vendors.

mod icd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use crane_control::{Request, Response, call, list_pids, run_dir_from_env, socket_path};

mod agent;

const USAGE: &str = "usage: cranectl [--json] list
       cranectl suspend PID|all [--deadline-ms N]
       cranectl resume PID|all [--deadline-ms N]
       cranectl remote PID|all --proxy tcp://HOST:PORT|unix:/PATH [--token-file F] [--deadline-ms N]
       cranectl local PID|all [--deadline-ms N]
       cranectl agent prepare-migrate [--mode stop-and-copy|remote] [--proxy ADDR] [--token-file F] [--deadline-ms N]
       cranectl agent prepare-resume [--deadline-ms N]
       cranectl agent status
       cranectl install-icd [--lib PATH] [--root DIR]
       cranectl uninstall-icd [--root DIR]";

/// The value after `name`, if `name` is given.
fn option(args: &[String], name: &str) -> Result<Option<String>> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(Some(
            args.get(i + 1)
                .with_context(|| format!("{name} needs a value"))?
                .clone(),
        )),
        None => Ok(None),
    }
}

/// Refuses anything but `allowed` options, each with a value: the ICD verbs
/// change system directories, so a mistyped or unknown argument (`--help`
/// included) must stop them.
fn only_options(args: &[String], allowed: &[&str]) -> Result<()> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if !allowed.contains(&a.as_str()) || it.next().is_none() {
            bail!("unexpected argument {a:?}\n{USAGE}");
        }
    }
    Ok(())
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

fn run() -> Result<ExitCode> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.first().is_some_and(|a| a == "--json");
    if json {
        args.remove(0);
    }
    let run_dir = run_dir_from_env();
    let timeout = Duration::from_secs(120);
    let mut failed = false;
    match args.first().map(String::as_str) {
        Some("list") => {
            if !json {
                println!(
                    "{:>8}  {:<11} {:>4} {:>4} {:>5} {:>4} {:>5} {:>5} {:>12} {:>12}  exe",
                    "pid",
                    "mode",
                    "ctx",
                    "queue",
                    "mem",
                    "prog",
                    "kern",
                    "event",
                    "tracked B",
                    "dirty B"
                );
            }
            for pid in list_pids(&run_dir) {
                let path = socket_path(&run_dir, pid);
                match call(&path, &Request::Status, timeout) {
                    Ok(Response {
                        status: Some(s), ..
                    }) => {
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
                        }
                    }
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
        }
        Some(verb @ ("suspend" | "resume" | "remote" | "local")) => {
            let which = args.get(1).map(String::as_str).unwrap_or_else(|| "");
            if which.is_empty() {
                bail!("{USAGE}");
            }
            let deadline_ms = match args.iter().position(|a| a == "--deadline-ms") {
                Some(i) => args
                    .get(i + 1)
                    .context("--deadline-ms needs a value")?
                    .parse()?,
                None => 10_000,
            };
            let opt = |name: &str| option(&args, name);
            let req = match verb {
                "suspend" => Request::Suspend { deadline_ms },
                "resume" => Request::Resume,
                "remote" => {
                    let proxy = opt("--proxy")?
                        .or_else(|| std::env::var("CRANE_PROXY").ok())
                        .context("remote needs --proxy ADDR (or CRANE_PROXY)")?;
                    let token = match opt("--token-file")? {
                        Some(f) => Some(
                            std::fs::read_to_string(&f)
                                .with_context(|| format!("reading {f}"))?
                                .trim()
                                .to_string(),
                        ),
                        None => None,
                    };
                    Request::Remote {
                        proxy,
                        token,
                        deadline_ms,
                    }
                }
                _ => Request::Local { deadline_ms },
            };
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
                            print_phases(
                                pid,
                                match verb {
                                    "suspend" => "suspended",
                                    "resume" => "resumed",
                                    "remote" => "remote",
                                    _ => "local",
                                },
                                &r,
                            );
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
        Some("agent") => return agent::run(&args[1..], json, &run_dir),
        Some("install-icd") => {
            only_options(&args[1..], &["--lib", "--root"])?;
            let root = option(&args, "--root")?.map(PathBuf::from);
            let lib = match option(&args, "--lib")? {
                Some(l) => PathBuf::from(l),
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
        Some("uninstall-icd") => {
            only_options(&args[1..], &["--root"])?;
            let root = option(&args, "--root")?.map(PathBuf::from);
            for a in icd::uninstall(&icd::Layout::from_env(root.as_deref()))?.actions {
                println!("{a}");
            }
        }
        _ => bail!("{USAGE}"),
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
